"""The ml-commons model zip: layout, config, and the ONNX inside giving the bundle's term weights
when run the way ml-commons runs it (tokenize one text, run, decode each non-zero index)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from d2s_dash_fake_cluster import TRANSLATOR_INPUTS, _ModelRunner
from tokenizers import Tokenizer

from d2s_search.backends.opensearch.features import NEURAL_SPARSE_MAX_WEIGHT
from d2s_search.backends.opensearch.ml_package import (
    DEFAULT_MAX_TERMS,
    INFO_NAME,
    ONNX_NAME,
    OUTPUT,
    SERVER_INPUTS,
    model_name,
    package_model,
    queryable_mask,
    sparse_encoder_graph,
    tokenizer_for_server,
)

TEXTS = ["a dog sitting in the back seat of a car", "two children play on the beach", "snow",
         "Ünïcödé café, 3.5 % off!", "a " * 80 + "very long caption"]


def dropped(pkg) -> set[str]:
    return {t for terms in pkg.dropped_terms.values() for t in terms}


def test_zip_layout_is_what_ml_commons_loads(model_package):
    with zipfile.ZipFile(model_package.path) as zf:
        names = zf.namelist()
        assert sorted(names) == sorted([ONNX_NAME, "tokenizer.json", INFO_NAME])
        assert all("/" not in n for n in names)  # ml-commons looks at the top level only
        assert [n for n in names if n.endswith((".onnx", ".pt"))] == [ONNX_NAME]  # exactly one model
        info = json.loads(zf.read(INFO_NAME))
        tokenizer = json.loads(zf.read("tokenizer.json"))
    assert info["bundle_fingerprint"] == model_package.bundle_fingerprint
    assert info["max_terms"] == DEFAULT_MAX_TERMS
    assert tokenizer["truncation"]["max_length"] == model_package.max_length
    assert tokenizer["padding"] is None
    assert model_package.name.startswith("d2s-tiny-blip-") and len(model_package.sha256) == 64


def test_zip_is_reproducible(tiny_bundle, model_package, tmp_path):
    again = package_model(tiny_bundle, tmp_path / "again.zip")
    assert again.sha256 == model_package.sha256 and again.size == model_package.size
    assert model_name(tiny_bundle) == model_package.name


def test_model_config_is_what_ml_commons_needs(model_package):
    config = model_package.model_config()
    # TextEmbeddingModelConfig refuses a config without these two.
    assert config["embedding_dimension"] == model_package.vocab_size
    assert config["framework_type"].upper() in ("HUGGINGFACE_TRANSFORMERS", "SENTENCE_TRANSFORMERS")
    assert json.loads(config["all_config"])["d2s_bundle_fingerprint"] == model_package.bundle_fingerprint


def test_graph_has_the_two_inputs_and_one_output(model_package):
    with zipfile.ZipFile(model_package.path) as zf:
        model = onnx.load_from_string(zf.read(ONNX_NAME))
    onnx.checker.check_model(model)
    # the names ml-commons' SentenceTransformerTranslator gives the tensors; DJL feeds by name
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == [
        ("input1.input_ids", onnx.TensorProto.INT64), ("input1.attention_mask", onnx.TensorProto.INT64)]
    assert tuple(SERVER_INPUTS.values()) == TRANSLATOR_INPUTS
    (out,) = model.graph.output  # ml-commons turns *every* output into tokens
    assert out.name == OUTPUT and out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    dims = [d.dim_value or d.dim_param for d in out.type.tensor_type.shape.dim]
    assert dims == ["batch", model_package.vocab_size]
    # ONNX Runtime in ml-commons (DJL) reads IR <= 9 and opset <= 17 models
    assert model.ir_version <= 9 and max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) <= 17


def test_package_onnx_runs_fed_by_the_translator_names(model_package, encoder):
    """The zip's ONNX in ONNX Runtime, fed as DJL feeds it: named input1.*, int64, (1, seq)."""
    with zipfile.ZipFile(model_package.path) as zf:
        session = ort.InferenceSession(zf.read(ONNX_NAME), providers=["CPUExecutionProvider"])
        tok = Tokenizer.from_str(zf.read("tokenizer.json").decode())
    assert [i.name for i in session.get_inputs()] == list(TRANSLATOR_INPUTS)
    skip = dropped(model_package)
    for text in TEXTS[:3]:
        enc = tok.encode(text)
        ids = np.asarray([enc.ids], dtype=np.int64)
        feeds = {"input1.input_ids": ids, "input1.attention_mask": np.asarray([enc.attention_mask], dtype=np.int64)}
        assert ids.shape == (1, len(enc.ids))
        (row,) = session.run(None, feeds)[0]
        full = {t: w for t, w in encoder.to_terms(encoder.encode_texts([text]).sparse[0]).items() if t not in skip}
        top = sorted(full.items(), key=lambda tw: -tw[1])[:DEFAULT_MAX_TERMS]
        position = {t: i for i, t in enumerate(encoder.bundle.terms)}
        assert len(np.flatnonzero(row)) == len(top)
        assert max(abs(float(row[position[t]]) - w) for t, w in top) <= 1e-6


def test_runner_refuses_graph_inputs_djl_cannot_feed(tiny_bundle):
    """A graph whose inputs keep the plain names fails like OrtSymbolBlock fails on a node."""
    import io

    with open(tiny_bundle.path / "text.onnx", "rb") as fh:
        text_onnx = fh.read()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("model.onnx", text_onnx)
        zf.writestr("tokenizer.json", tokenizer_for_server(tiny_bundle))
    runner = _ModelRunner(buffer.getvalue())
    with pytest.raises(ValueError, match="Invalid input tensor name: input1.input_ids"):
        runner.encode("a dog")


def test_server_side_weights_equal_the_bundle_encoder(model_package, encoder):
    runner = _ModelRunner(model_package.path.read_bytes())
    skip = dropped(model_package)
    for text in TEXTS:
        (server,) = runner.encode(text)
        full = {t: w for t, w in encoder.to_terms(encoder.encode_texts([text]).sparse[0]).items() if t not in skip}
        client = dict(sorted(full.items(), key=lambda tw: -tw[1])[:DEFAULT_MAX_TERMS])
        assert 0 < len(server) <= DEFAULT_MAX_TERMS
        assert server.keys() == client.keys(), text
        assert max(abs(server[t] - client[t]) for t in server) <= 1e-6
        assert max(server.values()) <= NEURAL_SPARSE_MAX_WEIGHT


def test_without_a_term_limit_every_queryable_term_is_kept(tiny_bundle, encoder, tmp_path):
    tok_json = tokenizer_for_server(tiny_bundle)
    keep, reasons = queryable_mask(tiny_bundle, tok_json)
    graph = sparse_encoder_graph(tiny_bundle.path / "text.onnx", keep, tiny_bundle.max_text_length, max_terms=None)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_str(tok_json)
    for text in TEXTS[:3]:
        enc = tok.encode(text)
        row = session.run(None, {"input1.input_ids": np.array([enc.ids]),
                                 "input1.attention_mask": np.array([enc.attention_mask])})[0][0]
        want = encoder.encode_texts([text]).sparse[0] * keep
        np.testing.assert_allclose(row, want, atol=1e-6)
    # terms a rank_features key stores escaped can never match a server-side token
    assert {".", "%"} <= set(reasons["needs escaping"])
    assert not keep[tiny_bundle.allowed_mask == 0].any()


def test_over_long_input_is_cut_in_the_graph(model_package, tiny_bundle):
    # If the cluster ignored the tokenizer's truncation, the graph still cuts to max_length.
    with zipfile.ZipFile(model_package.path) as zf:
        session = ort.InferenceSession(zf.read(ONNX_NAME), providers=["CPUExecutionProvider"])
        tok = Tokenizer.from_str(zf.read("tokenizer.json").decode())
    tok.no_truncation()
    long_ids = tok.encode("sentence " * 200).ids
    assert len(long_ids) > tiny_bundle.max_text_length
    feeds = {"input1.input_ids": np.array([long_ids]),
             "input1.attention_mask": np.ones((1, len(long_ids)), dtype=np.int64)}
    cut = {k: v[:, : tiny_bundle.max_text_length] for k, v in feeds.items()}
    np.testing.assert_array_equal(session.run(None, feeds)[0], session.run(None, cut)[0])


def test_packaging_does_not_import_torch(tiny_blip_bundle, tmp_path):
    code = (
        "import sys; from pathlib import Path\n"
        "from d2s_search.bundle import Bundle\n"
        "from d2s_search.backends.opensearch.ml_package import package_model\n"
        f"package_model(Bundle.load({str(tiny_blip_bundle)!r}), Path({str(tmp_path / 'm.zip')!r}))\n"
        "import d2s_search.backends.opensearch.ml_commons, d2s_search.backends.opensearch.server_side, d2s_search.backends.opensearch.dashboards, d2s_search.serve.image_server\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
