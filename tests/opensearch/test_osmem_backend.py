"""The backend against a real HTTP server (osmem-server, OpenSearch-compatible, in memory).

osmem implements rank_features / rank_feature / rescore, not kNN or search pipelines; those
run in test_real_opensearch.py against a cluster.
"""

from __future__ import annotations

import dataclasses

import httpx
import numpy as np
import pytest
from d2s_os_reference import (
    exact_dot,
    lucene_score,
    random_query,
    ranking,
    synthetic_docs,
    ulps,
    vocabulary,
)

from d2s_search.backends.base import Backend, Document, IndexIdentity
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.errors import (
    BackendUnavailableError,
    BundleMismatchError,
    IndexStoreError,
    QueryError,
)

N_DOCS = 300


@pytest.fixture
def corpus(backend):
    docs = synthetic_docs(N_DOCS, dim=8, seed=1)
    backend.upsert(docs)
    return docs


def _assert_ranking(hits, expected, k):
    """Hits equal the brute-force top-k: same ids in order, scores within 1 ulp of Lucene's sum."""
    assert len(expected) >= k, "the query must match enough documents to test a top-k"
    want = expected[:k]
    # Ties (equal float32 scores) may come back in either order; none are expected here.
    assert len({s for _, s in expected[: k + 1]}) == k + 1
    assert [h.id for h in hits] == [i for i, _ in want]
    for h, (_, s) in zip(hits, want, strict=True):
        assert ulps(h.score, s) <= 1, (h.score, s)


def test_backend_satisfies_protocol(backend):
    assert isinstance(backend, Backend)


def test_ingest_round_trip(backend, corpus, osmem_url):
    assert backend.ids_present([d.id for d in corpus] + ["nope"]) == {d.id for d in corpus}
    got = backend.get([corpus[5].id, "nope", corpus[2].id])
    assert [d.id for d in got] == [corpus[5].id, corpus[2].id]
    for stored, orig in zip(got, [corpus[5], corpus[2]], strict=True):
        assert stored.sparse == {t: float(np.float32(w)) for t, w in orig.sparse.items()}
        assert np.array_equal(stored.dense, orig.dense)
        assert (stored.path, stored.size_bytes, stored.width, stored.height) == (
            orig.path, orig.size_bytes, orig.width, orig.height)
        assert abs(stored.ingested_at - orig.ingested_at) < 1e-3
    # Raw _source: escaped keys, no dots, terms as plain words.
    raw = httpx.get(f"{osmem_url}/d2s-test/_doc/{corpus[0].id}").json()["_source"]
    assert all("." not in k for k in raw["sparse"])
    assert raw["terms"] == corpus[0].top_terms(20)
    assert backend.stats()["documents"] == N_DOCS


def test_tricky_terms_are_stored_and_searchable(backend):
    vocab = vocabulary()
    docs = [
        Document(id=f"t{i}", path=f"t/{i}.jpg", size_bytes=1, width=1, height=1,
                 sparse={term: 1.0 + i, "common": 0.5}, dense=np.ones(8, np.float32) / np.sqrt(8))
        for i, term in enumerate(vocab[:60])
    ]
    backend.upsert(docs)
    for i, term in enumerate(vocab[:60]):
        hits = backend.sparse_search({term: 1.0}, 3)
        assert [h.id for h in hits] == [f"t{i}"], term
        assert hits[0].matched == [(term, 1.0 + i)]


def test_zero_and_negative_weights_never_sent(backend, osmem_url):
    doc = Document(id="z", path="z.jpg", size_bytes=1, width=1, height=1,
                   sparse={"pos": 0.5, "zero": 0.0, "neg": -2.0, "nan": float("nan")},
                   dense=np.ones(8, np.float32))
    backend.upsert([doc])  # OpenSearch would refuse the whole document for any of those
    raw = httpx.get(f"{osmem_url}/d2s-test/_doc/z").json()["_source"]
    assert raw["sparse"] == {"pos": 0.5}
    assert backend.sparse_search({"pos": 1.0, "zero": 0.0, "neg": -1.0}, 5)[0].id == "z"
    with pytest.raises(QueryError):
        backend.sparse_search({"zero": 0.0, "neg": -1.0}, 5)


def test_upsert_is_idempotent(backend, corpus):
    backend.upsert(corpus[:50])
    assert backend.stats()["documents"] == N_DOCS


def test_delete_counts_existing(backend, corpus):
    assert backend.delete([corpus[0].id, corpus[1].id, "nope", corpus[0].id]) == 2
    assert backend.ids_present([corpus[0].id, corpus[2].id]) == {corpus[2].id}
    assert backend.stats()["documents"] == N_DOCS - 2


@pytest.mark.parametrize(
    ("value", "boost", "expected"),
    [
        (0.1, 1.0, 0.099853515625),  # 0x3DCCCCCD truncated to 0x3DCC8000
        (1.3, 1.0, 1.296875),        # 0x3FA66666 -> 0x3FA60000
        (3.14159265, 2.0, 6.28125),  # 0x40490FDB -> 0x40490000 = 3.140625, times 2 exactly
        (1.3, 0.5, 0.6484375),       # boosts are not truncated: 0.5 * 1.296875
    ],
)
def test_score_is_nine_bit_truncated_value_times_boost(backend, value, boost, expected):
    doc = Document(id="one", path="1.jpg", size_bytes=1, width=1, height=1, sparse={"x": value},
                   dense=np.ones(8, np.float32))
    backend.upsert([doc])
    (hit,) = backend.sparse_search({"x": boost}, 1)
    assert hit.score == expected
    assert hit.score != pytest.approx(value * boost, rel=1e-6)  # the truncation is visible
    assert hit.matched == [("x", float(np.float32(value)) * boost)]  # matched terms use exact weights


def test_boost_is_float32_not_truncated(backend):
    doc = Document(id="one", path="1.jpg", size_bytes=1, width=1, height=1, sparse={"x": 1.0},
                   dense=np.ones(8, np.float32))
    backend.upsert([doc])
    (hit,) = backend.sparse_search({"x": 0.1}, 1)
    assert hit.score == float(np.float32(0.1))  # 0.1f, not 0.099853515625


def test_sparse_scores_and_ranking_match_brute_force(backend, corpus):
    rng = np.random.default_rng(7)
    vocab = vocabulary()
    differs = 0
    for _ in range(15):
        query = random_query(vocab, rng)
        hits = backend.sparse_search(query, 10)
        expected = ranking(query, corpus)
        _assert_ranking(hits, expected, 10)
        by_id = {d.id: d for d in corpus}
        for h in hits:
            exact = exact_dot(query, by_id[h.id].sparse)
            differs += not np.isclose(h.score, exact, rtol=1e-6)
            assert h.score == pytest.approx(exact, rel=2**-8)  # truncation error bound
            assert h.matched == sorted(h.matched, key=lambda tc: -tc[1])[:5]
            assert [t for t, _ in h.matched] == [
                t for t, _ in sorted(((t, w * by_id[h.id].sparse[t]) for t, w in query.items()
                                      if t in by_id[h.id].sparse), key=lambda tc: (-tc[1], tc[0]))[:5]]
    assert differs > 0  # the reference is Lucene's rounding, not the exact dot product


def test_pagination_concatenates_to_one_page(backend, corpus):
    query = random_query(vocabulary(), np.random.default_rng(3))
    whole = backend.sparse_search(query, 30)
    pages = [h for off in (0, 10, 20) for h in backend.sparse_search(query, 10, offset=off)]
    assert [h.id for h in pages] == [h.id for h in whole]
    assert len(whole) == 30


def test_path_prefix_filter(backend, corpus):
    query = random_query(vocabulary(), np.random.default_rng(4))
    hits = backend.sparse_search(query, 10, path_prefix="photos/cats/")
    expected = ranking(query, corpus, only=lambda d: d.path.startswith("photos/cats/"))
    _assert_ranking(hits, expected, 10)
    # Documents matching only the filter (no query term) are not returned.
    hits = backend.sparse_search({"never-seen": 1.0, "w000": 1.0}, 50, path_prefix="photos/cats/")
    assert all(h.score > 0 for h in hits)


def test_two_phase_matches_brute_force(backend, corpus):
    rng = np.random.default_rng(11)
    vocab = vocabulary()
    for _ in range(8):
        full = random_query(vocab, rng, n_terms=20)
        first = dict(list(full.items())[:4])
        window = 25
        hits = backend.two_phase_search(first, full, 10, window)
        candidates = [i for i, _ in ranking(first, corpus)[:window]]
        by_id = {d.id: d for d in corpus}
        rescored = sorted(((i, lucene_score(full, by_id[i].sparse)) for i in candidates), key=lambda x: -x[1])
        _assert_ranking(hits, rescored, 10)
        # Matched terms explain the full query, expansion terms included.
        assert any(t not in first for h in hits for t, _ in h.matched)


def test_two_phase_window_smaller_than_page_still_rescored(backend, corpus):
    full = random_query(vocabulary(), np.random.default_rng(12), n_terms=20)
    first = dict(list(full.items())[:3])
    hits = backend.two_phase_search(first, full, 10, window=2)
    by_id = {d.id: d for d in corpus}
    for h in hits:  # every returned hit carries its full-query score
        assert ulps(h.score, lucene_score(full, by_id[h.id].sparse)) <= 1


def test_query_pruned_to_max_clause_count(backend, corpus):
    query = random_query(vocabulary(), np.random.default_rng(5), n_terms=40)
    from d2s_search.backends.opensearch.queries import CLAUSE_MARGIN

    backend._max_clauses = 8 + CLAUSE_MARGIN  # as if the cluster allowed 8 clauses beyond the margin
    hits = backend.sparse_search(query, 10)
    kept = dict(sorted(query.items(), key=lambda kv: -kv[1])[:8])
    _assert_ranking(hits, ranking(kept, corpus), 10)
    assert hits[0].matched  # matched terms still explain with the whole query


def test_max_clause_count_read_from_cluster(backend):
    assert backend.max_clauses() == 1024  # osmem reports the OpenSearch default


def test_open_refuses_other_bundle(make_backend, osmem_url, backend, identity):
    other = make_backend(osmem_url)
    with pytest.raises(BundleMismatchError):
        other.open(dataclasses.replace(identity, fingerprint="0" * 32))
    with pytest.raises(BundleMismatchError):
        other.open(dataclasses.replace(identity, dense_dim=16))
    other.open(identity, create=False)  # the same bundle is fine
    other.open(None, create=False)
    assert other.identity == identity


def test_open_missing_without_create(make_backend, osmem_url, identity):
    b = make_backend(osmem_url, index_name="absent")
    with pytest.raises(IndexStoreError, match="absent"):
        b.open(identity, create=False)
    assert not b.exists()


def test_open_claims_index_created_from_mapping_file(make_backend, osmem_url, identity):
    from d2s_search.backends.opensearch.queries import index_body

    body = index_body()  # == mappings/index.json (test_request_bodies checks it)
    body["mappings"]["properties"]["dense"]["dimension"] = identity.dense_dim
    body["mappings"]["_meta"]["dense_dim"] = identity.dense_dim
    assert httpx.put(f"{osmem_url}/by-hand", json=body).status_code == 200
    b = make_backend(osmem_url, index_name="by-hand")
    b.open(identity)
    assert b.stats()["bundle_fingerprint"] == identity.fingerprint
    with pytest.raises(BundleMismatchError):
        make_backend(osmem_url, index_name="by-hand").open(dataclasses.replace(identity, fingerprint="1" * 32))


def test_reindex_server_side_keeps_every_document(backend, corpus):
    before = {h.id for h in backend.sparse_search({"w000": 1.0, "dog": 1.0}, 50)}
    out = backend.reindex()
    assert out == {"from": "d2s-test-000001", "to": "d2s-test-000002", "documents": N_DOCS, "kept_old": False}
    assert backend.stats()["indices"] == ["d2s-test-000002"]
    assert backend.ids_present([d.id for d in corpus]) == {d.id for d in corpus}
    assert {h.id for h in backend.sparse_search({"w000": 1.0, "dog": 1.0}, 50)} == before


def test_reindex_to_new_bundle_reencodes(backend, corpus, identity):
    new = dataclasses.replace(identity, fingerprint="9" * 32, model="v2")

    def reencode(doc: Document) -> Document:
        return dataclasses.replace(doc, sparse={"v2": 1.0, **doc.sparse})

    out = backend.reindex(new, reencode, page=64, keep_old=True)
    assert out["documents"] == N_DOCS and out["kept_old"]
    assert len(backend.sparse_search({"v2": 1.0}, 500)) == N_DOCS
    assert backend.stats()["bundle_fingerprint"] == new.fingerprint


def test_reindex_aborts_without_losing_anything(backend, corpus, identity, osmem_url):
    new = dataclasses.replace(identity, fingerprint="9" * 32)
    with pytest.raises(IndexStoreError, match="could not be re-encoded"):
        backend.reindex(new, lambda d: None if d.id == corpus[7].id else d)
    stats = backend.stats()
    assert stats["indices"] == ["d2s-test-000001"] and stats["documents"] == N_DOCS
    assert stats["bundle_fingerprint"] == identity.fingerprint
    assert httpx.head(f"{osmem_url}/d2s-test-000002").status_code == 404  # half-built copy removed


def test_reindex_replaces_plain_index_with_alias(make_backend, osmem_url, identity):
    from d2s_search.backends.opensearch.queries import index_body

    assert httpx.put(f"{osmem_url}/plain", json=index_body(identity)).status_code == 200
    b = make_backend(osmem_url, index_name="plain")
    b.open(identity)
    b.upsert(synthetic_docs(20, dim=8))
    assert b.reindex()["to"] == "plain-000001"
    assert b.stats()["indices"] == ["plain-000001"] and b.stats()["documents"] == 20


def test_drop(backend, corpus):
    backend.drop()
    assert not backend.exists()


def test_secrets_never_shown(make_backend, osmem_url):
    b = make_backend(osmem_url, user="admin", password="s3cr3t-pw")
    assert "s3cr3t-pw" not in repr(b) and "s3cr3t-pw" not in str(b) and "***" in repr(b)
    k = make_backend(osmem_url, api_key="k3y-s3cr3t")
    assert "k3y-s3cr3t" not in repr(k)
    port = httpx.URL(osmem_url).port
    dead = make_backend(f"http://admin:s3cr3t-pw@127.0.0.1:{port + 1 if port < 65535 else 1}", retries=1)
    with pytest.raises(BackendUnavailableError) as err:
        dead.exists()
    assert "s3cr3t-pw" not in str(err.value) and "admin" not in str(err.value)
    assert "127.0.0.1" in str(err.value)


def test_from_env(osmem_url):
    env = {"D2S_OPENSEARCH_URL": osmem_url, "D2S_OPENSEARCH_USER": "u", "D2S_OPENSEARCH_PASSWORD": "pw-secret",
           "D2S_OPENSEARCH_INDEX": "from-env"}
    b = OpenSearchBackend.from_env(env=env)
    try:
        assert b.index_name == "from-env" and b.http.user == "u" and "pw-secret" not in repr(b)
    finally:
        b.close()
    with pytest.raises(BackendUnavailableError, match="D2S_OPENSEARCH_URL"):
        OpenSearchBackend.from_env(env={})
    insecure = OpenSearchBackend.from_env(env={"D2S_OPENSEARCH_URL": osmem_url, "D2S_OPENSEARCH_INSECURE": "1"})
    try:
        assert insecure.exists() is False  # connects; verification only matters for https
    finally:
        insecure.close()


def test_same_identity_as_local_semantics(backend, corpus):
    """Hit.score is the (rounded) dot product and Hit.matched the exact per-term products."""
    query = {"w000": 1.25, "dog": 0.5}
    hits = backend.sparse_search(query, 5, explain=3)
    by_id = {d.id: d for d in corpus}
    for h in hits:
        d = by_id[h.id].sparse
        assert h.matched == sorted(((t, w * float(np.float32(d[t]))) for t, w in query.items() if t in d),
                                   key=lambda tc: (-tc[1], tc[0]))[:3]
        assert h.path == by_id[h.id].path
        assert h.to_json()["matched"]


def test_identity_dim_checked_on_upsert(backend):
    bad = Document(id="bad", path="b.jpg", size_bytes=1, width=1, height=1, sparse={"a": 1.0},
                   dense=np.ones(3, np.float32))
    good = Document(id="good", path="g.jpg", size_bytes=1, width=1, height=1, sparse={"a": 1.0},
                    dense=np.ones(8, np.float32))
    from d2s_search.errors import DocumentsRejectedError

    with pytest.raises(DocumentsRejectedError) as err:
        backend.upsert([bad, good])
    assert set(err.value.failures) == {"bad"} and err.value.exit_code == 3
    assert backend.ids_present(["bad", "good"]) == {"good"}


def test_index_identity_type():
    assert IndexIdentity("x", 8).model == ""


def test_words_shown_from_a_cluster(backend):
    """Forms of one word collapsed from the cluster's stored weights, their contributions summed
    past the raw terms kept; a picture's own words in weight order (a cluster counts no df)."""
    from d2s_search.inflections import Word
    from d2s_search.search import QueryVectors, SearchOptions, run_query
    from d2s_search.serve.service import SearchService

    dense = np.ones(8, dtype=np.float32) / np.sqrt(8)
    docs = [Document(id=f"{i:064x}", path=f"/p/{i}.jpg", size_bytes=1, width=1, height=1, sparse=sparse, dense=dense)
            for i, sparse in enumerate([{"dog": 1.0, "dogs": 0.5, "car": 1.25, "beach": 0.25},
                                        {"dog": 0.25, "beach": 1.0}])]
    backend.upsert(docs)
    query = QueryVectors(full={"dog": 1.0, "dogs": 1.0, "car": 1.0}, own={"dog": 1.0}, dense=dense)
    (first, second) = run_query(backend, query, SearchOptions(k=2, explain=1)).hits
    assert first.id == docs[0].id and first.score == 2.75
    assert first.matched == [("car", 1.25)]  # the strongest raw term; dog 1.0 + dogs 0.5 beat it as a word
    assert first.words == [Word("dog", 1.5, ("dog", "dogs"))]
    assert second.words == [Word("dog", 0.25, ("dog",))]
    words = SearchService(None, backend).document_words(docs[0])
    assert [(w.word, w.weight, w.idf, w.terms) for w in words] == [
        ("car", 1.25, None, ("car",)), ("dog", 1.0, None, ("dog", "dogs")), ("beach", 0.25, None, ("beach",))]
