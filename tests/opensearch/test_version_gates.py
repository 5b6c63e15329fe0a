"""Features that arrive with a plugin release are refused in one line before anything is sent
to an older cluster (the plugin stand-in refuses them as the release does, see plugins.py):
``--engine lucene`` (inner product on Lucene HNSW: k-NN 2.13.0.0) and ``neural_sparse`` with
``query_tokens`` (neural-search 2.14.0.0)."""

from __future__ import annotations

import json

import httpx
import pytest
from d2s_os_faultproxy import FaultProxy
from d2s_os_plugins import PluginStandIn
from d2s_os_reference import ranking, synthetic_docs
from d2s_os_spec import OpenSearchSpec

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
def test_lucene_engine_follows_the_knn_release(cluster_at, make_backend, identity, version):
    proxy = cluster_at(version)
    # what k-NN 2.11/2.12 answer to the mapping (the stand-in, as plugins.py cites)
    refused = httpx.put(f"{proxy.url}/raw", json=q.index_body(engine="lucene"))
    assert refused.status_code == 400
    assert (
        '"hnsw" configuration does not support space type: "innerproduct"'
        in refused.json()["error"]["reason"]
    )
    b = make_backend(proxy.url)
    with pytest.raises(IndexStoreError) as info:
        b.create(identity, engine="lucene")
    message = str(info.value)
    assert "2.13" in message and "--engine faiss" in message and version in message
    assert "\n" not in message
    assert _index_puts(proxy) == []  # refused before anything is sent
    b.create(identity, engine="faiss")  # the default engine works there
    assert len(_index_puts(proxy)) == 1
    # from 2.13 the same request is made and accepted
    newer = cluster_at("2.13.0")
    make_backend(newer.url).create(identity, engine="lucene")
    (put,) = _index_puts(newer)
    assert json.loads(put.body)["mappings"]["properties"]["dense"]["method"]["engine"] == "lucene"
    spec = OpenSearchSpec.load(strict=True, version="2.13.0")
    spec.validate("PUT", "/{index}", json.loads(put.body))


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
def test_query_tokens_follow_the_neural_search_release(corpus_at, version):
    proxy, b, docs = corpus_at(version)
    # what neural-search 2.11-2.13 answer to query_tokens (the stand-in, as plugins.py cites)
    raw = httpx.post(
        f"{proxy.url}/d2s-test/_search",
        json=q.sparse_search_body({"dog": 1.0}, 5, neural_sparse=True),
    )
    assert raw.status_code == 400
    assert (
        raw.json()["error"]["reason"]
        == "[neural_sparse] unknown token [START_OBJECT] after [query_tokens]"
    )
    sent = len(proxy.log)
    query = dict(list(docs[4].sparse.items())[:6])
    with pytest.raises(QueryError) as info:
        b.sparse_search(query, 5, neural_sparse=True)
    message = str(info.value)
    assert "2.14" in message and "rank_feature" in message and "\n" not in message
    with pytest.raises(QueryError, match="2.14"):
        b.hybrid_search(query, docs[4].dense, 5, neural_sparse=True)
    assert not [s for s in proxy.log[sent:] if b"neural_sparse" in s.body]
    expected = [i for i, _ in ranking(query, docs)[:5]]
    assert [h.id for h in b.sparse_search(query, 5)] == expected  # the default plan works
    # from 2.14 the query is sent and scores as the rank_feature plan does
    newer, b14, _ = corpus_at("2.14.0")
    assert [h.id for h in b14.sparse_search(query, 5, neural_sparse=True)] == expected
    assert [s for s in newer.seen("POST", "/_search") if b"query_tokens" in s.body]
