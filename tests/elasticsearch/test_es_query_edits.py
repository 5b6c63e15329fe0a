"""-word and +word on Elasticsearch: every body (rank_features and sparse_vector fields, kNN,
the RRF retriever) against the specification, and the hand-checkable collection on the test
server behind the compatibility proxy, where the results equal the local index's."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.base import WordFilter
from d2s_search.backends.elasticsearch import queries as q
from tests.helpers import edit_docs

QUERY = {"dog": 2.0, "car": 1.2, "a.m.": 0.5}
VEC = (np.arange(1, 9, dtype=np.float32) / np.linalg.norm(np.arange(1, 9))).astype(np.float32)
WORDS = WordFilter(required=("beach",), excluded=("car", "%2E"))


def bodies_with_words():
    for sparse_type in q.SPARSE_TYPES:
        for tag, filters in (("words", q.Filters(words=WORDS, sparse_vector=sparse_type == "sparse_vector")),
                             ("minus+prefix", q.Filters("photos/", WordFilter(excluded=("car",)),
                                                        sparse_vector=sparse_type == "sparse_vector"))):
            yield f"sparse-{sparse_type}-{tag}", q.sparse_search_body(QUERY, 10, sparse_type=sparse_type, filters=filters)
            yield f"two-phase-{sparse_type}-{tag}", q.two_phase_body({"dog": 2.0}, QUERY, 10, 100,
                                                                     sparse_type=sparse_type, filters=filters)
            yield f"rrf-{sparse_type}-{tag}", q.rrf_search_body(QUERY, VEC, 10, window=100, sparse_type=sparse_type,
                                                                filters=filters)
            yield f"knn-{sparse_type}-{tag}", q.knn_search_body(VEC, 10, filters=filters)


@pytest.mark.parametrize(("name", "body"), list(bodies_with_words()), ids=lambda x: x if isinstance(x, str) else "")
def test_bodies_with_words_match_the_spec(spec, name, body):
    spec.validate("POST", "/{index}/_search", body)


def test_sparse_vector_words_query_the_field_as_mapped():
    body = q.sparse_search_body({"dog": 1.0}, 5, sparse_type="sparse_vector",
                                filters=q.Filters(words=WORDS, sparse_vector=True))["query"]["bool"]
    assert body["filter"] == [{"function_score": {"query": {"sparse_vector": {
        "field": "sparse", "query_vector": {"beach": 1.0}, "prune": False}}, "min_score": 1.0}}]
    assert [c["function_score"]["query"]["sparse_vector"]["query_vector"] for c in body["must_not"]] == [
        {"car": 1.0}, {"%252E": 1.0}]
    knn = q.knn_search_body(VEC, 5, filters=q.Filters(words=WORDS))["knn"]
    assert knn["filter"] == [q.Filters(words=WORDS).as_query()] and "must_not" in knn["filter"][0]["bool"]


@pytest.fixture
def backend(make_backend, es_proxy, identity):
    b = make_backend(es_proxy.url)
    b.open(identity)
    return b


def names(hits) -> list[str]:
    return [h.path.removeprefix("photos/").removesuffix(".jpg") for h in hits]


def test_minus_car_by_hand_on_the_server(backend):
    backend.upsert(edit_docs())
    minus = WordFilter(excluded=("car",))
    assert names(backend.sparse_search({"dog": 1.0, "car": 1.0}, 10)) == [
        "dog-in-car", "car-alone", "dog-faint-car", "dog-park", "dog-beach"]
    hits = backend.sparse_search({"dog": 1.0}, 10, words=minus)
    assert names(hits) == ["dog-faint-car", "dog-park", "dog-beach"] and [h.score for h in hits] == [1.75, 1.5, 1.25]
    assert names(backend.sparse_search({"dog": 1.0}, 10, words=WordFilter(required=("beach",)))) == ["dog-beach"]
    assert names(backend.two_phase_search({"dog": 1.0}, {"dog": 1.0, "grass": 1.0}, 10, 100, words=minus)) == [
        "dog-park", "dog-faint-car", "dog-beach"]
