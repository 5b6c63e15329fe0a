"""Joint training end to end with the project's own tools and tiny models:
``embed --features`` -> ``train --objective joint`` -> ``export-onnx --projections`` ->
``ingest`` -> ``query``; the old index is refused after the dense vectors changed."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder
from d2s_search.train.data import load_authors_layout
from tests.helpers import pattern_image, run_cli, run_cli_json, write_image

WORDS = ["dog", "cat", "car", "tree", "beach", "ball", "horse", "bike", "boat", "snow", "city", "child"]


def _dataset(root, n_images=16):
    rows = ["image,caption"]
    for i in range(n_images):
        write_image(root / "imgs" / f"im{i:02d}.png", seed=i)
        for j in range(2):
            rows.append(f"imgs/im{i:02d}.png,a {WORDS[(i + j) % 12]} next to a {WORDS[(3 * i + j) % 12]}")
    (root / "caps.csv").write_text("\n".join(rows))
    return root / "caps.csv"


def test_joint_bundle_round_trip(tmp_path, tiny_blip_bundle, capsys):
    csv = _dataset(tmp_path)
    emb = tmp_path / "emb"
    code, out = run_cli_json(["embed", csv, "--bundle", tiny_blip_bundle, "--features", "--out", emb,
                              "--val-fraction", "0.25", "--test-fraction", "0"], capsys)
    assert code == 0 and out["img"]["count"] == 16 and out["text"]["features_dim"] == 32
    assert (emb / "projections.safetensors").is_file() and (emb / "img_feats.parquet").is_file()
    feats = load_authors_layout(emb, kind="feats")["train"]
    dense = load_authors_layout(emb)["train"]
    old = Bundle.load(tiny_blip_bundle)
    enc = Encoder(old, device="cpu")
    pixels = np.stack([enc.preprocess(pattern_image(int(i))) for i in dense.image_ids[:3]])
    want_dense, _, want_feats = enc.encode_pixels_with_features(pixels)
    assert np.abs(feats.image_emb[:3] - want_feats).max() < 1e-5 and np.abs(dense.image_emb[:3] - want_dense).max() < 1e-5

    # train from embed's output only (a narrow W2 from a file keeps it fast)
    w2 = tmp_path / "w2.npy"
    np.save(w2, np.random.default_rng(0).standard_normal((30522, 16)).astype(np.float32) * 0.1)
    run = tmp_path / "run"
    code, summary = run_cli_json(["train", "--data", emb, "--objective", "joint", "--epochs", "3", "--batch-size", "8",
                                  "--joint-lr", "1e-2", "--vocab-init", w2, "--tokenizer", tiny_blip_bundle,
                                  "--out", run, "--select-during-warmup"], capsys)
    assert code == 0 and summary["best_epoch"] >= 1
    assert summary["steps"] == 3 * 4  # 12 train images x 2 captions: 2 rounds of 12, each cut 8 + 4
    assert summary["document_shift"]["distractors"] == 12  # the fine-tuned training images beside validation

    code, exported = run_cli_json(["export-onnx", "--model", "tiny-blip", "--head", run / "head.pt",
                                   "--projections", run / "projections.safetensors", "--out", tmp_path / "jb"], capsys)
    assert code == 0
    joint = Bundle.load(tmp_path / "jb", verify_hashes=True)
    assert joint.fingerprint != old.fingerprint and joint.manifest["projections"]["source"] == "joint training"
    assert joint.manifest["head"]["notes"]["objective"] == "joint"
    # the new dense vectors are the fine-tuned projection of the unchanged features
    from safetensors.numpy import load_file

    ft = load_file(str(run / "projections.safetensors"))
    jenc = Encoder(joint, device="cpu")
    j_dense, _, j_feats = jenc.encode_pixels_with_features(pixels)
    assert np.abs(j_feats - want_feats).max() < 1e-5
    h = j_feats @ ft["vision_proj.weight"].T + ft["vision_proj.bias"]
    assert np.abs(h / np.linalg.norm(h, axis=1, keepdims=True) - j_dense).max() < 1e-4
    assert np.abs(j_dense - want_dense).max() > 1e-3  # training moved them

    # an index filled with the old bundle refuses the joint one and says to re-ingest
    imgs = tmp_path / "imgs"
    code, _ = run_cli_json(["ingest", imgs, "--bundle", tiny_blip_bundle, "--index", tmp_path / "old-idx"], capsys)
    assert code == 0
    code, _, err = run_cli(["query", "a dog", "--bundle", tmp_path / "jb", "--index", tmp_path / "old-idx"], capsys)
    assert code == 1 and "re-ingest" in err and len(err.strip().splitlines()) == 1
    code, report = run_cli_json(["ingest", imgs, "--bundle", tmp_path / "jb", "--index", tmp_path / "idx"], capsys)
    assert code == 0 and report["stored"] == 16
    code, res = run_cli_json(["query", "a dog next to a tree", "--bundle", tmp_path / "jb", "--index", tmp_path / "idx",
                              "--mode", "dense", "-k", "3"], capsys)
    assert code == 0
    # brute force over the joint bundle's own vectors
    all_px = np.stack([jenc.preprocess(pattern_image(i)) for i in range(16)])
    docs = jenc.encode_pixels(all_px)[0]
    q = jenc.encode_texts(["a dog next to a tree"]).dense[0]
    best = int(np.argmax(docs @ q))
    assert res["results"][0]["path"].endswith(f"im{best:02d}.png")
    assert res["results"][0]["score"] == pytest.approx(float(docs[best] @ q), abs=1e-4)


def test_joint_inputs_missing_give_one_line_errors(tmp_path, tiny_blip_bundle, capsys):
    csv = _dataset(tmp_path, n_images=2)
    code, _, err = run_cli(["embed", csv, "--features", "--no-images", "--text-encoder", "minilm", "--out", tmp_path / "e"], capsys)
    assert code == 2 and "--features needs --bundle" in err
    # embeddings without features: train --objective joint says what is missing and how to get it
    code, _ = run_cli_json(["embed", csv, "--bundle", tiny_blip_bundle, "--out", tmp_path / "plain"], capsys)
    assert code == 0
    code, _, err = run_cli(["train", "--data", tmp_path / "plain", "--objective", "joint", "--out", tmp_path / "r"], capsys)
    assert code == 1 and "img_feats" in err and "--features" in err and len(err.strip().splitlines()) == 1
