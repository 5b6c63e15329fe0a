"""`d2s-search align`: splits, the InfoNCE training loop, the ridge solver, and the align ->
train -> ship path."""

# ruff: noqa: E402  (the skip below must run before torch is imported)
from __future__ import annotations

from tests.offline_model.conftest import skip_without_offline_packages

skip_without_offline_packages()

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner
from d2s_onnx_export.offline_mini.align import (
    AlignConfig,
    EvalSet,
    TrainSet,
    evaluate_dense,
    train_alignment,
)
from d2s_onnx_export.offline_mini.align_data import Captioned, split_photos

from tests.helpers import write_image


def test_split_is_seeded_disjoint_and_complete(tmp_path):
    items = [Captioned(f"{i:03d}.jpg", tmp_path / f"{i:03d}.jpg", ["x"], "t") for i in range(50)]
    a, b = split_photos(items, 10, 5, seed=0), split_photos(items, 10, 5, seed=0)
    assert [i.image_id for i in a["test"]] == [i.image_id for i in b["test"]]
    ids = [i.image_id for s in a.values() for i in s]
    assert len(ids) == len(set(ids)) == 50 and (len(a["test"]), len(a["val"]), len(a["train"])) == (10, 5, 35)


def _synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images whose features are a fixed random map of their captions' meaning, plus noise."""
    rng = np.random.default_rng(seed)
    meaning = rng.normal(size=(n, 16)).astype(np.float32)
    to_img, to_txt = np.random.default_rng(99).normal(size=(2, 16, 1280)).astype(np.float32)
    pooled = meaning @ to_img + 0.1 * rng.normal(size=(n, 1280)).astype(np.float32)
    text = np.repeat(meaning, 2, axis=0) @ to_txt[:, :384] + 0.1 * rng.normal(size=(2 * n, 384)).astype(np.float32)
    return pooled, text / np.linalg.norm(text, axis=1, keepdims=True), np.repeat(np.arange(n), 2)


def test_infonce_alignment_learns_a_shared_space():
    pooled, text, owner = _synthetic(100, 0)
    train = TrainSet(pooled[:, None], np.zeros((100, 1, 1000), np.float32), text, owner, np.ones(100, np.int64))
    vp, vt, vo = _synthetic(40, 1)
    val = EvalSet(vp, np.zeros((40, 1000), np.float32), vt, vo)
    config = AlignConfig(bridge=False, epochs=5, batch_size=50, lr=3e-3, text_lr=3e-3)
    model, summary = train_alignment(train, val, config, None)
    assert summary["best_val"]["R@5"] > 0.6  # chance is 5/40
    assert evaluate_dense(model, val)["R@5"] == summary["best_val"]["R@5"]  # the best epoch is restored
    assert 1 <= summary["best_epoch"] <= 5


def test_ridge_alignment_recovers_a_planted_map_and_folds_the_standardisation():
    import torch
    from d2s_onnx_export.offline_mini.ridge import fit_ridge_alignment, ridge_fit

    rng = np.random.default_rng(3)
    n, views = 120, 2
    meaning = rng.normal(size=(n, 16))  # what a photo shows; its features and captions are maps of it
    to_img, to_txt = rng.normal(size=(16, 1280)), rng.normal(size=(16, 384))
    scale = rng.uniform(0.5, 3, size=1280)  # features on different scales, off centre: standardisation matters
    pooled = ((meaning[:, None, :] @ to_img + 0.1 * rng.normal(size=(n, views, 1280))) * scale + 4).astype(np.float32)
    text = np.repeat(meaning @ to_txt, 3, axis=0) + 0.5 * rng.normal(size=(3 * n, 384))
    text = (text / np.linalg.norm(text, axis=1, keepdims=True)).astype(np.float32)
    owner = np.repeat(np.arange(n), 3)
    train = TrainSet(pooled[:80], np.zeros((80, views, 0), np.float32), text[: 3 * 80], owner[: 3 * 80],
                     np.full(80, views, np.int64))
    val = EvalSet(pooled[80:, 0], np.zeros((40, 0), np.float32), text[3 * 80 :], owner[3 * 80 :] - 80)
    model, summary = fit_ridge_alignment(train, val, AlignConfig(), lams=(1e-1, 1e1, 1e3, 1e5))
    assert summary["solver"] == "ridge" and not model.image.use_bridge
    assert summary["best_val"]["R@1"] > 0.9  # chance is 1/40
    # the chosen lambda is the best val score of the grid
    assert summary["val_score_by_lambda"][f"{summary['lambda']:g}"] == max(summary["val_score_by_lambda"].values())
    # the shipped linear layer equals the solver's answer on standardised features + a bias column
    feats = pooled[:80].reshape(-1, 1280).astype(np.float64)
    mean, std = feats.mean(0), feats.std(0) + 1e-6
    targets = np.repeat(np.stack([text[3 * i : 3 * i + 3].mean(0) for i in range(80)]), views, axis=0)
    w = ridge_fit(np.hstack([(feats - mean) / std, np.ones((feats.shape[0], 1))]), targets, summary["lambda"])
    x = pooled[80:, 0].astype(np.float64)
    want = np.hstack([(x - mean) / std, np.ones((40, 1))]) @ w
    got = model.image(torch.from_numpy(pooled[80:, 0]), torch.zeros(40, 0)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    # the text side is MiniLM's own space
    assert torch.equal(model.text.linear.weight, torch.eye(384)) and not model.text.linear.bias.any()


def test_ridge_alignment_refuses_another_width():
    from d2s_onnx_export.offline_mini.ridge import fit_ridge_alignment

    from d2s_search.errors import ModelError

    pooled, text, owner = _synthetic(10, 0)
    train = TrainSet(pooled[:, None], np.zeros((10, 1, 0), np.float32), text, owner, np.ones(10, np.int64))
    val = EvalSet(pooled, np.zeros((10, 0), np.float32), text, owner)
    with pytest.raises(ModelError, match="--dim must be 384"):
        fit_ridge_alignment(train, val, AlignConfig(dim=128))


def _photo_folder(tmp_path):
    data = tmp_path / "photos"
    data.mkdir()
    with open(data / "captions.txt", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "caption"])
        for i in range(8):
            write_image(data / "images" / f"p{i}.jpg", seed=i)
            for k in range(2):
                w.writerow([f"p{i}.jpg", f"picture number {i} variant {k}"])
    return data


@pytest.mark.parametrize("solver", ["ridge", "infonce"])
def test_align_train_ship_pipeline(tmp_path, solver):
    """Tiny end to end: align on 8 generated 'photos' (ridge, the default, or InfoNCE), a
    one-epoch head, ship into a copy; the shipped projection loads into the offline model."""
    import torch
    from d2s_onnx_export.offline_mini.model import _load_projections, verify_sources
    from d2s_onnx_export.offline_mini.parts import sha256_file
    from d2s_onnx_export.offline_mini.ship import ship_weights
    from d2s_onnx_export.registry import load_config

    from d2s_search.cli.align import align
    from d2s_search.cli.train import train

    data = _photo_folder(tmp_path)
    run = tmp_path / "run"
    extra = ["--solver", "infonce", "--epochs", "2", "--batch-size", "4", "--no-bridge"] if solver == "infonce" else []
    res = CliRunner().invoke(align, ["--data", str(data), "--out", str(run), "--cache", str(tmp_path / "cache"),
                                     "--test-photos", "2", "--val-photos", "2", *extra, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["sources"]["flickr8k"]["train_photos"] == 4
    assert summary["config"]["solver"] == solver and summary["config"]["bridge"] is False
    res = CliRunner().invoke(train, ["--data", str(run / "embeddings"), "--out", str(tmp_path / "head"), "--epochs", "1",
                                     "--batch-size", "8", "--freeze-vocab", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    config = {**load_config("offline-mini"), "weights_dir": str(tmp_path / "weights"), "weights": {}}
    config_path = tmp_path / "offline-test.json"
    config_path.write_text(json.dumps(config))
    shipped = ship_weights("offline-test", run, tmp_path / "head" / "head.pt", config_path)
    recorded = json.loads(config_path.read_text())
    assert set(shipped["weights"]) == {"projections.safetensors", "head.safetensors"}
    for name, entry in recorded["weights"].items():
        assert sha256_file(tmp_path / "weights" / name) == entry["sha256"]
    assert verify_sources("offline-test", recorded)["weights"].keys() == shipped["weights"].keys()
    assert recorded["training"]["alignment"]["config"]["solver"] == solver
    image, text = _load_projections(recorded, 384, torch.zeros(1000, 384))
    assert not image.use_bridge
    if solver == "ridge":  # the text side is MiniLM's own space
        assert torch.equal(text.linear.weight, torch.eye(384))
