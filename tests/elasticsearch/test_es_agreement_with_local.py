"""The Elasticsearch backend agrees with the local backend on real photos: same top-10 and
scores, both the dot product after Lucene's 9-bit rounding (the local index stores weights in
Lucene's FeatureField encoding).

The server is osmem-server (a real HTTP server speaking the same ``_bulk`` / ``rank_features`` /
``rank_feature`` / ``rescore`` API) behind ``esproxy.CompatProxy``, a small local proxy that adds
``X-Elastic-Product: Elasticsearch`` and turns the official client's REST-compatibility media
types into plain JSON (osmem answers 406 to them); see esproxy.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend
from d2s_search.backends.elasticsearch.features import lucene_feature_value
from d2s_search.backends.local import LocalBackend
from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder
from d2s_search.ingest import ingest
from d2s_search.search import SearchOptions, encode_text_query, run_query

QUERIES = ["a dog runs on the grass", "two children playing in the water", "a man on a bike", "people in a city street"]


def rounded_dot(query: dict[str, float], doc: dict[str, float]) -> float:
    return float(sum(np.float32(w) * lucene_feature_value(doc[t]) for t, w in query.items() if t in doc))


def test_same_top10_and_rounded_scores_on_flickr_photos(tmp_path, es_proxy, tiny_blip_bundle, flickr_images):
    bundle = Bundle.load(tiny_blip_bundle)
    encoder = Encoder(bundle, device="cpu")
    files = sorted(flickr_images.glob("*.jpg"))[:300]
    local = LocalBackend(tmp_path / "local")
    local.open(bundle.identity())
    remote = ElasticsearchBackend(es_proxy.url, index_name="d2s-agree")
    try:
        remote.open(bundle.identity())
        for store in (local, remote):
            report = ingest(files, encoder, store, batch_size=50, top_k=96)
            assert report.stored == 300 and not report.rejected
        assert remote.stats()["documents"] == 300

        for text in QUERIES:
            q = encode_text_query(encoder, text, top_k=200)  # within the clause limit, no pruning
            for mode in ("sparse", "two-phase"):
                opts = SearchOptions(mode=mode, k=10, window=50)
                want = run_query(local, q, opts).hits
                got = run_query(remote, q, opts).hits
                assert len(want) == len(got) == 10
                docs = {d.id: d.sparse for d in local.get([h.id for h in got])}
                for hit in got:
                    # The server's score is the dot product over Lucene-rounded document weights.
                    assert hit.score == pytest.approx(rounded_dot(q.full, docs[hit.id]), rel=2e-6)
                # The local index stores the same rounded weights: the same top 10 and scores
                # (only the order of the float additions differs), the same explanations.
                assert [h.id for h in got] == [h.id for h in want], (text, mode)
                assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=2e-6)
                assert [t for t, _ in got[0].matched] == [t for t, _ in want[0].matched]
    finally:
        remote.close()
        local.close()
