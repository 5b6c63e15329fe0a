"""Every plan of the local index returns the brute-force top-k: at several sizes, across
shard boundaries (shards made tiny here), after appends that extend the cache, after deletes
and replacements that rebuild it, and from the memory-mapped cache of a new process."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.base import Hit
from d2s_search.backends.local import LocalBackend, cache, kernels
from d2s_search.search import QueryVectors, SearchOptions, fuse_minmax, fuse_rrf, run_query
from tests.helpers import brute_force_dense, brute_force_sparse
from tests.reliability.local_index_fixtures import IDENTITY, VOCAB, synthetic_docs


def assert_ranking(hits: list[Hit], reference: list[tuple[str, float]], k: int) -> None:
    want = reference[:k]
    assert [h.id for h in hits] == [doc_id for doc_id, _ in want]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-5, atol=1e-6)


def queries(seed: int) -> list[QueryVectors]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):
        words = rng.choice(len(VOCAB), size=int(rng.integers(2, 10)), replace=False)
        full = {VOCAB[w]: float(rng.uniform(0.1, 1.5)) for w in words}
        own = dict(list(full.items())[:2])
        out.append(QueryVectors(full=full, own=own, dense=rng.normal(size=16).astype(np.float32)))
    return out


def as_hits(ranking: list[tuple[str, float]], k: int) -> list[Hit]:
    return [Hit(id=d, score=s, path="") for d, s in ranking[:k]]


def check_every_plan(backend: LocalBackend, docs, seed: int) -> None:
    for q in queries(seed):
        for k in (1, 3, 10, 100):
            assert_ranking(run_query(backend, q, SearchOptions(mode="sparse", k=k)).hits, brute_force_sparse(docs, q.full), k)
            assert_ranking(run_query(backend, q, SearchOptions(mode="dense", k=k)).hits, brute_force_dense(docs, q.dense), k)
        for window, k in ((5, 3), (1000, 100)):  # rescored row by row / through the postings
            first = brute_force_sparse(docs, q.own)[:window]
            full = dict(brute_force_sparse(docs, q.full))
            rescored = sorted(((-full.get(d, 0.0), rank, d) for rank, (d, _) in enumerate(first)))
            want = [(d, -s) for s, _, d in rescored]
            assert_ranking(run_query(backend, q, SearchOptions(mode="two-phase", k=k, window=window)).hits, want, k)
        n = 20
        runs = {"sparse": as_hits(brute_force_sparse(docs, q.full), n), "dense": as_hits(brute_force_dense(docs, q.dense), n)}
        for fusion, reference in (("minmax", fuse_minmax(runs, {"sparse": 0.5, "dense": 0.5}, 5)), ("rrf", fuse_rrf(runs, 5))):
            got = run_query(backend, q, SearchOptions(mode="hybrid", k=5, window=n, fusion=fusion)).hits
            assert [h.id for h in got] == [h.id for h in reference]
            for hit in got:  # explained after fusion: the words really shared, largest first
                doc = next(d for d in docs if d.id == hit.id)
                assert all(t in doc.sparse and t in q.full for t, _ in hit.matched)
                assert [c for _, c in hit.matched] == sorted((c for _, c in hit.matched), reverse=True)
    # Explanations sum to the score when every word is shown; paths and urls come from the cache.
    q = queries(seed)[0]
    by_id = {d.id: d for d in docs}
    for hit in backend.sparse_search(q.full, 5, explain=100):
        assert sum(c for _, c in hit.matched) == pytest.approx(hit.score, rel=1e-4)
        assert (hit.path, hit.url) == (by_id[hit.id].path, by_id[hit.id].url)


@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
@pytest.mark.parametrize("n_docs", [1, 6, 7, 8, 15, 60])
def test_every_plan_equals_brute_force_across_shards(tmp_path, monkeypatch, n_docs, kernel):
    if kernel == "numpy":  # the path taken when the install built no C kernel
        monkeypatch.setattr(kernels, "_c_kernel", None)
    elif not kernels.c_kernel_loaded():
        pytest.skip("the C kernel was not built (no C compiler at install time)")
    monkeypatch.setattr(cache, "SHARD_ROWS", 7)
    docs = synthetic_docs(n_docs, seed=n_docs)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    for start in range(0, n_docs, 5):  # appends: the cache is extended across shard boundaries
        backend.upsert(docs[start : start + 5])
        check_every_plan(backend, docs[: start + 5], seed=start)
    assert len(backend._search_state().shards) == -(-n_docs // 7)
    backend.close()
    reopened = LocalBackend(tmp_path / "idx")  # a new process: memory-mapped from disk
    reopened.open(IDENTITY, create=False)
    check_every_plan(reopened, docs, seed=99)
    if n_docs > 2:
        gone = [docs[1].id, docs[-1].id]
        assert reopened.delete(gone) == 2
        docs = [d for d in docs if d.id not in gone]
        replaced = synthetic_docs(1, seed=1234)[0]
        replaced.id = docs[0].id  # replaced in place: keeps its position
        reopened.upsert([replaced])
        docs[0] = replaced
        check_every_plan(reopened, docs, seed=7)


def test_shards_of_real_size_equal_brute_force(tmp_path):
    """Two shards of the default size (65,536), the second partial."""
    rng = np.random.default_rng(3)
    n = cache.SHARD_ROWS + 900
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    from d2s_search.backends.base import Document

    docs = []
    for i in range(n):
        words = rng.choice(len(VOCAB), size=3, replace=False)
        docs.append(Document(id=f"{i:064x}", path=f"/p/{i}", size_bytes=1, width=1, height=1,
                             sparse={VOCAB[w]: float(rng.uniform(0.05, 2.0)) for w in words},
                             dense=rng.normal(size=16).astype(np.float32)))
    backend.upsert(docs)
    assert [s.rows for s in backend._search_state().shards] == [cache.SHARD_ROWS, 900]
    for q in queries(5)[:2]:
        for k in (10, 1000):
            assert_ranking(backend.sparse_search(q.full, k, explain=0), brute_force_sparse(docs, q.full), k)
            assert_ranking(backend.dense_search(q.dense, k, explain=0), brute_force_dense(docs, q.dense), k)


def test_dense_is_exact_below_the_threshold_and_clustered_above(tmp_path, monkeypatch):
    """Above APPROXIMATE_DENSE_FROM the dense plan scores the nearest clusters only: its
    scores are exact inner products, its recall high on clustered vectors; it survives a
    reopen (centroids cached) and appends (new rows joined to the old clusters)."""
    from d2s_search.backends.base import Document
    from d2s_search.backends.local import backend as backend_mod

    monkeypatch.setattr(cache, "SHARD_ROWS", 64)
    monkeypatch.setattr(backend_mod, "APPROXIMATE_DENSE_FROM", 300)
    rng = np.random.default_rng(11)
    centres = rng.normal(size=(12, 16)).astype(np.float32) * 3

    def docs(n, start):
        out = []
        for i in range(start, start + n):
            vec = centres[i % 12] + rng.normal(size=16).astype(np.float32) * 0.5
            out.append(Document(id=f"{i:064x}", path=f"/p/{i}", size_bytes=1, width=1, height=1,
                                sparse={VOCAB[i % len(VOCAB)]: 1.0}, dense=vec))
        return out

    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    collection = docs(250, 0)
    backend.upsert(collection)
    q = centres[3] + rng.normal(size=16).astype(np.float32) * 0.5
    assert backend._search_state().centroids is None  # below: exact
    assert_ranking(backend.dense_search(q, 10, explain=0), brute_force_dense(collection, q), 10)
    collection += docs(400, 250)
    backend.upsert(collection[250:])
    state = backend._search_state()
    assert state.centroids is not None and all("ivf_order" in s.arrays for s in state.shards)
    reopened = LocalBackend(tmp_path / "idx")
    reopened.open(IDENTITY, create=False)
    for b in (backend, reopened):
        recalls = []
        for c in range(12):
            query = centres[c] + rng.normal(size=16).astype(np.float32) * 0.5
            want = brute_force_dense(collection, query)[:10]
            hits = b.dense_search(query, 10, explain=0)
            exact = dict(brute_force_dense(collection, query))
            for h in hits:  # whatever it returns carries the exact score
                assert h.score == pytest.approx(exact[h.id], rel=1e-4, abs=1e-4)
            recalls.append(len({h.id for h in hits} & {d for d, _ in want}) / 10)
        assert np.mean(recalls) >= 0.9
    more = docs(100, 650)
    reopened.upsert(more)  # appended rows join the existing clusters
    state = reopened._search_state()
    assert np.array_equal(state.centroids, backend._search_state().centroids)
    assert sum(s.arrays["ivf_order"].size for s in state.shards) == 750
    collection += more
    query = centres[0] + rng.normal(size=16).astype(np.float32) * 0.5
    want = {d for d, _ in brute_force_dense(collection, query)[:10]}
    assert len({h.id for h in reopened.dense_search(query, 10, explain=0)} & want) >= 8


def test_frequent_terms_scored_from_dense_columns_equal_brute_force(tmp_path, monkeypatch):
    """Terms in at least half of a shard's documents are also stored as dense columns and
    scored from them: every plan still returns the brute-force top-k, bit for bit the same
    scores as the postings give, after appends and from a new process; a column whose shape
    does not match its shard is refused as damage."""
    monkeypatch.setattr(cache, "SHARD_ROWS", 7)
    docs = synthetic_docs(40, seed=5)
    rng = np.random.default_rng(8)
    for doc in docs:  # two words in most documents: dense columns in every shard
        for word in VOCAB[:2]:
            if rng.random() < 0.8:
                doc.sparse[word] = float(rng.uniform(0.05, 2.0))
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    for start in range(0, 40, 13):
        backend.upsert(docs[start : start + 13])
        check_every_plan(backend, docs[: start + 13], seed=start)
    shards = backend._search_state().shards
    assert all(s.arrays["dense_terms"].size for s in shards)
    q = {VOCAB[0]: 0.7, VOCAB[1]: 1.3, VOCAB[5]: 0.2}
    cols, weights = backend._query_columns(q)
    for s in shards:  # the columns give exactly the postings' float32 sums
        a = s.arrays
        with_columns, postings_only = np.empty(s.rows, np.float32), np.empty(s.rows, np.float32)
        kernels.accumulate(a["csc_indptr"], a["csc_indices"], a["csc_data"], s.rows, cols, weights, with_columns,
                           a["dense_terms"], a["dense_columns"])
        kernels.accumulate(a["csc_indptr"], a["csc_indices"], a["csc_data"], s.rows, cols, weights, postings_only)
        assert np.array_equal(with_columns, postings_only)
    backend.close()
    reopened = LocalBackend(tmp_path / "idx")
    reopened.open(IDENTITY, create=False)
    check_every_plan(reopened, docs, seed=3)
    shard = reopened._search_state().shards[0]
    shard.validated = False
    shard.arrays["dense_columns"] = shard.arrays["dense_columns"][:, :-1]
    with pytest.raises(cache.CacheUnusable, match="dense columns"):
        shard.validate()
