"""What the runtime does without its optional parts: a large local index without faiss (the
`faiss` extra) searches exactly and says once how to get graphs; an ONNX Runtime whose CPU
files replaced onnxruntime-gpu's says how to put the GPU build back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import brute_force_dense
from tests.reliability.local_index_fixtures import filled_index, synthetic_docs


@pytest.fixture
def without_faiss(monkeypatch):
    """faiss not installed: its import fails, as it does for a package that is absent."""
    from d2s_search.backends.local import backend, graph

    monkeypatch.setitem(sys.modules, "faiss", None)
    monkeypatch.setattr(backend, "APPROXIMATE_DENSE_FROM", 40)  # a "large" index in a test's time
    graph.available.cache_clear()
    yield
    graph.available.cache_clear()


def test_a_large_index_without_faiss_searches_exactly_and_says_once_how_to_get_graphs(
    tmp_path, without_faiss, capsys
):
    docs = synthetic_docs(60, seed=3)
    store = filled_index(tmp_path / "idx", docs)
    try:
        store.prepare_search()
        query = np.random.default_rng(9).normal(size=docs[0].dense.size).astype(np.float32)
        hits = store.dense_search(query, 10)
        store.upsert(synthetic_docs(5, seed=4, start=60))  # rebuilt structures: not said again
        store.prepare_search()
        stats = store.stats()
    finally:
        store.close()
    assert [h.id for h in hits] == [doc_id for doc_id, _ in brute_force_dense(docs, query)[:10]]
    assert stats["dense_search"] == "exact"
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "note: dense search scans every vector (exact, but slower than the HNSW graphs "
        "faiss 1.11 or later builds from 40 pictures on): pip install "
        "'d2s-search[faiss]'"
    ]


def test_the_cpu_build_over_the_gpu_build_is_found_by_what_it_leaves(tmp_path):
    import onnxruntime

    from d2s_search.encoder import cpu_build_over_gpu_build

    assert not cpu_build_over_gpu_build(
        Path(onnxruntime.__file__).parent
    )  # this install: CPU build alone
    (tmp_path / "capi").mkdir()
    assert not cpu_build_over_gpu_build(tmp_path)
    (tmp_path / "capi" / "libonnxruntime_providers_cuda.so").write_bytes(b"\x7fELF")
    assert cpu_build_over_gpu_build(tmp_path)


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_a_session_says_how_to_put_the_gpu_build_back(device, tiny_blip_bundle, monkeypatch):
    from d2s_search import encoder

    said = []
    monkeypatch.setattr(
        encoder, "cpu_build_over_gpu_build", lambda folder: True
    )  # a GPU install here is not
    session = encoder.make_session(
        str(tiny_blip_bundle / "text.onnx"), device=device, warn=said.append
    )
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert said == [
        "onnxruntime-gpu is installed, but onnxruntime's files replaced it (both unpack into one "
        "folder): pip install --force-reinstall --no-deps onnxruntime-gpu; running on CPU"
    ]
    monkeypatch.setattr(encoder, "cpu_build_over_gpu_build", lambda folder: False)
    said.clear()
    encoder.make_session(str(tiny_blip_bundle / "text.onnx"), device=device, warn=said.append)
    assert said == (
        []
        if device == "auto"
        else ["onnxruntime has no CUDA provider here (install the `gpu` extra); running on CPU"]
    )
