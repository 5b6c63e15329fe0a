"""The one-query text session (``d2s-search query``): optimised graph cached on first use,
same numbers as the ordinary session, a damaged cache file replaced."""

from __future__ import annotations

import numpy as np

from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder, optimized_graph_cache


def test_quick_start_session_gives_the_same_vectors_and_heals_its_cache(tiny_blip_bundle):
    bundle = Bundle.load(tiny_blip_bundle)
    texts = ["a dog in a car", "two children on the beach"]
    reference = Encoder(bundle, device="cpu").encode_texts(texts)
    cached = optimized_graph_cache(bundle, "text.onnx")
    graph, weights = cached / "graph.onnx", cached / "weights.data"
    assert not cached.exists()
    legacy = cached.with_name(cached.name + ".onnx")  # what earlier versions cached, one 90 MB file
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_bytes(b"old graph")
    first = Encoder(bundle, device="cpu", quick_start=True).encode_texts(texts)
    assert not legacy.exists()
    # The weights sit beside the graph (ONNX Runtime maps them instead of parsing them).
    assert graph.is_file() and weights.stat().st_size > 4 * graph.stat().st_size
    results = [first]
    for damaged in (weights, graph):  # loading fails, the cache is made again
        size = damaged.stat().st_size
        damaged.write_bytes(b"\0" * 100)
        results.append(Encoder(bundle, device="cpu", quick_start=True).encode_texts(texts))
        assert damaged.stat().st_size == size
    for got in results:
        np.testing.assert_allclose(got.dense, reference.dense, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got.sparse, reference.sparse, rtol=1e-4, atol=1e-5)
        assert got.token_ids == reference.token_ids
    assert not list(cached.parent.glob(".tmp-*"))
    assert sorted(p.name for p in cached.iterdir()) == ["graph.onnx", "weights.data"]


def test_quick_start_falls_back_to_the_bundle_graph_when_the_cache_cannot_be_written(tiny_blip_bundle, tmp_path,
                                                                                      monkeypatch):
    bundle = Bundle.load(tiny_blip_bundle)
    reference = Encoder(bundle, device="cpu").encode_texts(["a red bus"])
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("D2S_CONFIG_DIR", str(blocked))  # the cache dir cannot be created
    got = Encoder(bundle, device="cpu", quick_start=True).encode_texts(["a red bus"])
    np.testing.assert_allclose(got.sparse, reference.sparse, rtol=1e-4, atol=1e-5)
    assert blocked.read_text() == "a file where the cache folder would go"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]  # no stray optimised graph
