"""``sparse_vector`` on Elasticsearch 8.19+/9.1+ scores every query token, as the dot product.

Fields of indices created there prune query tokens by default, and a query without ``prune``
takes the field's setting (the stand-in in esproxy.py does what the cited source does). Every
query says ``prune: false`` and, where the version takes it, the mapping says
``index_options: {prune: false}``: the hits are the brute-force ranking the local index gives.
"""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import numpy as np
import pytest
from d2s_es_proxy import CompatProxy
from d2s_os_reference import random_query, ranking, synthetic_docs, ulps, vocabulary

from d2s_search.backends.elasticsearch import queries as q
from d2s_search.backends.elasticsearch.queries import VectorMapping

SPARSE_VECTOR = VectorMapping(sparse_type="sparse_vector")


def test_sparse_vector_bodies_never_prune_and_match_the_spec(spec):
    query = {"dog": 1.5, "car": 0.25}
    body = q.sparse_search_body(query, 10, sparse_type="sparse_vector", filters=q.Filters("a/"))
    clause = body["query"]["bool"]["must"][0]["sparse_vector"]
    assert clause["prune"] is False
    spec.validate("POST", "/{index}/_search", body)
    rescored = q.two_phase_body(query, query, 10, 50, sparse_type="sparse_vector")
    assert rescored["rescore"]["query"]["rescore_query"]["sparse_vector"]["prune"] is False
    spec.validate("POST", "/{index}/_search", rescored)
    rrf = q.rrf_search_body(
        query, np.ones(8, np.float32) / np.sqrt(8), 10, sparse_type="sparse_vector"
    )
    spec.validate("POST", "/{index}/_search", rrf)
    index = q.index_body(mapping=SPARSE_VECTOR, sparse_index_options=True)
    assert index["mappings"]["properties"]["sparse"] == {
        "type": "sparse_vector",
        "index_options": {"prune": False},
    }
    spec.validate("PUT", "/{index}", index)
    # rank_features has no such option, and a version without it gets the plain field
    assert (
        "index_options"
        not in q.index_body(sparse_index_options=True)["mappings"]["properties"]["sparse"]
    )
    assert q.index_body(mapping=SPARSE_VECTOR)["mappings"]["properties"]["sparse"] == {
        "type": "sparse_vector"
    }


@pytest.mark.parametrize(
    ("version", "takes"),
    [
        ((8, 15), False),
        ((8, 18), False),
        ((8, 19), True),
        ((9, 0), False),
        ((9, 1), True),
        ((9, 2), True),
    ],
)
def test_index_options_only_where_the_version_takes_them(version, takes):
    assert q.takes_sparse_index_options(version) is takes


@pytest.fixture
def corpus():
    """Documents that all hold a frequent word ("photo", as captions do), with its own weight."""
    docs = synthetic_docs(200, dim=8, seed=11)
    rng = np.random.default_rng(2)
    return [replace(d, sparse={**d.sparse, "photo": float(rng.uniform(0.5, 2.0))}) for d in docs]


def _queries():
    """Queries that weigh the frequent word lightly: below 0.4x their best token."""
    rng = np.random.default_rng(5)
    return [{**random_query(vocabulary(), rng), "photo": 0.5, "w100": 2.6} for _ in range(6)]


@pytest.mark.parametrize("version", ["8.19.3", "9.1.0", "9.2.1"])
def test_hits_are_the_dot_product_ranking_on_pruning_versions(
    make_backend, osmem_url, identity, corpus, version
):
    proxy = CompatProxy(osmem_url, pretend_version=version)
    try:
        b = make_backend(proxy.url, index_name="sv", mapping=SPARSE_VECTOR)
        b.open(identity)
        b.upsert(corpus)
        for query in _queries():
            expected = ranking(query, corpus)
            hits = b.sparse_search(query, 10)
            assert [h.id for h in hits] == [i for i, _ in expected[:10]]
            for h, (_, s) in zip(hits, expected, strict=False):
                assert ulps(h.score, s) <= 1
        (put,) = [s for s in proxy.sent if s.method == "PUT" and s.path == "/sv-000001"][-1:]
        assert put.json()["mappings"]["properties"]["sparse"]["index_options"] == {"prune": False}
    finally:
        proxy.close()


def _unpruned(hits: list[dict], query: dict[str, float], corpus) -> bool:
    """The hits are the dot-product top 10, with its scores."""
    expected = ranking(query, corpus)[:10]
    return [h["_id"] for h in hits] == [i for i, _ in expected] and all(
        ulps(float(np.float32(h["_score"])), s) <= 1
        for h, (_, s) in zip(hits, expected, strict=True)
    )


def test_the_stand_in_prunes_a_query_that_does_not_say_otherwise(
    make_backend, osmem_url, identity, corpus
):
    """What the backend guards against: a query without ``prune`` on a field left at its
    default (an index made by hand from the plain mapping) loses frequent tokens."""
    proxy = CompatProxy(osmem_url, pretend_version="9.1.0")
    try:
        plain = q.index_body(identity, SPARSE_VECTOR, shards=1, replicas=0)
        assert httpx.put(f"{proxy.url}/plain", json=plain).status_code == 200
        b = make_backend(proxy.url, index_name="plain")
        b.open(identity)
        b.upsert(corpus)
        b.settle()
        kept = pruned = 0
        for query in _queries():
            body = q.sparse_search_body(query, 10, sparse_type="sparse_vector")
            kept += _unpruned(
                b._call("POST", "/plain/_search", body=body)[1]["hits"]["hits"], query, corpus
            )
            del body["query"]["sparse_vector"]["prune"]
            pruned += not _unpruned(
                b._call("POST", "/plain/_search", body=body)[1]["hits"]["hits"], query, corpus
            )
        assert kept == 6 and pruned == 6
    finally:
        proxy.close()


@pytest.mark.parametrize("version", ["8.18.1", "9.0.4"])
def test_versions_without_index_options_get_the_plain_field(
    make_backend, osmem_url, identity, corpus, version
):
    proxy = CompatProxy(osmem_url, pretend_version=version)
    try:
        b = make_backend(proxy.url, index_name="sv", mapping=SPARSE_VECTOR)
        b.open(identity)
        (put,) = [s for s in proxy.sent if s.method == "PUT" and s.path == "/sv-000001"][-1:]
        assert put.json()["mappings"]["properties"]["sparse"] == {"type": "sparse_vector"}
        # and such a server refuses the option, as Elasticsearch does
        refused = httpx.put(
            f"{proxy.url}/other",
            json=q.index_body(identity, SPARSE_VECTOR, sparse_index_options=True),
        )
        assert refused.status_code == 400 and "unknown parameter [index_options]" in refused.text
        b.upsert(corpus)
        query = _queries()[0]
        assert [h.id for h in b.sparse_search(query, 10)] == [
            i for i, _ in ranking(query, corpus)[:10]
        ]
        searches = [s.json() for s in proxy.sent if s.path.split("?")[0] == "/sv/_search"]
        sent = [x for x in searches if '"sparse_vector"' in json.dumps(x)]  # not the path lookups
        assert sent and all(json.dumps(x).count('"prune": false') == 1 for x in sent)
    finally:
        proxy.close()
