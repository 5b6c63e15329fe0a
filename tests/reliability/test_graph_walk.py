"""The compiled graph walk (_graph.c) against faiss's own search of the same graph and against
brute force: the same candidates, filters kept, damage refused, and a process that only
searches never importing faiss."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from d2s_search.backends.base import Document
from d2s_search.backends.local import LocalBackend, graph, kernels
from tests.reliability.local_index_fixtures import DIM, IDENTITY, VOCAB, graphs_at_any_size

pytestmark = [
    pytest.mark.skipif(not graph.available(), reason="faiss 1.11+ (the faiss extra) builds the graphs"),
    pytest.mark.skipif(graph._c_graph is None, reason="the compiled graph walk (_graph.c) is not built"),
]

WIDE = 40  # not a multiple of the walk's 16 codes a step: its tail is scored too


def clustered(n: int, seed: int, dim: int = WIDE) -> np.ndarray:
    """Unit vectors in 30 clusters: how embeddings of photos sit, unlike uniform noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(30, dim))
    x = centres[rng.integers(0, 30, n)] + rng.normal(size=(n, dim)) * 0.6
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def built():
    vectors = clustered(3000, 1)
    blob = graph.build([vectors])
    where = graph.layout(blob, 3000, WIDE)
    graph.check(blob, where, 3000)
    return vectors, blob, where


def opened(built, compiled: bool) -> graph.OpenedGraph:
    vectors, blob, where = built
    return graph.OpenedGraph(blob, where, vectors.shape[0], WIDE, compiled=compiled)


def test_the_walk_finds_what_faiss_finds_on_the_same_graph(built):
    vectors = built[0]
    walk, faiss_search = opened(built, True), opened(built, False)
    assert walk.compiled and not faiss_search.compiled
    queries = clustered(60, 2)
    for width in (8, 32, 128):
        same = found_walk = found_faiss = 0
        for query in queries:
            ours, theirs = walk.candidates(query, width), faiss_search.candidates(query, width)
            assert ours.size == width == np.unique(ours).size
            same += len(set(ours.tolist()) & set(theirs.tolist()))
            exact = set(np.argsort(-(vectors @ query))[:8].tolist())
            found_walk += len(exact & set(graph.search(walk, vectors, query, 8, width)[0].tolist()))
            found_faiss += len(exact & set(graph.search(faiss_search, vectors, query, 8, width)[0].tolist()))
        assert same >= 0.98 * width * len(queries)
        assert found_walk >= found_faiss - 0.01 * 8 * len(queries)
    assert found_walk >= 0.95 * 8 * len(queries)


def test_every_row_a_candidate_is_brute_force_and_filters_hold(built):
    vectors = built[0]
    walk = opened(built, True)
    rng = np.random.default_rng(3)
    for _ in range(5):
        query = rng.normal(size=WIDE).astype(np.float32)
        rows, scores = graph.search(walk, vectors, query, 10, 3000)
        exact = np.lexsort((np.arange(3000), -(vectors @ query)))[:10]
        assert rows.tolist() == exact.tolist()
        np.testing.assert_allclose(scores, vectors[exact] @ query, rtol=1e-6)
        allowed = rng.random(3000) < 0.2
        rows, _ = graph.search(walk, vectors, query, 10, 3000, allowed)
        allowed_rows = np.flatnonzero(allowed)
        assert rows.tolist() == allowed_rows[np.lexsort((allowed_rows, -(vectors[allowed_rows] @ query)))[:10]].tolist()
        narrow = walk.candidates(query, 40, allowed)
        assert narrow.size == 40 and allowed[narrow].all()  # keeps walking until 40 allowed rows are held
    nothing = np.zeros(3000, dtype=bool)
    assert walk.candidates(rng.normal(size=WIDE).astype(np.float32), 16, nothing).size == 0


def test_a_graph_changed_after_its_check_is_refused_not_read_past(built):
    vectors, blob, where = built
    neighbours = blob[where.neighbors[0] : where.neighbors[0] + 4 * where.neighbors[1]]
    first_slot = int(np.flatnonzero(neighbours.view("<i4") >= 0)[0])
    cases = []
    changed = blob.copy()  # a neighbour past the rows
    changed[where.neighbors[0] + 4 * first_slot : where.neighbors[0] + 4 * first_slot + 4] = np.frombuffer(
        np.int32(3000).tobytes(), np.uint8)
    cases.append(changed)
    changed = blob.copy()  # every node's lists start past the neighbour array
    changed[where.offsets[0] : where.offsets[0] + 8 * 3000] = np.full(3000, 1 << 40, np.uint64).view(np.uint8)
    cases.append(changed)
    query = vectors[0]
    for damaged in cases:
        walk = graph.OpenedGraph(damaged, where, 3000, WIDE)
        with pytest.raises(kernels.DamagedArrays):
            walk.candidates(query, 3000)
    short = graph.OpenedGraph(blob[: where.codes + 100], where, 3000, WIDE)  # the codes cut off
    with pytest.raises(kernels.DamagedArrays, match="do not fit"):
        short.candidates(query, 10)
    with pytest.raises(kernels.DamagedArrays, match="do not fit"):
        opened(built, True).candidates(query[:-1], 10)  # a query of the wrong dimension


def test_every_code_scored_in_one_scan_is_the_walks_score(built):
    """The scan of every 8-bit code (a hybrid's large pool): each row's score is the inner
    product as faiss decodes the codes, less one constant for all rows; a cut blob or a query
    of the wrong dimension is refused; without the compiled walk there is no scan."""
    import faiss

    vectors, blob, where = built
    index = faiss.deserialize_index(np.ascontiguousarray(blob[where.base :]))
    decoded = index.storage.reconstruct_n(0, 3000)  # vmin + (code + 0.5) / 255 * vdiff
    walk = opened(built, True)
    for query in clustered(5, 6):
        scores = walk.code_scores(query)
        exact = decoded @ query
        shift = exact - scores
        assert scores.dtype == np.float32 and scores.shape == (3000,)
        assert np.ptp(shift) < 1e-3 * np.ptp(exact)  # one constant for every row
        assert np.argmax(scores) == np.argmax(exact)
    with pytest.raises(kernels.DamagedArrays, match="do not fit"):
        graph.OpenedGraph(blob[: where.codes + 100], where, 3000, WIDE).code_scores(vectors[0])
    with pytest.raises(kernels.DamagedArrays, match="do not fit"):
        walk.code_scores(vectors[0][:-1])
    assert opened(built, False).code_scores(vectors[0]) is None


def test_a_scanned_pool_holds_the_exact_top_k_with_exact_scores(built):
    vectors = built[0]
    walk = opened(built, True)
    for query in clustered(10, 7):
        rows, scores = graph.scanned(walk, vectors, query, 500)
        exact = vectors @ query
        top = np.lexsort((np.arange(3000), -exact))[:500]
        assert set(top.tolist()) <= set(rows.tolist())
        np.testing.assert_array_equal(scores, vectors[rows] @ query)  # scored with the float vectors
        assert np.all(scores >= exact[top[-1]])  # the k best and what ties the k-th, no more
    assert graph.scanned(walk, vectors, vectors[0], 700) is None  # a pool of most rows: scan the floats


def test_a_hybrid_pool_from_the_codes_fuses_as_one_from_the_floats(tmp_path, monkeypatch):
    """A hybrid search's dense pool (hundreds a side: k=30 fuses 300) from a scan of the
    spanning graph's codes: the same hits, scores and parts as the pool scanned from the float
    vectors."""
    from d2s_search.backends.local import backend as backend_mod
    from d2s_search.search import QueryVectors, SearchOptions, run_query

    graphs_at_any_size(monkeypatch, 512)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1 / 48)  # 300 candidates of 1,536 rows: past the graph
    vectors = clustered(1800, 8, DIM)
    docs = [Document(id=f"{i:064x}", path=f"/p/{i}.jpg", size_bytes=1, width=1, height=1,
                     sparse={VOCAB[i % len(VOCAB)]: 1.0 + (i % 7) / 7, VOCAB[(3 * i) % len(VOCAB)]: 0.5},
                     dense=vectors[i]) for i in range(1800)]
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    used = []
    scanned = graph.scanned

    def counted(*args):
        found = scanned(*args)
        used.append(found is not None)
        return found

    options = SearchOptions(mode="hybrid", k=30, explain=0)
    for seed, q in enumerate(clustered(6, 9, DIM)):
        query = QueryVectors(full={VOCAB[seed]: 1.0, VOCAB[seed + 5]: 0.7}, own={VOCAB[seed]: 1.0}, dense=q)
        monkeypatch.setattr(graph, "scanned", counted)
        codes = run_query(backend, query, options).hits
        monkeypatch.setattr(graph, "scanned", lambda *args: None)
        floats = run_query(backend, query, options).hits
        assert [(h.id, h.score, h.parts) for h in codes] == [(h.id, h.score, h.parts) for h in floats]
    assert used == [True, False] * 6  # the spanning graph's codes; the last shard's 264 rows: its floats
    backend.close()


def spanned_index(path, monkeypatch) -> LocalBackend:
    """600 documents in shards of 200: one graph spanning the three, the cache written."""
    graphs_at_any_size(monkeypatch, 200)
    vectors = clustered(600, 5, DIM)
    docs = [Document(id=f"{i:064x}", path=f"/p/{i}.jpg", size_bytes=1, width=1, height=1,
                     sparse={VOCAB[i % len(VOCAB)]: 1.0}, dense=vectors[i]) for i in range(600)]
    backend = LocalBackend(path)
    backend.open(IDENTITY)
    backend.upsert(docs)
    backend._search_state()
    return backend


def test_a_graph_the_stamp_vouches_for_is_walked_without_a_second_check(tmp_path, monkeypatch):
    """graph.check ran when the graph was built; a later process whose cache stamp vouches for
    the file (unchanged since written) walks it unchecked with the compiled walk, which checks
    its own reads, and checks it first where faiss would walk it (as for a file read back:
    tests/reliability/test_local_index_cache.py, the damaged graphs)."""
    spanned_index(tmp_path / "idx", monkeypatch).close()
    checks = []
    real = graph.check
    monkeypatch.setattr(graph, "check", lambda *a: checks.append(1) or real(*a))
    query = clustered(1, 7, DIM)[0]
    answers = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(graph, "_c_graph", None)
        backend = LocalBackend(tmp_path / "idx")
        backend.open(None, create=False)
        answers.append([h.id for h in backend.dense_search(query, 5, explain=0)])
        assert backend._search_state().shards[0].graph_vouched
        assert len(checks) == (0 if compiled else 1)
        backend.close()
    assert answers[0] == answers[1]


def test_a_process_that_only_searches_never_imports_faiss(tmp_path, monkeypatch):
    backend = spanned_index(tmp_path / "idx", monkeypatch)
    query = clustered(1, 6, DIM)[0]
    want = [h.id for h in backend.dense_search(query, 5, explain=0)]
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from d2s_search.backends.local import LocalBackend, backend as backend_mod, cache
        cache.SHARD_ROWS = 200
        backend_mod.APPROXIMATE_DENSE_FROM = 0
        backend_mod.GRAPH_FROM_ROWS = 0
        backend_mod.GRAPH_K_SHARE = 1.0
        index = LocalBackend({str(tmp_path / "idx")!r})
        index.open(None, create=False)
        hits = index.dense_search(np.array({query.tolist()!r}, dtype=np.float32), 5, explain=0)
        units = index._search_state().dense_units()
        print(json.dumps({{"ids": [h.id for h in hits], "faiss": "faiss" in sys.modules,
                          "graphs": sum("hnsw" in index._search_state().shards[f].arrays for f, _ in units)}}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    result = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert result["graphs"] == 1  # one graph spanning the three full shards
    assert result["ids"] == want and not result["faiss"]

