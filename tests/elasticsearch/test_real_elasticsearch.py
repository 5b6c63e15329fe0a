"""Everything against a real Elasticsearch cluster (8.x or 9.x) and Kibana: ``pytest -m elasticsearch``.

Set D2S_ELASTICSEARCH_URL (and D2S_ELASTICSEARCH_USER / _PASSWORD / _API_KEY / _CA_FILE /
_CLOUD_ID as needed) and, for the saved objects, D2S_KIBANA_URL; ``docker compose --profile
elastic up -d elasticsearch kibana`` gives both (see docs/elasticsearch.md). Each test works in
its own throw-away index. Skipped, with that reason, when no URL is set.

Covers every plan on every mapping the server supports: sparse (rank_feature / sparse_vector
query), two-phase (rescore), dense (knn on hnsw / int8_hnsw, dot_product / max_inner_product),
hybrid (the rrf retriever where licensed, client-side fusion otherwise), reindex (server-side and
re-encoded through a point in time) and the Kibana import.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from d2s_os_reference import random_query, ranking, synthetic_docs, ulps, vocabulary

from d2s_search.backends.base import IndexIdentity
from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend
from d2s_search.backends.elasticsearch.queries import (
    SINCE,
    VectorMapping,
    takes_sparse_index_options,
)
from d2s_search.search import SearchOptions

# Read at import: tests/conftest.py clears D2S_* variables around every test.
ENV = {k: v for k, v in os.environ.items() if k.startswith(("D2S_ELASTICSEARCH_", "D2S_KIBANA_"))}

pytestmark = [
    pytest.mark.elasticsearch,
    pytest.mark.skipif(
        not (ENV.get("D2S_ELASTICSEARCH_URL") or ENV.get("D2S_ELASTICSEARCH_CLOUD_ID")),
        reason="D2S_ELASTICSEARCH_URL is not set: no real Elasticsearch cluster to test against",
    ),
]

DIM = 16
N = 200
MAPPINGS = {
    "rank_features-hnsw-dot": VectorMapping(),
    "sparse_vector-int8-mip": VectorMapping(sparse_type="sparse_vector", similarity="max_inner_product",
                                            index_type="int8_hnsw"),
}


def _backend(mapping: VectorMapping | None = None) -> ElasticsearchBackend:
    return ElasticsearchBackend.from_env(env=ENV, index_name=f"d2s-pytest-{uuid.uuid4().hex[:8]}", mapping=mapping)


@pytest.fixture(params=list(MAPPINGS))
def real(request):
    mapping = MAPPINGS[request.param]
    b = _backend(mapping)
    needs = mapping.needs() + (["sparse_vector_query"] if mapping.sparse_type == "sparse_vector" else [])
    missing = [f for f in needs if not b.supports(f)]
    if missing:
        version = ".".join(map(str, b.server_version()))
        b.close()
        need = ".".join(map(str, max(SINCE[f] for f in missing)))
        pytest.skip(f"Elasticsearch {version} lacks {', '.join(missing)} (needs {need}+)")
    b.open(IndexIdentity(fingerprint=uuid.uuid4().hex, dense_dim=DIM, model="synthetic"))
    docs = synthetic_docs(N, dim=DIM, seed=5)
    b.upsert(docs)
    try:
        yield b, docs
    finally:
        b.drop()
        b.close()


def test_sparse_matches_lucene_reference(real):
    b, docs = real
    rng = np.random.default_rng(1)
    for _ in range(10):
        query = random_query(vocabulary(), rng)
        hits = b.sparse_search(query, 10)
        expected = ranking(query, docs)[:10]
        assert [h.id for h in hits] == [i for i, _ in expected]
        assert all(ulps(h.score, s) <= 1 for h, (_, s) in zip(hits, expected, strict=True))


def test_two_phase_matches_reference(real):
    b, docs = real
    rng = np.random.default_rng(2)
    full = random_query(vocabulary(), rng, n_terms=14)
    first = dict(list(full.items())[:3])
    hits = b.two_phase_search(first, full, 10, window=50)
    window = {i for i, _ in ranking(first, docs)[:50]}
    expected = ranking(full, docs, only=lambda d: d.id in window)[:10]
    assert [h.id for h in hits] == [i for i, _ in expected]


def test_dense_knn_returns_inner_products(real):
    b, docs = real
    rng = np.random.default_rng(3)
    vectors = np.stack([d.dense for d in docs])
    for _ in range(5):
        q = rng.normal(size=DIM).astype(np.float32)
        q /= np.linalg.norm(q)
        hits = b.dense_search(q, 10)
        exact = vectors @ q
        best = {docs[i].id for i in np.argsort(-exact)[:10]}
        assert len({h.id for h in hits} & best) >= 8  # HNSW is approximate
        tol = 2e-2 if b.mapping.index_type == "int8_hnsw" else 1e-5
        by_id = {d.id: float(d.dense @ q) for d in docs}
        for h in hits:
            assert h.score == pytest.approx(by_id[h.id], abs=tol)


@pytest.mark.parametrize("fusion", ["rrf", "minmax"])
def test_hybrid_says_who_fused(real, fusion):
    b, docs = real
    rng = np.random.default_rng(4)
    query = random_query(vocabulary(), rng)
    q = docs[0].dense
    hits = b.hybrid_search(query, q, SearchOptions(mode="hybrid", k=10, fusion=fusion, window=50))
    assert len(hits) == 10
    if fusion == "rrf" and b.rrf_available():
        assert b.last_fusion == "elasticsearch-rrf-retriever"
    else:
        assert b.last_fusion == f"client-{fusion}"
    assert docs[0].id in {h.id for h in hits}  # best in the dense run


def test_reindex_server_side_and_reencoded(real):
    b, docs = real
    out = b.reindex(mapping=VectorMapping(similarity=b.mapping.similarity, sparse_type=b.mapping.sparse_type))
    assert out["documents"] == N and out["to"].endswith("-000002")
    new_identity = IndexIdentity(fingerprint=uuid.uuid4().hex, dense_dim=DIM, model="other")
    out = b.reindex(new_identity, reencode=lambda d: d, page=37)  # PIT scan in uneven pages
    assert out["documents"] == N and out["to"].endswith("-000003")
    assert b.stats()["bundle_fingerprint"] == new_identity.fingerprint
    assert b.ids_present([d.id for d in docs]) == {d.id for d in docs}


def test_stored_vectors_come_back(real):
    """9.x would drop vectors from _source unless the index says otherwise (see index_body)."""
    b, docs = real
    (stored,) = b.get([docs[7].id])
    assert stored.sparse == pytest.approx({t: float(np.float32(w)) for t, w in docs[7].sparse.items()})
    assert np.allclose(stored.dense, docs[7].dense)
    assert b.sparse_search(docs[7].sparse, 1)[0].matched


def test_delete(real):
    b, docs = real
    assert b.delete([docs[0].id, "nope"]) == 1
    assert b.stats()["documents"] == N - 1


@pytest.mark.skipif(not ENV.get("D2S_KIBANA_URL"), reason="D2S_KIBANA_URL is not set: no Kibana to import into")
def test_kibana_install_and_read_back():
    from d2s_search.backends.elasticsearch import kibana_objects as ko
    from d2s_search.backends.elasticsearch.kibana import KibanaClient, install, load_objects

    with KibanaClient.from_env(env=ENV) as client:
        result = install(client, load_objects(index_name="d2s"))
        assert {o["id"] for o in result.imported} == {o["id"] for o in ko.saved_objects()}
        resp = client._send("GET", f"/api/saved_objects/index-pattern/{ko.DATA_VIEW_ID}")
        assert resp.status_code == 200
        assert '"type":"img"' in resp.json()["attributes"]["fieldFormatMap"].replace(" ", "")
        resp = client._send("GET", f"/api/saved_objects/dashboard/{ko.DASHBOARD_ID}")
        assert resp.status_code == 200


def test_sparse_vector_counts_frequent_words(real):
    """8.19+/9.1+ prune sparse_vector query tokens by default: the queries say prune: false, so a
    frequent word weighed lightly still counts (the hits are the dot-product ranking)."""
    from dataclasses import replace

    b, docs = real
    if b.mapping.sparse_type != "sparse_vector":
        pytest.skip("a rank_features index")
    rng = np.random.default_rng(2)
    common = [replace(d, id=f"c{d.id[1:]}", sparse={**d.sparse, "photo": float(rng.uniform(0.5, 2.0))}) for d in docs]
    b.upsert(common)
    everything = docs + common
    for query in ({**random_query(vocabulary(), rng), "photo": 0.5, "w100": 2.6} for _ in range(5)):
        expected = ranking(query, everything)[:10]
        hits = b.sparse_search(query, 10)
        assert [h.id for h in hits] == [i for i, _ in expected]
        assert all(ulps(h.score, s) <= 1 for h, (_, s) in zip(hits, expected, strict=True))
    field = next(iter(b._mapping().values()))["mappings"]["properties"]["sparse"]
    if b.serverless or takes_sparse_index_options(b.server_version()):
        assert field.get("index_options") == {"prune": False}


def test_writes_are_refreshed_once_before_the_next_read(real):
    from dataclasses import replace

    b, docs = real
    extra = [replace(d, id=f"e{d.id[1:]}") for d in synthetic_docs(30, dim=DIM, seed=9, prefix="extra")]
    for start in range(0, 30, 10):
        b.upsert(extra[start : start + 10])
    assert b._dirty  # nothing refreshed per batch
    assert b.stats()["documents"] == N + 30 and not b._dirty


def test_doctor_on_the_real_cluster(real):
    from d2s_search.backends.elasticsearch.doctor import diagnose

    b, _ = real
    report = diagnose(b, b.identity)
    by = {c.name: c for c in report.checks}
    assert not report.failed, [c.to_json() for c in report.checks if c.status == "fail"]
    plans = by["plans"].data["plans"]
    assert plans["sparse"] and plans["dense"]
    assert by["index"].status == "ok" and by["index"].data["documents"] == N

