"""Hybrid results say who fused the runs (the issue asks the JSON result to tell)."""

from __future__ import annotations

from d2s_os_reference import synthetic_docs

from d2s_search.backends.local import LocalBackend
from d2s_search.search import QueryVectors, SearchOptions, run_query


def test_local_hybrid_is_client_fusion(tmp_path, identity):
    store = LocalBackend(tmp_path / "idx")
    store.open(identity)
    docs = synthetic_docs(40, dim=8, seed=3)
    store.upsert(docs)
    q = QueryVectors(full=dict(list(docs[0].sparse.items())[:6]), own={}, dense=docs[0].dense)
    for fusion in ("minmax", "rrf"):
        result = run_query(store, q, SearchOptions(mode="hybrid", k=5, fusion=fusion))
        assert result.fusion == f"client-{fusion}"
        assert result.to_json()["fusion"] == f"client-{fusion}"
        assert result.hits[0].id == docs[0].id
    sparse = run_query(store, q, SearchOptions(mode="sparse", k=5))
    assert sparse.fusion is None and "fusion" not in sparse.to_json()
    store.close()


def test_rrf_retriever_needs_version_and_license(make_backend, es_proxy, identity):
    """osmem is no Elasticsearch 8.14+: the backend must fall back to client-side fusion."""
    b = make_backend(es_proxy.url)
    b.open(identity)
    assert b.server_version() == (8, 0)
    assert not b.rrf_available()
    assert not es_proxy.seen("GET", "/_license")  # the version alone rules it out
    b._version, b._license = (8, 16), None
    assert not b.rrf_available()  # osmem has no /_license: no license, no RRF
    assert es_proxy.seen("GET", "/_license")
    b._version, b._license = (8, 16), "trial"
    assert b.rrf_available()
    b._license = "basic"
    assert not b.rrf_available()
