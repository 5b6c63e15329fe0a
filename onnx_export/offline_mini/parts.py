"""The small trained parts of the offline model and their files.

Shared by alignment training (``offline_mini.align``) and the model builder
(``offline_mini.model``) so both run exactly the same modules.

* :class:`ImageProjection`: EfficientNet features -> shared space. A linear map of the
  1280-d pooled features plus an optional "class bridge": the ImageNet class
  probabilities (``softmax(logits / T)``) times the MiniLM vectors of the class names
  ("a photo of a golden retriever"). The bridge gives every photo a text-space position
  learned from ImageNet, not from our few captioned photos; its matrix is rebuilt from
  MiniLM at build time, never shipped.
* :class:`TextProjection`: MiniLM sentence vector -> shared space (identity-initialised:
  the MiniLM space is already a good caption space).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from d2s_search.errors import ModelError

CLASS_NAMES_FILE = Path(__file__).parent / "weights" / "imagenet_classes.txt"
CLASS_PROMPT = "a photo of a {}"


class ImageProjection(nn.Module):
    def __init__(self, feature_dim: int, out_dim: int, class_emb: torch.Tensor | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(feature_dim, out_dim)
        self.use_bridge = class_emb is not None
        if class_emb is not None:
            if class_emb.shape[1] != out_dim:
                raise ValueError("class embeddings must have the projection's output width")
            self.register_buffer("class_emb", class_emb.float(), persistent=False)
            self.log_temp = nn.Parameter(torch.zeros(()))  # T = exp(log_temp), starts at 1
            self.bridge_scale = nn.Parameter(torch.ones(()))

    def forward(self, pooled: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        out = self.linear(pooled)
        if self.use_bridge:
            probs = torch.softmax(logits / self.log_temp.exp(), dim=-1)
            out = out + self.bridge_scale * (probs @ self.class_emb)
        return out


class TextProjection(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        if in_dim == out_dim:
            with torch.no_grad():
                self.linear.weight.copy_(torch.eye(in_dim))
                self.linear.bias.zero_()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.linear(z)


def normalize(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


# --- class names ---------------------------------------------------------------------------


def class_prompts(path: Path = CLASS_NAMES_FILE) -> list[str]:
    """One prompt per ImageNet class, in the classifier's order (first WordNet lemma)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) != 1000:
        raise ModelError(f"{path} must list the 1000 ImageNet classes, one per line")
    return [CLASS_PROMPT.format(line.split(",")[0].strip()) for line in lines]


# --- files ----------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: Path, expected: str, what: str) -> None:
    """One-line ModelError when a file is missing or is not the one recorded."""
    if not path.is_file():
        raise ModelError(f"{what} is missing: {path}")
    got = sha256_file(path)
    if got != expected:
        raise ModelError(
            f"{what} {path} does not match its recorded SHA-256 ({got[:12]}… != {expected[:12]}…); "
            "reinstall d2s-search or retrain it with `d2s-search align`"
        )


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    path.chmod(0o644)  # safetensors writes 0600; these files are shipped
    return path


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return {k: v.float() for k, v in load_file(str(path)).items()}
    except Exception as exc:  # a truncated or foreign file
        raise ModelError(f"cannot read {path}: {str(exc).splitlines()[0][:160]}") from None


# --- output vocabulary ----------------------------------------------------------------------

# Function words carry no meaning for search and, with a frozen W2, crowd out content words.
from d2s_search.terms import STOPWORDS  # noqa: E402  (one list for training and search)


def word_terms_mask(tokenizer, vocab_size: int) -> torch.Tensor:
    """True for vocabulary entries that may be output terms under ``output_terms: words``:
    whole lower-case ASCII words of two or more letters that are not stop words (no ``##``
    pieces, digits, punctuation, foreign scripts or special tokens)."""
    import re

    word = re.compile(r"^[a-z]{2,}$")
    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    for token, idx in tokenizer.get_vocab().items():
        if idx < vocab_size and word.match(token) and token not in STOPWORDS:
            allowed[idx] = True
    return allowed
