"""Session fixtures: tiny models are built and exported once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import FLICKR8K, write_image


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's config, state or D2S_* environment."""
    for key in list(os.environ):
        if key.startswith("D2S_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("D2S_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))


@pytest.fixture(scope="session")
def tiny_blip_bundle(tmp_path_factory) -> Path:
    from d2s_onnx_export.export import export_bundle

    return export_bundle("tiny-blip", tmp_path_factory.mktemp("bundles") / "tiny-blip").bundle.path


@pytest.fixture(scope="session")
def tiny_clip_bundle(tmp_path_factory) -> Path:
    from d2s_onnx_export.export import export_bundle

    return export_bundle("tiny-clip", tmp_path_factory.mktemp("bundles") / "tiny-clip").bundle.path


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """40 distinct generated photos (JPEG and PNG) in nested folders."""
    root = tmp_path_factory.mktemp("images")
    for i in range(40):
        sub = root / ("a" if i % 2 else "b") / ("deep" if i % 5 == 0 else "")
        write_image(sub / f"img{i:03d}.{'jpg' if i % 3 else 'png'}", seed=i)
    return root


@pytest.fixture(scope="session")
def flickr_images() -> Path:
    if not (FLICKR8K / "images").is_dir():
        pytest.skip(f"shared test data not found at {FLICKR8K} (it lives in ../shared beside the clone)")
    return FLICKR8K / "images"
