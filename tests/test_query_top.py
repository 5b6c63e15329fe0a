"""A sparse query's top k in one C call (``backends/local/_query.c``, kernels.QueryTop) against
the Python path it replaces: the query's columns as ``_query_columns`` makes them, every shard
through the ctypes kernel (:func:`kernels.shard_top`), the lists merged (:func:`kernels.merge_top`).
Same columns, rows and scores bit for bit, ties by row, across shards of different widths; the
queries it does not take are handed back; damaged postings are refused without writing outside
its buffers; and the backend answers through it with the same hits as without it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from d2s_search.backends.base import Document, IndexIdentity
from d2s_search.backends.local import LocalBackend, kernels
from d2s_search.backends.local import cache as cache_mod
from d2s_search.backends.local.cache import dense_columns
from d2s_search.inflections import Inflections, Word

pytestmark = pytest.mark.skipif(kernels._c_query is None or not kernels.c_kernel_loaded(),
                                reason="the C parts were not built (no C compiler at install time)")

TERMS = [f"w{i}" for i in range(90)]


def shard_arrays(rng: np.random.Generator, rows: int, n_cols: int, id_type):
    """CSC postings with ids ascending in every list (as the cache writes them), Zipf-like term
    popularity, a few terms on most rows (dense columns) and few distinct weights (ties)."""
    popularity = 1.0 / np.arange(1, n_cols + 1)
    popularity /= popularity.sum()
    row_of = np.repeat(np.arange(rows), 6)
    col_of = rng.choice(n_cols, size=row_of.size, p=popularity)
    common = np.flatnonzero(rng.random((rows, 3)) < 0.8)
    row_of, col_of = np.concatenate([row_of, common // 3]), np.concatenate([col_of, common % 3])
    keys = np.unique(col_of.astype(np.int64) * rows + row_of)
    col_of, row_of = keys // rows, keys % rows
    indptr = np.zeros(n_cols + 1, dtype=np.int32)
    np.cumsum(np.bincount(col_of, minlength=n_cols), out=indptr[1:])
    data = kernels.encode_weights(rng.choice(np.array([0.25, 0.5, 1.0, 1.7], np.float32), size=keys.size))
    indices = row_of.astype(id_type)
    terms, columns = dense_columns(indptr, indices, data, rows)
    return indptr, indices, data, terms, columns


def collection(rng: np.random.Generator, id_type, sizes: list[int]):
    """Shards in row order; later shards know more terms (their columns are wider), as an index
    that grew does."""
    shards, starts, start = [], [], 0
    for j, rows in enumerate(sizes):
        shards.append((shard_arrays(rng, rows, 60 + 10 * j, id_type), rows))
        starts.append(start)
        start += rows
    return shards, starts


def python_path(shards, starts, query: dict, term_ids: dict, k: int):
    pairs = sorted((term_ids[t], w) for t, w in query.items() if w > 0 and t in term_ids)
    cols = np.fromiter((c for c, _ in pairs), dtype=np.int64, count=len(pairs))
    weights = np.fromiter((w for _, w in pairs), dtype=np.float32, count=len(pairs))
    lists = []
    for ((indptr, indices, data, terms, columns), rows), start in zip(shards, starts):
        buffer = np.empty(rows, np.float32)
        r, s = kernels.shard_top(indptr, indices, data, rows, cols, weights, buffer, k, terms, columns)
        lists.append((r + start, s))
    rows, scores = kernels.merge_top(lists, k)
    return cols, weights, rows, scores


def row_wise(indptr, indices, data, rows: int, col_type=np.int32):
    """The same postings row by row (CSR: int64 pointers, column ids of ``col_type``: 16 bits
    when the shard's columns fit, else 32), as the cache keeps them."""
    col_of = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    order = np.lexsort((col_of, indices.astype(np.int64)))
    row_ptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(indices.astype(np.int64), minlength=rows), out=row_ptr[1:])
    return row_ptr, col_of[order].astype(col_type), data[order]


def table_of(shards, starts, col_types=(np.int32,)) -> kernels.ShardTable:
    """The shards' table, shard j's row-wise column ids of ``col_types[j % len(col_types)]``."""
    bound = [kernels.BoundShard.bind(*arrays[:3], rows, *arrays[3:]) for arrays, rows in shards]
    assert all(bound)
    return kernels.ShardTable(bound, starts, [row_wise(*arrays[:3], rows, col_types[j % len(col_types)])
                                              for j, (arrays, rows) in enumerate(shards)])


def words_of(shards, starts, rows, cols, weights, n):
    """Each hit's n strongest words as the backend's _explain gives them (kernels.explain_rows)."""
    out = []
    for row in rows.tolist():
        j = max(i for i, start in enumerate(starts) if start <= row)
        (arrays, n_rows) = shards[j]
        csr = row_wise(*arrays[:3], n_rows)
        pairs = kernels.explain_rows(*csr, np.array([row - starts[j]]), cols, weights, n)[0]
        out.append([(TERMS[c], v) for c, v in pairs])
    return out


@pytest.mark.parametrize("col_types", [(np.int32,), (np.uint16, np.int32)], ids=["32-bit", "16-and-32-bit"])
@pytest.mark.parametrize("id_type", [np.uint16, np.int32])
@pytest.mark.parametrize("seed", range(5))
def test_the_c_path_equals_the_python_path_bit_for_bit(seed, id_type, col_types):
    """Row ids of 16 or 32 bits by column; column ids by row of 32 bits, or of 16 and 32 bits
    in turn (an index whose vocabulary outgrew 16 bits after its first shards)."""
    rng = np.random.default_rng(seed)
    sizes = [int(x) for x in rng.integers(1, 400, size=int(rng.integers(1, 5)))]
    shards, starts = collection(rng, id_type, sizes)
    table = table_of(shards, starts, col_types)
    term_ids = {t: i for i, t in enumerate(TERMS)}  # w60-w89: columns only the wider shards have
    top = kernels.QueryTop(max(sizes), len(sizes), 8, 1000, 7, table.n_cols)
    for _ in range(25):
        words = rng.choice(len(TERMS) + 5, size=int(rng.integers(0, 30)), replace=False)
        query = {(TERMS[i] if i < len(TERMS) else f"unknown{i}"): float(rng.choice([0.5, 1.0, 0.3, 2.0, 0.0, -1.0]))
                 for i in words}
        for k in (1, 3, 10, 20, 21, 64, 1000):  # above 20 (HEAP_K): d2s_top_large per shard
            want_cols, want_weights, want_rows, want_scores = python_path(shards, starts, query, term_ids, k)
            if not top.fits(table, len(query), k, 7):
                top = kernels.QueryTop(max(sizes), len(sizes), len(query), 1000, 7, table.n_cols)
            words = (0, 1, 3, 7)[k % 4]
            assert top.run(table, query, term_ids, k, words, TERMS) == want_rows.size
            rows, scores, cols, weights = top.results()
            assert np.array_equal(top.out_rows[: top.found], rows) and np.array_equal(top.out_scores64[: top.found], scores)
            if words:  # each hit's words, as _explain reads them from its own postings
                assert top.matched == words_of(shards, starts, want_rows, want_cols, want_weights, words)
            else:
                assert top.matched is None
            assert cols.tolist() == want_cols.tolist() and np.array_equal(weights, want_weights)
            assert rows.dtype == np.int64 and rows.tolist() == want_rows.tolist()
            assert scores.dtype == np.float32 and np.array_equal(scores, want_scores)  # bit for bit


def test_ties_across_shards_go_to_the_earlier_row():
    """Every row scores the same: the first k rows of the collection, shard after shard."""
    indptr = np.array([0, 5], dtype=np.int32)
    indices = np.arange(5, dtype=np.uint16)
    data = kernels.encode_weights(np.ones(5, np.float32))
    shards = [((indptr, indices, data, None, None), 5), ((indptr, indices.copy(), data, None, None), 5)]
    table = table_of(shards, [0, 5])
    top = kernels.QueryTop(5, 2, 4)
    assert top.run(table, {"a": 2.0}, {"a": 0}, 8) == 8
    rows, scores, _, _ = top.results()
    assert rows.tolist() == list(range(8)) and scores.tolist() == [2.0] * 8
    assert top.run(table, {"a": 2.0}, {"a": 0}, 20) == 10  # k above the rows
    assert top.results()[0].tolist() == list(range(10))


@pytest.mark.parametrize("k", [3, 25])  # a heap per shard, and d2s_top_large's (above HEAP_K)
def test_later_shards_keep_only_rows_above_the_earlier_kth_score(k):
    """Later shards keep only rows above the k-th best of the shards before them: a row tying
    that score loses the tie to the earlier row, a better one still comes in, in its place."""
    rng = np.random.default_rng(7)
    n = 40
    first = rng.permutation(np.arange(1, n + 1, dtype=np.float32) / 8)  # shard 0: distinct scores
    kth = np.sort(first)[::-1][k - 1]
    second = np.full(n, kth, np.float32)  # shard 1: every row ties shard 0's k-th ...
    second[[5, 17]] = [kth + 0.25, first.max() + 1]  # ... but two beat it
    third = np.full(n, kth / 2, np.float32)  # shard 2: all below
    third[33] = kth  # one more tie
    shards = []
    for scores in (first, second, third):
        indptr = np.array([0, n], dtype=np.int32)
        shards.append(((indptr, np.arange(n, dtype=np.uint16), kernels.encode_weights(scores), None, None), n))
    starts = [0, n, 2 * n]
    table = table_of(shards, starts)
    top = kernels.QueryTop(n, 3, 4, k)
    assert top.run(table, {"a": 1.0}, {"a": 0}, k) == k
    rows, scores, _, _ = top.results()
    everything = np.concatenate([kernels.decode_weights(a[2]) for a, _ in shards])
    want = np.lexsort((np.arange(everything.size), -everything))[:k]  # brute force, ties by row
    assert rows.tolist() == want.tolist() and np.array_equal(scores, everything[want])
    assert {n + 5, n + 17} <= set(rows.tolist()) and 2 * n + 33 not in rows.tolist()


def test_queries_it_does_not_take_are_handed_back():
    rng = np.random.default_rng(3)
    shards, starts = collection(rng, np.uint16, [50, 60])
    table = table_of(shards, starts)
    term_ids = {t: i for i, t in enumerate(TERMS)}
    top = kernels.QueryTop(60, 2, 8)
    assert top.run(table, {"w1": 1.0}, term_ids, 21) is None  # k above its buffers: the ctypes path
    assert top.run(table, {"w1": 1}, term_ids, 5) is None  # an int weight: Python compares it
    assert top.run(table, {"w1": np.float32(1.0)}, term_ids, 5) is None
    assert top.run(table, {"w1": 1e300}, term_ids, 5) is None  # infinite in float32: explain_slots refuses it
    assert top.run(table, {1: 1.0}, term_ids, 5) is None  # not a str
    assert top.run(table, {"w1": 1.0}, {"w1": np.int64(1)}, 5) is None  # a column not an int
    assert top.run(table, {f"w{i}": 1.0 for i in range(top.capacity + 1)}, term_ids, 5) is None  # more than it holds
    assert not kernels.QueryTop(59, 2, 8).fits(table, 1, 5) and not kernels.QueryTop(60, 1, 8).fits(table, 1, 5)
    assert not top.fits(table, 1, 5, 1)  # no room for words
    assert not kernels.QueryTop(60, 2, 8, 20, 3, table.n_cols - 1).fits(table, 1, 5, 3)  # a slot table too short
    assert kernels.QueryTop(60, 2, 8, 50).fits(table, 1, 50) and not kernels.QueryTop(60, 2, 8, 50).fits(table, 1, 51)
    assert top.run(table, {"nothing": 1.0, "w2": -1.0}, term_ids, 5) == 0
    rows, scores, cols, _ = top.results()
    assert rows.size == scores.size == cols.size == 0


@pytest.mark.parametrize("damage", ["id too large", "pointer past the end", "pointer backwards"])
def test_damaged_postings_are_refused_without_writing_outside_the_buffers(damage):
    indptr = np.array([0, 2, 4], dtype=np.int32)
    indices = np.array([0, 1, 1, 2], dtype=np.uint16)
    data = kernels.encode_weights(np.ones(4, dtype=np.float32))
    if damage == "id too large":
        indices[1] = 3
    elif damage == "pointer past the end":
        indptr[2] = 900
    else:
        indptr[1] = 5
    bound = kernels.BoundShard.bind(indptr, indices, data, 3)
    table = kernels.ShardTable([bound], [0], [(np.zeros(4, np.int64), np.zeros(0, np.int32), np.zeros(0, np.uint16))])
    top = kernels.QueryTop(3, 1, 4)
    guard = np.full(9, 9.0, dtype=np.float32)
    top.scores = guard[3:6]  # the shard's 3 rows inside a larger block: the guards must stay
    top._args = (*top._args[:5], top.scores.ctypes.data, 3, *top._args[7:])
    with pytest.raises(kernels.DamagedArrays):
        top.run(table, {"a": 1.0, "b": 1.0}, {"a": 0, "b": 1}, 3)
    assert np.all(guard[:3] == 9.0) and np.all(guard[6:] == 9.0)


def test_a_hits_damaged_row_is_refused():
    """A row pointer past the row-wise postings: DamagedArrays (the cache is rebuilt), nothing read."""
    indptr = np.array([0, 3], dtype=np.int32)
    indices = np.array([0, 1, 2], dtype=np.uint16)
    data = kernels.encode_weights(np.array([1.0, 2.0, 3.0], np.float32))
    csr = row_wise(indptr, indices, data, 3)
    table = kernels.ShardTable([kernels.BoundShard.bind(indptr, indices, data, 3)], [0], [csr])
    top = kernels.QueryTop(3, 1, 4, 20, 2, table.n_cols)
    assert top.run(table, {"a": 1.0}, {"a": 0}, 2, 2, ["a"]) == 2 and top.matched == [[("a", 3.0)], [("a", 2.0)]]
    csr[0][3] = 99  # the last row's end past the postings
    with pytest.raises(kernels.DamagedArrays):
        top.run(table, {"a": 1.0}, {"a": 0}, 2, 2, ["a"])
    assert np.all(top.slot_of == -1) and not np.any(top.member)  # left clean for the next query


IDENTITY = IndexIdentity("fp", 4, "tiny")


def test_the_backend_answers_through_it_with_the_same_hits(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "SHARD_ROWS", 16)  # 100 documents: seven shards
    rng = np.random.default_rng(11)
    docs = []
    for i in range(100):
        words = rng.choice(30, size=int(rng.integers(1, 8)), replace=False)
        docs.append(Document(id=f"d{i:03d}", path=f"/p/{i}.jpg", size_bytes=1, width=1, height=1,
                             sparse={TERMS[w]: float(rng.choice([0.5, 1.0, 1.5])) for w in words},
                             dense=rng.standard_normal(4).astype(np.float32)))
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    calls = []
    run = kernels.QueryTop.run
    monkeypatch.setattr(kernels.QueryTop, "run", lambda self, *a, **kw: calls.append(1) or run(self, *a, **kw))
    queries = [{TERMS[w]: float(rng.choice([0.4, 1.0, 2.0])) for w in rng.choice(32, size=5, replace=False)}
               for _ in range(20)]
    for explain in (0, 3):
        for k in (1, 7, 20, 21, 150):
            fast = [backend.sparse_search(q, k, explain=explain) for q in queries]
            assert len(calls) == len(queries)
            calls.clear()
            monkeypatch.setattr(kernels, "_c_query", None)
            slow = [backend.sparse_search(q, k, explain=explain) for q in queries]
            monkeypatch.undo()
            monkeypatch.setattr(cache_mod, "SHARD_ROWS", 16)
            monkeypatch.setattr(kernels.QueryTop, "run", lambda self, *a, **kw: calls.append(1) or run(self, *a, **kw))
            assert not calls
            for a, b in zip(fast, slow):
                assert [(h.id, h.score, h.path, h.matched) for h in a] == [(h.id, h.score, h.path, h.matched) for h in b]
    # hybrid: its sparse run (the candidates, k=100 here) through it too, the same fused hits
    from d2s_search.search import SearchOptions

    options = SearchOptions(mode="hybrid", k=5, explain=2)
    vector = rng.standard_normal(4).astype(np.float32)
    read = []  # the fused hits' words read in C too
    words_of = kernels.QueryTop.words_of
    monkeypatch.setattr(kernels.QueryTop, "words_of", lambda self, *a, **kw: read.append(1) or words_of(self, *a, **kw))
    fast = [backend.hybrid_search(q, vector, options) for q in queries]
    assert len(calls) == len(read) == len(queries)
    monkeypatch.setattr(kernels, "_c_query", None)
    slow = [backend.hybrid_search(q, vector, options) for q in queries]
    monkeypatch.setattr(kernels, "_c_query", kernels._load_c_module("_query"))
    for a, b in zip(fast, slow):
        assert [(h.id, h.score, h.matched, h.parts) for h in a] == [(h.id, h.score, h.matched, h.parts) for h in b]
    calls.clear()
    # shards searched in groups at once (threads, at least SPARSE_PARALLEL_FROM shards): one call
    # per group, each in its thread, merged; the same hits and words as one thread's
    one = [[backend.sparse_search(q, k, explain=3) for q in queries] for k in (1, 7, 21, 150)]
    one_hybrid = [backend.hybrid_search(q, vector, options) for q in queries]
    monkeypatch.setattr(kernels.QueryTop, "run",
                        lambda self, *a, **kw: calls.append(threading.current_thread().name) or run(self, *a, **kw))
    for threads in (2, 3):
        backend.threads = threads
        calls.clear()
        grouped = [[backend.sparse_search(q, k, explain=3) for q in queries] for k in (1, 7, 21, 150)]
        assert len(calls) == 4 * len(queries) * threads  # one call per group
        assert calls.count(threading.current_thread().name) == 4 * len(queries)  # the first group here
        for a, b in zip(sum(grouped, []), sum(one, [])):
            assert [(h.id, h.score, h.path, h.matched) for h in a] == [(h.id, h.score, h.path, h.matched) for h in b]
        grouped = [backend.hybrid_search(q, vector, options) for q in queries]
        for a, b in zip(grouped, one_hybrid):
            assert [(h.id, h.score, h.matched, h.parts) for h in a] == [(h.id, h.score, h.matched, h.parts) for h in b]
    backend.close()


def test_a_hits_word_pairs_cost_the_garbage_collector_nothing():
    """A k=1000 search's ~20,000 (word, value) pairs are made untracked: in no cycle, so the
    collector's passes, which a search's allocations set off, need not walk them."""
    import gc

    rng = np.random.default_rng(3)
    shards, starts = collection(rng, np.uint16, [300, 200])
    table = table_of(shards, starts)
    top = kernels.QueryTop(300, 2, 30, 1000, 30, table.n_cols)
    query = {TERMS[i]: 1.0 for i in range(30)}
    assert top.run(table, query, {t: i for i, t in enumerate(TERMS)}, 1000, 30, TERMS) > 100
    pairs = [pair for hit in top.matched for pair in hit]
    assert len(pairs) > 300 and not any(gc.is_tracked(pair) for pair in pairs)
    assert all(gc.is_tracked(hit) for hit in top.matched)  # the lists themselves stay tracked


def test_words_of_other_rows_equal_the_python_path():
    """Rows found otherwise (hybrid's fused hits): their words for the last search's query."""
    rng = np.random.default_rng(8)
    shards, starts = collection(rng, np.uint16, [90, 70, 40])
    table = table_of(shards, starts)
    term_ids = {t: i for i, t in enumerate(TERMS)}
    top = kernels.QueryTop(90, 3, 8)  # made without room for words: it makes it
    query = {TERMS[i]: float(rng.choice([0.5, 1.0, 2.0])) for i in rng.choice(70, size=12, replace=False)}
    assert top.run(table, query, term_ids, 5) is not None
    _, _, cols, weights = top.results()
    rows = rng.choice(200, size=40, replace=False)  # any rows, in any order, across the shards
    for words in (1, 4, 30):
        assert top.words_of(table, rows, words, TERMS) == words_of(shards, starts, rows, cols, weights, words)
    assert top.words_of(table, rows, 0, TERMS) is None
    with pytest.raises(kernels.DamagedArrays):
        top.words_of(table, np.array([200]), 3, TERMS)  # past the last shard
    assert np.all(top.slot_of == -1) and not np.any(top.member)


# Forms of one word among the test's terms: two pairs and a group of three (summed by math.fsum).
GROUPS = Inflections({"w0": "w0", "w1": "w0", "w2": "w2", "w3": "w2", "w4": "w2", "w5": "w5", "w7": "w5"})


def collapsed_by_the_plans(raws: list, collapser, shown: int) -> tuple[list, list]:
    """What search.collapse_matches makes of every matched term of each hit: the first ``shown``
    raw terms and the words (inflections.MatchWords.__call__, the reference)."""
    return [raw[:shown] for raw in raws], [collapser(raw, shown) for raw in raws]


def shown_exactly(got: tuple[list, list]) -> tuple[list, list]:
    """Words and matched terms to the bit: repr shows a float's every digit (and a zero's sign)."""
    matched, words = got
    assert all(type(word) is Word for hit in words for word in hit)
    return [repr(hit) for hit in matched], [repr(hit) for hit in words]


@pytest.mark.parametrize("seed", range(4))
def test_words_collapsed_as_the_rows_are_read_equal_the_plans_collapse_bit_for_bit(seed):
    """With ``collapse`` the search (and words_of, for rows found otherwise) hands back each
    hit's first ``shown`` terms and its words with inflections collapsed, made from every term
    it matched: what the plans made of the full list, ties and three-form sums included."""
    rng = np.random.default_rng(seed)
    sizes = [int(x) for x in rng.integers(20, 300, size=int(rng.integers(1, 4)))]
    shards, starts = collection(rng, np.uint16, sizes)
    table = table_of(shards, starts, (np.uint16, np.int32))
    term_ids = {t: i for i, t in enumerate(TERMS)}
    top = kernels.QueryTop(max(sizes), len(sizes), 40, 1000, 40, table.n_cols)
    for _ in range(12):
        chosen = np.concatenate([rng.choice(8, size=int(rng.integers(1, 9)), replace=False),
                                 rng.choice(np.arange(8, 70), size=int(rng.integers(0, 20)), replace=False)])
        query = {TERMS[i]: float(rng.choice([0.5, 1.0, 2.0, 0.3])) for i in chosen}  # ties on purpose
        collapser = GROUPS.matches(query)
        depth = len(query)  # every term a hit matched, as explain_depth asks when forms share a word
        for k in (1, 10, 21, 300):
            for shown in (1, 2, 5):
                assert top.run(table, query, term_ids, k, depth, TERMS) is not None
                want = collapsed_by_the_plans(top.matched, collapser, shown)
                found = top.found
                assert top.run(table, query, term_ids, k, depth, TERMS, collapse=collapser.compiled(shown)) == found
                assert shown_exactly((top.matched, top.words_shown)) == shown_exactly(want)
        rows = rng.choice(sum(sizes), size=60, replace=False)  # any rows, any order, across the shards
        raws = top.words_of(table, rows, depth, TERMS)
        for shown in (1, 3):
            got = top.words_of(table, rows, depth, TERMS, collapser.compiled(shown))
            assert shown_exactly(got) == shown_exactly(collapsed_by_the_plans(raws, collapser, shown))
        assert any(len(w.terms) == 3 for hit in top.words_of(table, rows, depth, TERMS, collapser.compiled(5))[1]
                   for w in hit) or not {"w2", "w3", "w4"} <= set(query)
    assert np.all(top.slot_of == -1) and not np.any(top.member)


def test_collapsed_words_by_hand_and_their_edges():
    import gc

    indptr = np.array([0, 1, 2, 3, 4], dtype=np.int32)  # one row holding w0 w1 w2 w6, weights 1
    shards = [((indptr, np.zeros(4, np.uint16), kernels.encode_weights(np.ones(4, np.float32)),
                *dense_columns(indptr, np.zeros(4, np.uint16), kernels.encode_weights(np.ones(4, np.float32)), 1)), 1)]
    table = table_of(shards, [0])
    term_ids = {"w0": 0, "w1": 1, "w2": 2, "w6": 3}
    query = {"w0": 0.75, "w1": 0.5, "w2": 1.0, "w6": 0.125}
    top = kernels.QueryTop(1, 1, 8, 20, 8, 4)
    terms = ["w0", "w1", "w2", "w6"]
    spec = GROUPS.matches(query).compiled(2)
    assert top.run(table, query, term_ids, 5, 4, terms, collapse=spec) == 1
    # raw: w2 1.0 leads; collapsed: w0 0.75 + w1 0.5 = 1.25 first, named by its strongest form
    raw, words = [("w2", 1.0), ("w0", 0.75)], [Word("w0", 1.25, ("w0", "w1")), Word("w2", 1.0, ("w2",))]
    assert (top.matched, top.words_shown) == ([raw], [words])
    assert not any(gc.is_tracked(w) or gc.is_tracked(w.terms) for w in top.words_shown[0])
    rows = np.array([0, 0])  # the same row twice, words_of for the last query
    assert top.words_of(table, rows, 4, terms, spec) == ([raw, raw], [words, words])
    assert gc.isenabled()  # paused while the words were made, on again after
    gc.disable()
    try:
        top.run(table, query, term_ids, 5, 4, terms, collapse=spec)
        assert not gc.isenabled()  # a caller's pause is left as it was
    finally:
        gc.enable()
    # a query with no known term: nothing matched, nothing collapsed
    assert top.run(table, {"nothing": 1.0}, term_ids, 5, 4, terms, collapse=spec) == 0
    assert (top.matched, top.words_shown) == ([], [])
    assert top.words_of(table, rows, 4, terms, spec) == ([[], []], [[], []])
    # a spec not of its shape is refused, and the buffers are left clean
    top.run(table, query, term_ids, 5, 4, terms)
    n, form_number, ends, word, fsum = spec
    for bad, error in [((0, form_number, ends, word, fsum), ValueError),
                       ((n, form_number, (2, 1), word, fsum), ValueError),
                       ((n, {"w0": 7, "w1": 1}, (2,), word, fsum), ValueError),
                       ((n, form_number, ends, dict, fsum), TypeError),
                       ((n, form_number), TypeError)]:
        with pytest.raises(error):
            top.words_of(table, rows, 4, terms, bad)
    assert np.all(top.slot_of == -1) and not np.any(top.member)
