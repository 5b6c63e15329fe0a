"""-word and +word on OpenSearch: the bodies against the API specification, the hand-checkable
collection, and rankings against brute force on the test server, equal to the local index's.
The test server has no k-NN: the dense and hybrid bodies with words are checked against the
specification only (the local index runs them against brute force, tests/test_query_edits.py)."""

from __future__ import annotations

import numpy as np
import pytest
from d2s_os_reference import lucene_score, random_query, ranking, synthetic_docs, ulps, vocabulary

from d2s_search.backends.base import IndexIdentity, WordFilter
from d2s_search.backends.local import LocalBackend
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.features import lucene_feature_value
from d2s_search.errors import QueryError
from tests.helpers import edit_docs

QUERY = {"dog": 1.5, ".": 0.5, "##s": 0.25, "日本": 0.75}
VEC = np.linspace(-1, 1, 8).astype(np.float32)
WORDS = WordFilter(required=("beach", "a.m."), excluded=("car", "%2E"))


def built_bodies():
    for name, filters in (("words", q.Filters(words=WORDS)), ("minus only", q.Filters(words=WordFilter(excluded=("car",)))),
                          ("words+prefix", q.Filters("photos/", WORDS))):
        yield f"sparse {name}", q.sparse_search_body(QUERY, 10, filters=filters)
        yield f"neural_sparse {name}", q.sparse_search_body(QUERY, 10, filters=filters, neural_sparse=True)
        yield f"two-phase {name}", q.two_phase_body({"dog": 1.0}, QUERY, 10, 100, filters=filters)
        yield f"knn {name}", q.knn_search_body(VEC, 10, filters=filters)
        yield f"hybrid {name}", q.hybrid_search_body(QUERY, VEC, 10, window=50, filters=filters)


@pytest.mark.parametrize(("name", "body"), list(built_bodies()), ids=lambda x: x if isinstance(x, str) else "")
def test_bodies_with_words_match_the_spec(spec, name, body):
    spec.validate("POST", "/{index}/_search", body)


def test_word_clauses_escape_terms_and_carry_the_threshold():
    body = q.sparse_search_body({"dog": 1.0}, 5, filters=q.Filters(words=WORDS))["query"]["bool"]
    assert body["minimum_should_match"] == 1
    assert body["filter"][1] == {"function_score": {"query": {"rank_feature": {"field": "sparse.a%2Em%2E", "linear": {}}},
                                                    "min_score": 1.0}}
    assert [c["function_score"]["query"]["rank_feature"]["field"] for c in body["must_not"]] == [
        "sparse.car", "sparse.%252E"]
    # a negative boost is what Lucene refuses (FeatureField weights are in (0, 64]): never sent
    assert all(c["rank_feature"]["boost"] > 0 for c in body["should"])


def test_seismic_refuses_words():
    with pytest.raises(QueryError, match="SEISMIC"):
        q.seismic_query({"1": 1.0}, 10, filters=q.Filters(words=WORDS))


def names(hits) -> list[str]:
    return [h.path.removeprefix("photos/").removesuffix(".jpg") for h in hits]


def test_minus_car_by_hand_on_the_server(backend, tmp_path):
    backend.upsert(edit_docs())
    local = LocalBackend(tmp_path / "idx")
    local.open(IndexIdentity(fingerprint="c" * 32, dense_dim=8, model="synthetic"), create=True)
    local.upsert(edit_docs())
    minus = WordFilter(excluded=("car",))
    for b in (backend, local):
        assert names(b.sparse_search({"dog": 1.0}, 10, words=minus)) == ["dog-faint-car", "dog-park", "dog-beach"]
        assert names(b.sparse_search({"dog": 1.0}, 10, words=WordFilter(required=("beach",)))) == ["dog-beach"]
        assert names(b.two_phase_search({"dog": 1.0}, {"dog": 1.0, "grass": 1.0}, 10, 100, words=minus)) == [
            "dog-park", "dog-faint-car", "dog-beach"]
    local.close()


def _passes(words):
    return lambda d: words.allows({t: lucene_feature_value(w) for t, w in d.sparse.items()})


def test_rankings_with_words_match_brute_force(backend):
    docs = synthetic_docs(300, dim=8, seed=1)
    backend.upsert(docs)
    vocab = vocabulary()
    rng = np.random.default_rng(21)
    checked = 0
    for _ in range(8):
        query = random_query(vocab, rng)
        common = sorted(query, key=lambda t: -sum(t in d.sparse for d in docs))
        values = sorted(lucene_feature_value(d.sparse[common[0]]) for d in docs if common[0] in d.sparse)
        threshold = values[len(values) // 2]
        for words in (WordFilter(required=(common[0],), threshold=threshold),
                      WordFilter(excluded=(common[0],), threshold=threshold),
                      WordFilter(required=(common[1],), excluded=(common[0],), threshold=threshold)):
            expected = ranking(query, docs, only=_passes(words))
            if len(expected) < 11 or len({s for _, s in expected[:11]}) < 11:
                continue  # a top-k with ties may come back in either order
            hits = backend.sparse_search(query, 10, words=words)
            assert [h.id for h in hits] == [i for i, _ in expected[:10]]
            assert all(ulps(h.score, s) <= 1 for h, (_, s) in zip(hits, expected, strict=False))
            first = dict(list(query.items())[:4])
            candidates = [i for i, _ in ranking(first, docs, only=_passes(words))[:25]]
            by_id = {d.id: d for d in docs}
            rescored = sorted(((i, lucene_score(query, by_id[i].sparse)) for i in candidates), key=lambda x: -x[1])
            assert [h.id for h in backend.two_phase_search(first, query, 10, 25, words=words)] == [
                i for i, _ in rescored[:10]]
            checked += 1
    assert checked >= 12
