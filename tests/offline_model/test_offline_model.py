"""The built-in offline model: builds from shipped files, ONNX == torch, real recall, hashes."""

# ruff: noqa: E402  (the skip below must run before torch is imported)
from __future__ import annotations

from tests.offline_model.conftest import skip_without_offline_packages

skip_without_offline_packages()

import json
import shutil

import numpy as np
import pytest
import torch
from d2s_onnx_export.offline_mini.model import (
    OfflineImageTower,
    OfflineTextTower,
    build_offline,
    weights_dir,
)
from d2s_onnx_export.offline_mini.parts import ImageProjection, TextProjection
from d2s_onnx_export.registry import load_config

from d2s_search import metrics as M
from d2s_search.bundle import Bundle, sha256_file
from d2s_search.encoder import Encoder, tokenize_batch
from d2s_search.errors import BundleError, ModelError
from d2s_search.terms import split_word_flags, whole_word_positions
from tests.offline_model.conftest import MODEL

# Measured on these 40 held-out photos (200 captions), 2026-11-21, shipped weights:
# bundle dense R@1/R@5 0.435/0.795, sparse 0.340/0.705; the same towers with random
# projections (seeds 0-2) R@5 0.100-0.145 (chance: 5/40 = 0.125). Thresholds leave
# ~0.2 of headroom below the measured values.
MIN_TRAINED_R1 = 0.25
MIN_TRAINED_R5 = 0.6
MIN_MARGIN_R5 = 0.35


def test_bundle_builds_offline_from_shipped_files(offline_export):
    result, _ = offline_export
    bundle = Bundle.load(result.bundle.path, verify_hashes=True)
    m = bundle.manifest
    assert m["model"]["kind"] == "offline"
    assert bundle.dense_dim == 384 and bundle.vocab_size == 30522
    assert m["head"]["trained"] is True and m["head"]["hidden_dim"] == 384
    # The shipped weight files' hashes are recorded in the manifest and are the files' own.
    shipped = m["model"]["source"]["weights"]
    config = load_config(MODEL)
    assert set(shipped) == {"projections.safetensors", "head.safetensors"}
    for name, digest in shipped.items():
        assert sha256_file(weights_dir(config) / name) == digest == config["weights"][name]["sha256"]
    assert m["model"]["source"]["backbones"]["image"]["sha256"] == config["backbones"]["image"]["sha256"]
    worst = max(v for g in m["parity"]["max_abs_diff"].values() for v in g.values())
    assert worst < 1e-4


def test_onnx_encoders_match_torch_on_real_photos(offline_export, heldout_photos):
    result, encoder = offline_export
    enc = Encoder(result.bundle, device="cpu")
    photos = heldout_photos[:6]
    from d2s_onnx_export.offline_mini.align_data import open_rgb

    pixels = np.stack([enc.preprocess(open_rgb(p.path)) for p in photos])
    texts = [p.captions[0] for p in photos] + ["dog", "a very " + "long " * 80 + "caption"]
    ids, mask = tokenize_batch(enc.tokenizer, texts, result.bundle.max_text_length, enc.pad_id)
    head = encoder.default_head
    with torch.no_grad():
        t_img = encoder.image_tower(torch.from_numpy(pixels))
        t_txt = encoder.text_tower(torch.from_numpy(ids), torch.from_numpy(mask))
        t_img_sparse = head(t_img, document=True).numpy()
        typed = whole_word_positions(ids, mask, *split_word_flags(enc.tokenizer, head.config.vocab_size))  # as the graph
        t_txt_sparse = head.with_own_words(head(t_txt), torch.from_numpy(ids), torch.from_numpy(typed)).numpy()
        unshifted = head(t_img).numpy()
        unboosted = head(t_txt).numpy()
    o_dense, o_sparse = enc.encode_pixels(pixels)
    text = enc.encode_texts(texts)
    assert np.abs(o_dense - t_img.numpy()).max() < 1e-4
    assert np.abs(text.dense - t_txt.numpy()).max() < 1e-4
    assert np.abs(o_sparse - t_img_sparse).max() < 1e-4
    assert np.abs(text.sparse - t_txt_sparse).max() < 1e-4
    # The shipped document shift is in the image graph only: photos keep more words, the same
    # words first (a uniform shift keeps each photo's ranking of terms).
    assert head.config.document_shift == load_config(MODEL)["document_shift"] > 0
    assert ((o_sparse > 0).sum(axis=1) > (unshifted > 0).sum(axis=1)).all()
    for shifted, plain in zip(o_sparse, unshifted):
        top = np.argsort(-plain, kind="stable")[:10]
        assert list(np.argsort(-shifted, kind="stable")[:10]) == list(top)
    # The shipped query word boost is in the text graph only: a query's own allowed words gain it.
    boost = load_config(MODEL)["query_word_boost"]
    assert head.config.query_word_boost == boost > 0
    dog = enc.tokenizer.token_to_id("dog")
    assert text.sparse[len(photos), dog] == pytest.approx(unboosted[len(photos), dog] + boost, abs=1e-4)


def test_features_are_the_inputs_of_the_projections(offline_export):
    """Image features = the pooled EfficientNet vector (followed by the class-bridge vector when
    the shipped ImageProjection has a bridge: the InfoNCE alignment; the ridge one has none); the
    projection is one linear map of them, written to projections.safetensors."""
    from safetensors.numpy import load_file

    from tests.helpers import pattern_image

    result, encoder = offline_export
    bundle = result.bundle
    enc = Encoder(bundle, device="cpu")
    pixels = np.stack([enc.preprocess(pattern_image(i)) for i in range(3)])
    ids, mask = tokenize_batch(enc.tokenizer, ["a dog on the grass", "snow"], bundle.max_text_length, enc.pad_id)
    tower = encoder.image_tower
    with torch.no_grad():
        pooled, logits = tower.backbone(torch.from_numpy(pixels))
        want_dense = torch.nn.functional.normalize(tower.projection(pooled, logits), dim=-1).numpy()
        minilm = encoder.text_tower.backbone(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    dense, _, feats = enc.encode_pixels_with_features(pixels)
    width = 1280 + (384 if tower.projection.use_bridge else 0)
    assert feats.shape == (3, width) == (3, bundle.outputs["image"]["features"])
    assert np.abs(feats[:, :1280] - pooled.numpy()).max() < 1e-4
    proj = load_file(str(bundle.path / "projections.safetensors"))
    h = feats @ proj["vision_proj.weight"].T + proj["vision_proj.bias"]
    assert np.abs(h / np.linalg.norm(h, axis=1, keepdims=True) - want_dense).max() < 1e-4
    assert np.abs(dense - want_dense).max() < 1e-4
    text = enc.encode_texts(["a dog on the grass", "snow"], features=True)
    assert np.abs(text.features - minilm).max() < 1e-4
    t = minilm @ proj["text_proj.weight"].T + proj["text_proj.bias"]
    assert np.abs(t / np.linalg.norm(t, axis=1, keepdims=True) - text.dense).max() < 1e-4


def _recall(img: np.ndarray, txt: np.ndarray, owner: np.ndarray) -> dict:
    _, _, per_q = M.evaluate_scores(txt @ img.T, [np.array([o]) for o in owner])
    return M.aggregate(per_q)


def test_heldout_recall_clearly_beats_random_weights(offline_export, heldout_photos):
    """Dense text->image recall of the bundle (ONNX, as users run it) vs the same towers with
    random projections, on 40 held-out photos x 5 captions."""
    result, encoder = offline_export
    from d2s_onnx_export.offline_mini.align_data import open_rgb

    enc = Encoder(result.bundle, device="cpu")
    pixels = np.stack([enc.preprocess(open_rgb(p.path)) for p in heldout_photos])
    texts = [c for p in heldout_photos for c in p.captions]
    owner = np.repeat(np.arange(len(heldout_photos)), [len(p.captions) for p in heldout_photos])
    img_dense, img_sparse = enc.encode_pixels(pixels)
    txt = enc.encode_texts(texts)
    trained = _recall(img_dense, txt.dense, owner)
    sparse = _recall(img_sparse, txt.sparse, owner)

    torch.manual_seed(0)
    # the same architecture as the shipped projection (with a bridge only if it has one)
    image_proj = ImageProjection(1280, 384, getattr(encoder.image_tower.projection, "class_emb", None))
    rand_img = OfflineImageTower(encoder.image_tower.backbone, image_proj).eval()
    rand_txt = OfflineTextTower(encoder.text_tower.backbone, TextProjection(384, 384)).eval()
    torch.nn.init.normal_(rand_txt.projection.linear.weight, std=384**-0.5)  # not the identity init
    ids, mask = tokenize_batch(enc.tokenizer, texts, result.bundle.max_text_length, enc.pad_id)
    with torch.no_grad():
        r_img = rand_img(torch.from_numpy(pixels)).numpy()
        r_txt = rand_txt(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    random = _recall(r_img, r_txt, owner)

    assert trained["R@1"] >= MIN_TRAINED_R1 and trained["R@5"] >= MIN_TRAINED_R5, trained
    assert trained["R@5"] >= random["R@5"] + MIN_MARGIN_R5, (trained, random)
    assert sparse["R@5"] >= random["R@5"] + MIN_MARGIN_R5, (sparse, random)


def test_query_terms_are_words_of_the_query(offline_export):
    result, _ = offline_export
    enc = Encoder(result.bundle, device="cpu")
    text = enc.encode_texts(["a black dog runs on the grass"])
    terms = enc.to_terms(text.sparse[0], top_k=10)
    assert "dog" in terms and not any(t.startswith("[") for t in terms)


def test_dogs_in_a_car_keeps_its_words_and_no_term_fires_on_most_photos(offline_export, heldout_photos):
    """The words are the product: the query keeps `dogs`/`dog` and `car`, and no term fires on nearly every photo.

    Measured with the shipped head: without the document shift the most widespread photo term
    is on 34.5% of the 200 held-out photos (`man`); the shipped shift (2, chosen within 12
    FLOPs on the val photos plus the training photos as distractors: sparse R@1 0.166 -> 0.210)
    keeps more, weaker terms per photo, and `girl` is active on 67.5% of these 40 (`man` on 68%
    of the 200; with the earlier shift 1.5, 58%). The target of 30% is not met; this
    guards against a regression to terms on (nearly) every photo, as `amp` once was."""
    from d2s_onnx_export.offline_mini.align_data import open_rgb

    result, _ = offline_export
    enc = Encoder(result.bundle, device="cpu")
    terms = enc.to_terms(enc.encode_texts(["dogs in a car"]).sparse[0])
    assert {"dogs", "dog"} & set(terms) and "car" in terms, sorted(terms, key=lambda t: -terms[t])[:15]
    pixels = np.stack([enc.preprocess(open_rgb(p.path)) for p in heldout_photos])
    _, sparse = enc.encode_pixels(pixels)
    share = M.active_share(sparse)
    assert share.max() <= 0.75, (enc.bundle.terms[int(share.argmax())], share.max())


def _tampered_config(tmp_path, file: str) -> dict:
    config = load_config(MODEL)
    copy = tmp_path / "weights"
    shutil.copytree(weights_dir(config), copy)
    data = bytearray((copy / file).read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    (copy / file).write_bytes(bytes(data))
    return {**config, "weights_dir": str(copy)}


@pytest.mark.parametrize("file", ["projections.safetensors", "head.safetensors"])
def test_tampered_weight_file_is_refused_in_one_line(tmp_path, file):
    config = _tampered_config(tmp_path, file)
    with pytest.raises(ModelError) as err:
        build_offline(MODEL, config)
    message = str(err.value)
    assert "\n" not in message and file in message and "SHA-256" in message


def test_tampered_bundle_file_is_caught_by_the_manifest(offline_export, tmp_path):
    result, _ = offline_export
    copy = tmp_path / "bundle"
    shutil.copytree(result.bundle.path, copy)
    data = bytearray((copy / "text.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "text.onnx").write_bytes(bytes(data))
    with pytest.raises(BundleError, match="hash differs"):
        Bundle.load(copy, verify_hashes=True)


def test_missing_package_weights_hash_mismatch_is_one_line(tmp_path):
    config = json.loads(json.dumps(load_config(MODEL)))
    config["backbones"]["text"]["sha256"] = "0" * 64  # as if another MiniLM were installed
    with pytest.raises(ModelError, match="MiniLM weight file .* does not match"):
        build_offline(MODEL, config)


def test_a_config_with_a_bad_document_shift_is_refused_in_one_line():
    config = {**load_config(MODEL), "document_shift": "nan"}
    with pytest.raises(ModelError) as err:
        build_offline(MODEL, config)
    assert "\n" not in str(err.value) and "document_shift must be a finite number" in str(err.value)


@pytest.mark.parametrize("key, value, message", [
    ("document_terms", -3, "document_terms must be a whole number"),
    ("document_terms", 1.5, "document_terms must be a whole number"),
    ("document_floors", {"x": 0.1}, "document_floors must map term ids"),
    ("document_floors", {"40000": 0.1}, "document_floors must map term ids"),
    ("document_floors", {"1996": -1.0}, "document_floors must map term ids"),
])
def test_a_config_with_bad_document_terms_or_floors_is_refused_in_one_line(key, value, message):
    config = {**load_config(MODEL), key: value}
    with pytest.raises(ModelError) as err:
        build_offline(MODEL, config)
    assert "\n" not in str(err.value) and message in str(err.value)


def test_the_config_s_document_terms_and_floors_reach_the_head():
    config = {**load_config(MODEL), "document_terms": 150, "document_floors": {"2158": 0.5}}
    head = build_offline(MODEL, config).default_head
    assert head.config.document_terms == 150 and head.config.document_floors == {2158: 0.5}
    assert float(head.floor[2158]) == 0.5
