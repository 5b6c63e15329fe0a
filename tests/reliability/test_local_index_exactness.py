"""Every plan of the local index returns the brute-force top-k: at several sizes, across
shard boundaries (shards made tiny here), after appends that extend the cache, after deletes
and replacements that rebuild it, and from the memory-mapped cache of a new process."""

from __future__ import annotations

import os

import numpy as np
import pytest

from d2s_search.backends.base import Hit
from d2s_search.backends.local import LocalBackend, cache, graph, kernels
from d2s_search.errors import QueryError
from d2s_search.search import QueryVectors, SearchOptions, fuse_minmax, fuse_rrf, run_query
from tests.helpers import brute_force_dense, brute_force_sparse
from tests.reliability.local_index_fixtures import (
    IDENTITY,
    VOCAB,
    graphs_at_any_size,
    synthetic_docs,
)


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
    by_id = {d.id: d for d in docs}
    for q in queries(seed):
        for k in (1, 3, 10, 100):
            hits = run_query(backend, q, SearchOptions(mode="sparse", k=k)).hits
            assert_ranking(hits, brute_force_sparse(docs, q.full), k)
            # each hit's path and url are its own, whichever shards the hits came from
            assert [(h.path, h.url) for h in hits] == [(by_id[h.id].path, by_id[h.id].url) for h in hits]
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
    for hit in backend.sparse_search(q.full, 5, explain=100):
        assert sum(c for _, c in hit.matched) == pytest.approx(hit.score, rel=1e-4)
        assert (hit.path, hit.url) == (by_id[hit.id].path, by_id[hit.id].url)


@pytest.mark.parametrize("threads", [1, 3])  # shards one after another / in groups searched at once
@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
@pytest.mark.parametrize("n_docs", [1, 6, 7, 8, 15, 60])
def test_every_plan_equals_brute_force_across_shards(tmp_path, monkeypatch, n_docs, kernel, threads):
    if kernel == "numpy":  # the path taken when the install built no C parts: scores and hits in Python
        monkeypatch.setattr(kernels, "_c_kernel", None)
        monkeypatch.setattr(kernels, "_c_hits", None)
    elif not kernels.c_kernel_loaded():
        pytest.skip("the C kernel was not built (no C compiler at install time)")
    monkeypatch.setattr(cache, "SHARD_ROWS", 7)
    docs = synthetic_docs(n_docs, seed=n_docs)
    backend = LocalBackend(tmp_path / "idx", threads=threads)
    backend.open(IDENTITY)
    for start in range(0, n_docs, 5):  # appends: the cache is extended across shard boundaries
        backend.upsert(docs[start : start + 5])
        check_every_plan(backend, docs[: start + 5], seed=start)
    assert len(backend._search_state().shards) == -(-n_docs // 7)
    backend.close()
    reopened = LocalBackend(tmp_path / "idx", threads=threads)  # a new process: memory-mapped from disk
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


def clustered_docs(rng, centres, n, start):
    from d2s_search.backends.base import Document

    out = []
    for i in range(start, start + n):
        vec = centres[i % len(centres)] + rng.normal(size=centres.shape[1]).astype(np.float32) * 0.5
        out.append(Document(id=f"{i:064x}", path=f"/p/{i}", size_bytes=1, width=1, height=1,
                            sparse={VOCAB[i % len(VOCAB)]: 1.0}, dense=vec))
    return out


def dense_recall(backend: LocalBackend, collection, queries_, k: int = 10) -> float:
    """Mean recall@k against brute force; every score returned must be the exact one."""
    recalls = []
    for query in queries_:
        exact = brute_force_dense(collection, query)
        hits = backend.dense_search(query, k, explain=0)
        scores = dict(exact)
        for h in hits:
            assert h.score == pytest.approx(scores[h.id], rel=1e-4, abs=1e-4)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        recalls.append(len({h.id for h in hits} & {d for d, _ in exact[:k]}) / k)
    return float(np.mean(recalls))


def test_dense_is_exact_below_the_threshold_and_a_graph_above(tmp_path, monkeypatch):
    """Above APPROXIMATE_DENSE_FROM the dense side is searched through HNSW graphs over 8-bit
    copies of the vectors, beside the float vectors (which score the graph's candidates): one
    spanning the full shards, one for the last shard. Scores are exact inner products, recall
    against brute force high; it survives a reopen and appends (the spanning graph's file is
    hard-linked until a shard fills, then that shard's vectors are added to it)."""
    from d2s_search.backends.local import backend as backend_mod

    graphs_at_any_size(monkeypatch, 64, approximate_from=300)  # tiny shards: the graph for every k < rows
    rng = np.random.default_rng(11)
    centres = rng.normal(size=(12, 16)).astype(np.float32) * 3
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    collection = clustered_docs(rng, centres, 250, 0)
    backend.upsert(collection)
    q = centres[3] + rng.normal(size=16).astype(np.float32) * 0.5
    assert not any("hnsw" in s.arrays for s in backend._search_state().shards)  # below: exact
    assert_ranking(backend.dense_search(q, 10, explain=0), brute_force_dense(collection, q), 10)
    collection += clustered_docs(rng, centres, 400, 250)
    backend.upsert(collection[250:])
    state = backend._search_state()
    # 650 rows: one graph spans the ten full shards (stored with the first), the last has its own
    assert [s.rows for s in state.shards] == [64] * 10 + [10]
    assert [("hnsw" in s.arrays, s.graph_span) for s in state.shards] == [(True, 10)] + [(False, 1)] * 9 + [(True, 1)]
    assert state.dense_units() == [(0, 10), (10, 1)]
    for j in range(len(state.shards)):  # the float vectors in their own file; the graph holds a byte a value
        assert (state.state_dir / f"shard-{j:05d}-dense.npy").is_file()
    for first, span in state.dense_units():
        blob, members = state.shards[first].arrays["hnsw"], state.shards[first : first + span]
        assert not any(np.shares_memory(m.arrays["dense"], blob) for m in members)
        rows = sum(m.rows for m in members)
        assert blob.size - graph.layout(blob, rows, 16).codes == sum(m.arrays["dense"].size for m in members)
    reopened = LocalBackend(tmp_path / "idx")
    reopened.open(IDENTITY, create=False)
    probes = [centres[c] + rng.normal(size=16).astype(np.float32) * 0.5 for c in range(12)]
    for b in (backend, reopened):
        assert dense_recall(b, collection, probes) >= 0.9
        for k in (1, 100, 1000):  # k beyond the graph's search width, and beyond the index
            hits = b.dense_search(probes[0], k, explain=0)
            assert len(hits) == min(k, len(collection)) and len({h.id for h in hits}) == len(hits)
    # A k that is a large share of a shard's rows is a scan of its vectors: exact.
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1 / 48)
    assert_ranking(reopened.dense_search(probes[1], 50, explain=0), brute_force_dense(collection, probes[1]), 50)
    monkeypatch.setattr(backend_mod, "RANK_EACH_SHARD_UP_TO", 8)  # ranked once across shards past k=8
    assert_ranking(reopened.dense_search(probes[2], 50, explain=0), brute_force_dense(collection, probes[2]), 50)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1.0)
    # A faiss that cannot read graphs in place (before 1.11) scans them too: exact, no crash.
    monkeypatch.setattr(graph, "available", lambda: False)
    fresh = LocalBackend(tmp_path / "idx")
    fresh.open(IDENTITY, create=False)
    assert_ranking(fresh.dense_search(probes[2], 10, explain=0), brute_force_dense(collection, probes[2]), 10)
    monkeypatch.undo()
    graphs_at_any_size(monkeypatch, 64, approximate_from=300)
    old_dir = reopened._search_state().state_dir
    more = clustered_docs(rng, centres, 20, 650)  # fills no shard: the spanning graph's file is linked
    reopened.upsert(more)
    state = reopened._search_state()
    assert (state.state_dir / "shard-00000-hnsw.npy").stat().st_ino == (old_dir / "shard-00000-hnsw.npy").stat().st_ino
    collection += more
    more = clustered_docs(rng, centres, 80, 670)  # fills the eleventh shard: added to the spanning graph
    reopened.upsert(more)
    collection += more
    state = reopened._search_state()
    assert sum(s.rows for s in state.shards) == 750 and state.dense_units() == [(0, 11), (11, 1)]
    assert state.shards[0].graph_recall is not None
    assert dense_recall(reopened, collection, probes) >= 0.9
    again = LocalBackend(tmp_path / "idx")  # the span read back from the cache header
    again.open(IDENTITY, create=False)
    assert again._search_state().dense_units() == [(0, 11), (11, 1)]
    assert dense_recall(again, collection, probes) >= 0.9
    again.close()
    # Back under the threshold (a delete): exact again, the vectors written out plainly.
    monkeypatch.setattr(backend_mod, "APPROXIMATE_DENSE_FROM", 10**6)
    reopened.delete([collection[-1].id])
    collection.pop()
    state = reopened._search_state()
    assert not any("hnsw" in s.arrays for s in state.shards) and list(state.state_dir.glob("shard-*-dense.npy"))
    assert_ranking(reopened.dense_search(q, 10, explain=0), brute_force_dense(collection, q), 10)


@pytest.mark.parametrize("spanning", [False, True], ids=["a-graph-a-shard", "one-graph-spanning"])
def test_dense_graph_recall_on_real_clip_embeddings(tmp_path, monkeypatch, spanning):
    """Real CLIP ViT-B/32 image vectors (flickr8k-100), caption vectors as queries: the graphs
    (threshold lowered, shards of 32: several per-shard graphs merged, or one spanning the full
    shards and the last shard's) find the exact top 10."""
    from d2s_search.backends.base import Document, IndexIdentity
    from d2s_search.backends.local import backend as backend_mod
    from tests.helpers import SHARED_DATA

    clip = SHARED_DATA / "flickr8k-100-clip-b32"
    if not clip.is_dir():
        pytest.skip(f"{clip} not found (shared test data)")
    images = np.load(clip / "image_embeddings.npy")[::5]
    captions = np.load(clip / "text_embeddings.npy")[::7]
    graphs_at_any_size(monkeypatch, 32)
    backend = LocalBackend(tmp_path / "clip")
    backend.open(IndexIdentity("clip", images.shape[1], "clip"))
    docs = [Document(id=f"{i:064x}", path=f"/{i}", size_bytes=0, width=0, height=0, sparse={"x": 1.0},
                     dense=images[i]) for i in range(len(images))]
    if not spanning:
        monkeypatch.setattr(backend_mod, "SPANNING_GRAPH_FROM_SHARDS", 10**6)
    backend.upsert(docs)
    state = backend._search_state()
    if spanning:
        assert state.dense_units() == [(0, len(docs) // 32)] + ([(len(docs) // 32, 1)] if len(docs) % 32 else [])
    else:
        assert all("hnsw" in s.arrays for s in state.shards) and len(state.dense_units()) == len(state.shards)
    assert dense_recall(backend, docs, captions) >= 0.95


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


class ClientFused:
    """The same backend without its own hybrid_search: run_query then fuses in search.py."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    def sparse_search(self, *args, **kwargs):
        return self.backend.sparse_search(*args, **kwargs)

    def dense_search(self, *args, **kwargs):
        return self.backend.dense_search(*args, **kwargs)

    def explain_hits(self, *args, **kwargs):
        return self.backend.explain_hits(*args, **kwargs)


def test_hybrid_fused_on_arrays_equals_the_client_fusion(tmp_path, monkeypatch):
    """The local backend fuses hybrid runs itself (arrays, hits built for the k fused rows
    only): ids, fused scores, per-run parts, explanations, paths and urls are exactly those
    of search.py's fusion of the same runs, ties (duplicated documents) broken by id alike."""
    monkeypatch.setattr(cache, "SHARD_ROWS", 16)
    docs = synthetic_docs(70, seed=21)
    for i, twin in enumerate(synthetic_docs(12, seed=21)[:12]):  # exact ties: same vectors, other ids
        twin.id = f"{0xffff - i:064x}" if i % 2 else f"{i:064x}"
        docs.append(twin)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    client = ClientFused(backend)
    for q in queries(4) + [QueryVectors(full={"nope": 1.0}, own={}, dense=docs[3].dense)]:
        for options in (SearchOptions(mode="hybrid", k=1, window=5), SearchOptions(mode="hybrid", k=5, alpha=0.3),
                        SearchOptions(mode="hybrid", k=10, fusion="rrf", window=40),
                        SearchOptions(mode="hybrid", k=60, window=200, explain=3)):
            native = run_query(backend, q, options)
            reference = run_query(client, q, options)
            assert native.fusion == reference.fusion == f"client-{options.fusion}"
            assert [(h.id, h.score, h.parts, h.matched, h.path, h.url) for h in native.hits] == \
                   [(h.id, h.score, h.parts, h.matched, h.path, h.url) for h in reference.hits]
            assert native.hits


def test_many_hits_explained_from_postings_across_shards(tmp_path, monkeypatch):
    """Through the backend: hits explained from the query's posting lists (forced for any
    count) carry exactly the explanations read from their rows, across shards, and so do those
    the compiled kernel reads through its table of the query's columns."""
    from d2s_search.backends.local import backend as backend_mod

    monkeypatch.setattr(cache, "SHARD_ROWS", 16)
    docs = synthetic_docs(90, seed=31)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    compiled = kernels.explain_slots
    for q in queries(6):
        for n in (1, 5, 100):
            monkeypatch.setattr(kernels, "explain_slots", lambda *args: None)  # the paths without the table
            monkeypatch.setattr(backend_mod, "EXPLAIN_BY_POSTINGS_FROM", 10**9)
            rows_ = backend.sparse_search(q.full, 100, explain=n)
            monkeypatch.setattr(backend_mod, "EXPLAIN_BY_POSTINGS_FROM", 1)
            postings = backend.sparse_search(q.full, 100, explain=n)
            assert [(h.id, h.matched) for h in postings] == [(h.id, h.matched) for h in rows_]
            assert any(h.matched for h in postings)
            monkeypatch.setattr(kernels, "explain_slots", compiled)
            table = backend.sparse_search(q.full, 100, explain=n)
            assert [(h.id, h.matched) for h in table] == [(h.id, h.matched) for h in rows_]


def wide_vocabulary_doc():
    """A document of 70,000 distinct terms: ingested first, it pushes the index's vocabulary
    past 65,536 columns and every word of :data:`VOCAB` to a column above 70,000."""
    from d2s_search.backends.base import Document

    return Document(id="f" * 64, path="/p/wide.jpg", size_bytes=1, width=1, height=1,
                    sparse={f"rare{i}": 0.01 for i in range(70_000)}, dense=np.zeros(16, dtype=np.float32))


@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
def test_term_ids_of_16_and_32_bits_answer_and_explain_alike(tmp_path, monkeypatch, kernel):
    """The postings by document hold 16-bit term ids while the vocabulary fits in 65,536
    columns, 32-bit ones beyond: both answer every plan as brute force does and explain each
    hit with the same words and values, after appends and from a new process."""
    if kernel == "numpy":
        monkeypatch.setattr(kernels, "_c_kernel", None)
        monkeypatch.setattr(kernels, "_c_hits", None)
    elif not kernels.c_kernel_loaded():
        pytest.skip("the C kernel was not built (no C compiler at install time)")
    monkeypatch.setattr(cache, "SHARD_ROWS", 16)
    docs = synthetic_docs(60, seed=41)
    narrow, wide = LocalBackend(tmp_path / "narrow"), LocalBackend(tmp_path / "wide")
    narrow.open(IDENTITY)
    wide.open(IDENTITY)
    wide.upsert([wide_vocabulary_doc()])
    for start in (0, 40):  # an append extends the cache
        narrow.upsert(docs[start : start + 40])
        wide.upsert(docs[start : start + 40])
    assert {s.arrays["csr_indices"].dtype for s in narrow._search_state().shards} == {np.dtype(np.uint16)}
    assert {s.arrays["csr_indices"].dtype for s in wide._search_state().shards} == {np.dtype(np.int32)}
    assert min(wide._term_ids[w] for w in VOCAB) > 70_000
    for backend in (narrow, wide):
        backend.close()
    narrow, wide = LocalBackend(tmp_path / "narrow"), LocalBackend(tmp_path / "wide")
    narrow.open(IDENTITY, create=False)
    wide.open(IDENTITY, create=False)
    check_every_plan(narrow, docs, seed=41)
    check_every_plan(wide, [wide_vocabulary_doc(), *docs], seed=41)
    for q in queries(42):
        for k, n in ((10, 5), (100, 3), (100, 100)):
            got = [[(h.id, h.score, h.matched) for h in b.sparse_search(q.full, k, explain=n)] for b in (narrow, wide)]
            assert got[0] == got[1] and any(matched for *_, matched in got[0])
            assert [h[0] for h in got[0]] == [d for d, _ in brute_force_sparse(docs, q.full)[:k]]


@pytest.mark.parametrize("id_type", [np.int32, np.uint16])
def test_explanations_read_from_postings_equal_those_read_from_rows(id_type):
    """Many hits are explained from the query's posting lists (binary searches, dense
    columns read directly): the same terms and float32 contributions, in the same order (ties
    by term id), as from each row's own postings."""
    rng = np.random.default_rng(5)
    rows_, cols_ = 300, 40
    dense = np.where(rng.random((rows_, cols_)) < 0.3, rng.choice([0.5, 1.0, 1.5], size=(rows_, cols_)), 0.0)
    dense[:, 7] = 1.0  # a term in every row (gets a dense column)
    dense = dense.astype(np.float32)
    csr_indptr = np.concatenate([[0], np.cumsum((dense > 0).sum(axis=1))]).astype(np.int64)
    csr_indices = np.concatenate([np.flatnonzero(r) for r in dense]).astype(np.int32)
    csr_data = dense[dense > 0]
    csc_indptr = np.concatenate([[0], np.cumsum((dense > 0).sum(axis=0))]).astype(np.int32)
    csc_indices = np.concatenate([np.flatnonzero(c) for c in dense.T]).astype(id_type)  # main keeps 16-bit ids
    csc_data = dense.T[dense.T > 0]
    terms, columns = cache.dense_columns(csc_indptr, csc_indices, csc_data, rows_)
    assert 7 in terms.tolist()
    query_cols = np.array([1, 3, 7, 8, 20, 39, 45], dtype=np.int64)  # 45: a term newer than the shard
    weights = np.array([1.0, 2.0, 0.5, 1.0, 1.0, 3.0, 1.0], dtype=np.float32)
    for picked in (rng.permutation(rows_)[:200], np.arange(rows_), np.array([5, 5 + 1, 299, 0])):
        for n in (1, 3, 10):
            want = kernels.explain_rows(csr_indptr, csr_indices, csr_data, picked, query_cols, weights, n)
            for extra in ((None, None), (terms, columns)):
                slots, values = kernels.explain_by_postings(csc_indptr, csc_indices, csc_data, picked, query_cols,
                                                            weights, n, *extra)
                got = [[(int(query_cols[s]), v) for s, v in zip(row_s, row_v) if v > 0]
                       for row_s, row_v in zip(slots.tolist(), values.tolist())]
                assert got == want


def test_a_shard_found_damaged_by_a_search_thread_is_rebuilt(tmp_path, monkeypatch, capsys):
    """The last of 6 shards, searched by a pool thread, fails the kernel's bounds check: the
    search rebuilds the structures from SQLite once (one warning) and answers exactly."""
    if not kernels.c_kernel_loaded():
        pytest.skip("the C kernel was not built (no C compiler at install time)")
    monkeypatch.setattr(cache, "SHARD_ROWS", 7)
    docs = synthetic_docs(40, seed=5)
    backend = LocalBackend(tmp_path / "idx", threads=3)
    backend.open(IDENTITY)
    backend.upsert(docs)
    q = queries(1)[0]
    want = brute_force_sparse(docs, q.full)
    state = backend._search_state()
    assert len(state.shards) == 6
    last = state.shards[-1]
    last.validate()  # validated before the damage: only the kernel's own checks stand in the way
    damaged = last.arrays["csc_indices"].copy()
    damaged[:] = np.iinfo(damaged.dtype).max  # every posting points far past the shard's rows
    last.arrays["csc_indices"] = damaged
    assert_ranking(backend.sparse_search(q.full, 10, explain=0), want, 10)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "rebuilding" in err, err
    assert_ranking(backend.sparse_search(q.full, 10, explain=0), want, 10)  # the rebuilt shards: no word
    assert capsys.readouterr().err == ""
    backend.close()
    assert backend._pool is None


def test_search_threads_are_counted_and_checked(tmp_path):
    assert LocalBackend(tmp_path / "a").threads == 1
    assert LocalBackend(tmp_path / "a", threads=4).threads == 4
    assert LocalBackend(tmp_path / "a", threads=0).threads == (os.cpu_count() or 1)
    with pytest.raises(QueryError, match="search threads"):
        LocalBackend(tmp_path / "a", threads=-1)
