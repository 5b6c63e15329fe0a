"""What every model builder returns: two towers, the tokenizer and the head's initial W2."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tokenizers import Tokenizer
from torch import nn


@dataclass
class DenseDualEncoder:
    name: str
    kind: str  # blip | clip | lavis | offline
    image_tower: nn.Module  # pixel_values (B,3,H,W) -> (B,d), L2-normalised
    text_tower: nn.Module  # input_ids, attention_mask (B,L) -> (B,d), L2-normalised
    tokenizer: Tokenizer
    vocab_weight: torch.Tensor  # (|V|, w): initial W2 of the sparse head
    dense_dim: int
    image: dict  # size, resize, crop, resample, mean, std
    max_text_length: int
    source: dict = field(default_factory=dict)  # provenance recorded in the manifest
    default_head: nn.Module | None = None  # a trained head the model ships (offline kind)
