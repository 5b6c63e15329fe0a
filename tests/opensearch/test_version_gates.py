"""Features that arrive with a plugin release are refused in one line before anything is sent
to an older cluster (the plugin stand-in refuses them as the release does, see plugins.py):
``--engine lucene`` (inner product on Lucene HNSW: k-NN 2.13.0.0) and ``neural_sparse`` with
``query_tokens`` (neural-search 2.14.0.0)."""

from __future__ import annotations

import httpx
import pytest
from d2s_os_faultproxy import FaultProxy
from d2s_os_plugins import PluginStandIn
from d2s_os_reference import ranking, synthetic_docs

from d2s_search.backends.opensearch import queries as q
from d2s_search.errors import IndexStoreError, QueryError


@pytest.fixture
def cluster_at(osmem_url):
    made = []

    def make(version: str) -> FaultProxy:
        proxy = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, version))
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def _index_puts(proxy: FaultProxy) -> list:
    return [s for s in proxy.log if s.method == "PUT" and s.path.startswith("/d2s-test")]


@pytest.mark.parametrize("version", ["2.11.1", "2.12.0"])
def test_lucene_engine_is_refused_before_2_13(cluster_at, make_backend, identity, version):
    proxy = cluster_at(version)
    b = make_backend(proxy.url)
    with pytest.raises(IndexStoreError) as info:
        b.create(identity, engine="lucene")
    message = str(info.value)
    assert (
        "2.13" in message
        and "--engine faiss" in message
        and version in message
        and "\n" not in message
    )
    assert _index_puts(proxy) == []
    b.create(identity, engine="faiss")  # the default engine works there
    assert len(_index_puts(proxy)) == 1


def test_the_stand_in_refuses_lucene_inner_product_as_knn_2_12_does(cluster_at):
    proxy = cluster_at("2.12.0")
    reply = httpx.put(f"{proxy.url}/raw", json=q.index_body(engine="lucene"))
    assert reply.status_code == 400
    assert (
        '"hnsw" configuration does not support space type: "innerproduct"'
        in reply.json()["error"]["reason"]
    )


def test_lucene_engine_from_2_13(spec, cluster_at, make_backend, identity):
    proxy = cluster_at("2.13.0")
    b = make_backend(proxy.url)
    b.create(identity, engine="lucene")
    (put,) = _index_puts(proxy)
    assert b'"engine": "lucene"' in put.body or b'"engine":"lucene"' in put.body
    from d2s_os_spec import OpenSearchSpec

    OpenSearchSpec.load(strict=True, version="2.13.0").validate(
        "PUT", "/{index}", q.index_body(identity, engine="lucene")
    )


def test_reindex_to_lucene_is_refused_before_2_13(cluster_at, make_backend, identity):
    proxy = cluster_at("2.12.0")
    b = make_backend(proxy.url)
    b.open(identity)
    b.upsert(synthetic_docs(3, dim=8))
    with pytest.raises(IndexStoreError, match="2.13"):
        b.reindex(engine="lucene")
    assert [s.path for s in _index_puts(proxy)] == ["/d2s-test-000001"]  # no second generation made


@pytest.fixture
def corpus_at(cluster_at, make_backend, identity):
    def make(version: str):
        proxy = cluster_at(version)
        b = make_backend(proxy.url)
        b.open(identity)
        docs = synthetic_docs(40, dim=8)
        b.upsert(docs)
        return proxy, b, docs

    return make


@pytest.mark.parametrize("version", ["2.11.1", "2.13.0"])
def test_query_tokens_are_refused_before_2_14(corpus_at, version):
    proxy, b, docs = corpus_at(version)
    query = dict(list(docs[4].sparse.items())[:6])
    with pytest.raises(QueryError) as info:
        b.sparse_search(query, 5, neural_sparse=True)
    assert (
        "2.14" in str(info.value)
        and "rank_feature" in str(info.value)
        and "\n" not in str(info.value)
    )
    with pytest.raises(QueryError, match="2.14"):
        b.hybrid_search(query, docs[4].dense, 5, neural_sparse=True)
    assert not [s for s in proxy.seen("POST", "/_search") if b"neural_sparse" in s.body]
    assert [h.id for h in b.sparse_search(query, 5)] == [
        i for i, _ in ranking(query, docs)[:5]
    ]  # the default


def test_the_stand_in_refuses_query_tokens_as_neural_search_2_13_does(corpus_at):
    proxy, b, docs = corpus_at("2.13.0")
    body = q.sparse_search_body({"dog": 1.0}, 5, neural_sparse=True)
    reply = httpx.post(f"{proxy.url}/d2s-test/_search", json=body)
    assert reply.status_code == 400
    assert (
        reply.json()["error"]["reason"]
        == "[neural_sparse] unknown token [START_OBJECT] after [query_tokens]"
    )


def test_query_tokens_from_2_14_score_like_rank_feature(corpus_at):
    proxy, b, docs = corpus_at("2.14.0")
    query = dict(list(docs[4].sparse.items())[:6])
    tokens = b.sparse_search(query, 8, neural_sparse=True)
    plain = b.sparse_search(query, 8)
    assert (
        [h.id for h in tokens] == [h.id for h in plain] == [i for i, _ in ranking(query, docs)[:8]]
    )
    assert [s for s in proxy.seen("POST", "/_search") if b"query_tokens" in s.body]
