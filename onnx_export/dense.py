"""What every model builder returns: two towers, the tokenizer and the head's initial W2.

Every tower is ``features -> linear projection -> L2`` (:class:`ProjectedTower`): the
``features`` (the pre-projection vector, e.g. BLIP's CLS state before ``vision_proj``) are a
bundle output and what joint training fine-tunes the projection from; the projection can be
read as, and replaced by, a plain linear layer (``projection_state`` / ``load_projection``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn


class ProjectedTower(nn.Module):
    """``forward = normalize(project(features(*inputs)))``; ``proj_attr`` names the linear layer."""

    proj_attr = ""

    def features(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.proj_attr)(feats)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.project(self.features(*inputs)), dim=-1)

    def projection_state(self) -> dict[str, torch.Tensor]:
        """The projection as a linear layer: ``weight`` (d, f) and, if it has one, ``bias``."""
        layer = getattr(self, self.proj_attr)
        state = {"weight": layer.weight.detach().clone()}
        if layer.bias is not None:
            state["bias"] = layer.bias.detach().clone()
        return state

    def load_projection(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the projection by the linear layer ``state`` (e.g. joint-trained weights)."""
        setattr(self, self.proj_attr, linear_from_state(state))


def linear_from_state(state: dict[str, torch.Tensor]) -> nn.Linear:
    w, b = state["weight"], state.get("bias")
    layer = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    with torch.no_grad():
        layer.weight.copy_(w)
        if b is not None:
            layer.bias.copy_(b)
    return layer.eval()


@dataclass
class DenseDualEncoder:
    name: str
    kind: str  # blip | clip | lavis | offline
    image_tower: ProjectedTower  # pixel_values (B,3,H,W) -> (B,d), L2-normalised
    text_tower: ProjectedTower  # input_ids, attention_mask (B,L) -> (B,d), L2-normalised
    tokenizer: Tokenizer
    vocab_weight: torch.Tensor  # (|V|, w): initial W2 of the sparse head
    dense_dim: int
    image: dict  # size, resize, crop, resample, mean, std
    max_text_length: int
    source: dict = field(default_factory=dict)  # provenance recorded in the manifest
    default_head: nn.Module | None = None  # a trained head the model ships (offline kind)
