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
    assert not cached.exists()
    first = Encoder(bundle, device="cpu", quick_start=True).encode_texts(texts)
    assert cached.is_file() and cached.stat().st_size > 0
    cached.write_bytes(b"\0" * 100)  # damaged: loading it fails, it is made again
    again = Encoder(bundle, device="cpu", quick_start=True).encode_texts(texts)
    assert cached.stat().st_size > 100
    for got in (first, again):
        np.testing.assert_allclose(got.dense, reference.dense, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got.sparse, reference.sparse, rtol=1e-4, atol=1e-5)
        assert got.token_ids == reference.token_ids
    assert not list(cached.parent.glob(".tmp-*"))
