"""The compiled shard kernel (``backends/local/_score.c``) against the numpy/scipy path:
bit-identical scores, the same top-k (ties by row), and damaged postings refused without
writing outside the score buffer."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.local import kernels
from d2s_search.backends.local.cache import dense_columns

pytestmark = pytest.mark.skipif(not kernels.c_kernel_loaded(),
                                reason="the C kernel was not built (no C compiler at install time)")


def random_shard(rng: np.random.Generator, rows: int, cols: int, per_row: int):
    """A CSC shard (int32 pointers and ids, 16-bit stored weights as the cache keeps them) with
    Zipf-like term popularity and weights drawn from few values, so equal scores (ties) occur."""
    popularity = 1.0 / np.arange(1, cols + 1)
    popularity /= popularity.sum()
    entries = {}
    for r in range(rows):
        for c in rng.choice(cols, size=min(per_row, cols), replace=False, p=popularity):
            entries[(int(c), r)] = np.float32(rng.choice([0.25, 0.3, 0.5, 1.0, 1.7]))
    keys = sorted(entries)
    indptr = np.zeros(cols + 1, dtype=np.int32)
    np.cumsum(np.bincount([c for c, _ in keys], minlength=cols), out=indptr[1:])
    indices = np.array([r for _, r in keys], dtype=np.int32)
    data = kernels.encode_weights(np.array([entries[k] for k in keys], dtype=np.float32))
    return indptr, indices, data


def numpy_path(indptr, indices, data, rows, cols, weights, k, terms=None, columns=None):
    out = np.empty(rows + 3, dtype=np.float32)
    kernels.accumulate(indptr, indices, data, rows, cols, weights, out, terms, columns, use_c=False)
    top = kernels.top_rows(out[:rows], k)
    return out[:rows].copy(), top, out[top]


@pytest.mark.parametrize("id_type", [np.uint16, np.int32])  # the cache's 16-bit in-shard ids, and int32
@pytest.mark.parametrize("seed", range(6))
def test_c_kernel_equals_the_numpy_path_bit_for_bit(seed, id_type):
    rng = np.random.default_rng(seed)
    rows, n_cols = int(rng.integers(50, 700)), 60
    indptr, indices, data = random_shard(rng, rows, n_cols, per_row=int(rng.integers(3, 15)))
    indices = indices.astype(id_type)
    terms, columns = dense_columns(indptr, indices, data, rows)
    assert terms.size  # the popular terms are stored as dense columns too
    for _ in range(10):
        cols = np.sort(rng.choice(n_cols + 5, size=int(rng.integers(1, 20)), replace=False)).astype(np.int64)
        weights = rng.choice([0.5, 1.0, 0.3, 2.0], size=cols.size).astype(np.float32)  # ids >= n_cols: newer terms
        for k in (1, 5, 10, 21, 30, 1000):  # above 20 (HEAP_K): the strided bound and selection
            for t, c in ((None, None), (terms, columns)):
                want_scores, want_rows, want_top = numpy_path(indptr, indices, data, rows, cols, weights, k, t, c)
                buffer = np.full(rows + 3, 7.0, dtype=np.float32)
                got_rows, got_top = kernels.shard_top(indptr, indices, data, rows, cols, weights, buffer, k, t, c)
                assert np.array_equal(buffer[:rows], want_scores)  # bit-identical, not just close
                assert np.all(buffer[rows:] == 7.0)  # nothing written past the shard
                assert got_rows.tolist() == want_rows.tolist()
                assert np.array_equal(got_top, want_top)
                assert np.all(got_top > 0)
                # the backend's path: the shard bound once, the query's buffers shared by its shards
                bound = kernels.BoundShard.bind(indptr, indices, data, rows, t, c)
                scratch = kernels.QueryScratch(cols, weights, rows + 3, 3, k)
                scratch.scores.fill(7.0)
                got_rows, got_top = bound.top(scratch, 2)  # the last shard's slot of the top buffers
                assert np.array_equal(scratch.scores[:rows], want_scores) and np.all(scratch.scores[rows:] == 7.0)
                assert got_rows.dtype == np.int64 and got_rows.tolist() == want_rows.tolist()
                assert np.array_equal(got_top, want_top)


def large_shard(rng: np.random.Generator, rows: int, cols: int, per_row: int):
    """A CSC shard of many rows, built vectorised: ids ascending in every list, as the cache
    stores them; ten terms on ~70% of the rows (dense columns) and Zipf-like popularity for the
    rest; few distinct weights, so that scores tie."""
    popularity = 1.0 / np.arange(1, cols + 1)
    popularity /= popularity.sum()
    row_of = np.repeat(np.arange(rows), per_row)
    col_of = rng.choice(cols, size=row_of.size, p=popularity)
    common = np.flatnonzero(rng.random((rows, 10)) < 0.7)  # terms 0-9 on ~70% of rows: dense columns
    row_of, col_of = np.concatenate([row_of, common // 10]), np.concatenate([col_of, common % 10])
    keys = np.unique(col_of.astype(np.int64) * rows + row_of)  # sorted by column, then row
    col_of, row_of = keys // rows, keys % rows
    indptr = np.zeros(cols + 1, dtype=np.int32)
    np.cumsum(np.bincount(col_of, minlength=cols), out=indptr[1:])
    weights = rng.choice(np.array([0.25, 0.3, 0.5, 1.0, 1.7], dtype=np.float32), size=keys.size)
    return indptr, row_of.astype(np.int32), kernels.encode_weights(weights)


@pytest.mark.parametrize("id_type", [np.uint16, np.int32])
@pytest.mark.parametrize("rows", [4097, 13_001])  # vector loops with a scalar tail
def test_c_kernel_equals_the_numpy_path_on_larger_shards(rows, id_type):
    """Thousands of rows, up to 150 query terms, runs of up to ten dense columns: whichever
    instruction set the kernel runs with (AVX2 when the CPU has it), every row's products are
    rounded and added in the query's term order, as the numpy path does (bit-identical)."""
    rng = np.random.default_rng(rows)
    n_cols = 300
    indptr, indices, data = large_shard(rng, rows, n_cols, per_row=12)
    indices = indices.astype(id_type)
    terms, columns = dense_columns(indptr, indices, data, rows)
    assert terms.size >= 10  # the common terms have dense columns
    for size in (1, 5, 24, 65, 150):
        common = rng.choice(10, size=min(size, int(rng.integers(1, 11))), replace=False)  # dense runs of 1-10
        rest = rng.choice(np.arange(10, n_cols + 5), size=size - common.size, replace=False)
        cols = np.sort(np.concatenate([common, rest])).astype(np.int64)
        weights = rng.choice([0.5, 1.0, 0.3, 2.0], size=cols.size).astype(np.float32)
        for t, c in ((None, None), (terms, columns)):
            for k in (10, 100, 1000):
                want_scores, want_rows, want_top = numpy_path(indptr, indices, data, rows, cols, weights, k, t, c)
                buffer = np.full(rows + 3, 7.0, dtype=np.float32)
                got_rows, got_top = kernels.shard_top(indptr, indices, data, rows, cols, weights, buffer, k, t, c)
                assert np.array_equal(buffer[:rows], want_scores)
                assert np.all(buffer[rows:] == 7.0)
                assert got_rows.tolist() == want_rows.tolist() and np.array_equal(got_top, want_top)


def test_runs_of_dense_columns_add_as_one_pass_per_column():
    """Consecutive dense terms are added in one pass over the scores, the first run writing them
    unzeroed: the same bits as a pass per column whatever stands around the run (a term with
    postings, one newer than the shard, nothing at all), every row written."""
    rng = np.random.default_rng(3)
    rows, n_cols = 5003, 300
    indptr, indices, data = large_shard(rng, rows, n_cols, per_row=12)
    indices = indices.astype(np.uint16)
    terms, columns = dense_columns(indptr, indices, data, rows)
    dense = terms[:6].tolist()
    sparse = [c for c in range(10, n_cols) if c not in set(terms.tolist())][:3]
    newer = [n_cols + 1, n_cols + 2]
    queries = [
        dense,  # one run longer than a pass takes, first: no zeroing at all
        dense[:1] + sparse[:1],  # a run of one, then postings
        sparse[:1] + dense[:5],  # postings first: zeroed, then a run
        dense[:2] + newer[:1],  # a newer term after the run
        newer,  # nothing this shard knows: zeros, still written
        [dense[0], dense[2], sparse[0], dense[3], dense[4], dense[5], sparse[1]],
    ]
    for cols in queries:
        cols = np.array(sorted(cols), dtype=np.int64)
        weights = rng.choice([0.5, 1.0, 0.3, 2.0, 1.7], size=cols.size).astype(np.float32)
        want_scores, want_rows, want_top = numpy_path(indptr, indices, data, rows, cols, weights, 10, terms, columns)
        buffer = np.full(rows + 3, 7.0, dtype=np.float32)
        got_rows, got_top = kernels.shard_top(indptr, indices, data, rows, cols, weights, buffer, 10, terms, columns)
        assert np.array_equal(buffer[:rows], want_scores) and np.all(buffer[rows:] == 7.0)
        assert got_rows.tolist() == want_rows.tolist() and np.array_equal(got_top, want_top)
        assert np.any(buffer[:rows]) == (cols.tolist() != newer)  # only the unknown terms score nothing


@pytest.mark.parametrize("seed", range(20))
def test_large_k_selection_equals_a_full_sort(seed):
    """The compiled top k for k above the heap's (a strided bound, then selection): against a
    full sort by (score descending, row), on scores with many ties, zeros and negatives, for k
    where the bound applies (n >= 16k), where it does not, and k at or above the rows."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 20_000))
    scores = rng.choice(np.array([0.0, -1.0, 0.5, 0.75, 1.0, 2.0, 3.5], dtype=np.float32), size=n)
    if seed % 2:
        scores = np.where(scores > 0, rng.random(n).astype(np.float32), scores)
    positive = np.flatnonzero(scores > 0)
    want = positive[np.lexsort((positive, -scores[positive]))]
    for k in {21, 50, 100, 1000, max(21, n // 16), n, n + 5}:
        cand = np.empty(4 * n, dtype=np.int32)
        maxima = np.empty(n // 4 + 1, dtype=np.float32)
        rows, top = np.empty(k, dtype=np.int32), np.empty(k, dtype=np.float32)
        got = kernels._c_kernel[3](scores.ctypes.data, n, k, cand.ctypes.data, maxima.ctypes.data, rows.ctypes.data,
                                   top.ctypes.data)
        assert rows[:got].tolist() == want[:k].tolist() and np.array_equal(top[:got], scores[want[:k]])
        assert kernels.top_rows(scores, k).tolist() == want[:k].tolist()  # the numpy path agrees


def test_top_k_keeps_the_earliest_row_among_equal_scores():
    indptr = np.array([0, 6], dtype=np.int32)
    indices = np.array([0, 1, 2, 3, 4, 5], dtype=np.int32)
    data = kernels.encode_weights(np.array([1.0, 2.0, 1.0, 2.0, 2.0, 0.0], dtype=np.float32))
    buffer = np.empty(6, dtype=np.float32)
    rows, scores = kernels.shard_top(indptr, indices, data, 6, np.array([0]), np.array([1.0], np.float32), buffer, 4)
    assert rows.tolist() == [1, 3, 4, 0] and scores.tolist() == [2.0, 2.0, 2.0, 1.0]
    rows, _ = kernels.shard_top(indptr, indices, data, 6, np.array([0]), np.array([1.0], np.float32), buffer, 10)
    assert rows.tolist() == [1, 3, 4, 0, 2]  # zero scores are not hits
    rows, _ = kernels.shard_top(indptr, indices, data, 6, np.array([0]), np.array([1.0], np.float32), buffer, 0)
    assert rows.size == 0


@pytest.mark.parametrize("damage, id_type", [
    (damage, id_type) for id_type in (np.uint16, np.int32)
    for damage in ("id too large", "negative id", "pointer past the end", "pointer backwards")
    if not (damage == "negative id" and id_type == np.uint16)  # 16-bit ids are unsigned
])
def test_damaged_postings_are_refused_without_writing_out_of_bounds(damage, id_type):
    indptr = np.array([0, 2, 4], dtype=np.int32)
    indices = np.array([0, 1, 1, 2], dtype=id_type)
    data = kernels.encode_weights(np.ones(4, dtype=np.float32))
    if damage == "id too large":
        indices[1] = 3
    elif damage == "negative id":
        indices[1] = -5
    elif damage == "pointer past the end":
        indptr[2] = 900
    else:
        indptr[1] = 5
    guard = np.full(8, 9.0, dtype=np.float32)
    buffer = guard[2:5]  # rows 0-2 of the shard inside a larger block: the guards must stay
    with pytest.raises(kernels.DamagedArrays):
        kernels.shard_top(indptr, indices, data, 3, np.array([0, 1]), np.ones(2, np.float32), buffer, 3)
    assert np.all(guard[:2] == 9.0) and np.all(guard[5:] == 9.0)
    # bound once, the same checks on every call
    scratch = kernels.QueryScratch(np.array([0, 1]), np.ones(2, np.float32), 3, 1, 3)
    scratch.scores = guard[2:5]
    scratch._ptrs = (*scratch._ptrs[:2], scratch.scores.ctypes.data, *scratch._ptrs[3:])
    with pytest.raises(kernels.DamagedArrays):
        kernels.BoundShard.bind(indptr, indices, data, 3).top(scratch, 0)
    assert np.all(guard[:2] == 9.0) and np.all(guard[5:] == 9.0)


def test_a_bound_shard_knows_when_its_arrays_were_replaced():
    rng = np.random.default_rng(5)
    indptr, indices, data = random_shard(rng, 200, 30, per_row=6)
    bound = kernels.BoundShard.bind(indptr, indices, data, 200)
    assert bound.bound_to(indptr, indices, data, 200)
    assert not bound.bound_to(indptr.copy(), indices, data, 200)  # equal values, other memory
    assert not bound.bound_to(indptr, indices, data, 199)
    # buffers too small for the shard are refused before any C call writes into them
    with pytest.raises(kernels.DamagedArrays):
        bound.top(kernels.QueryScratch(np.array([0]), np.ones(1, np.float32), 199, 1, 5), 0)
    with pytest.raises(kernels.DamagedArrays):
        bound.top(kernels.QueryScratch(np.array([0]), np.ones(1, np.float32), 200, 1, 5), 1)
    # arrays the kernel cannot read raw are not bound (the numpy path takes them)
    assert kernels.BoundShard.bind(indptr, indices.astype(np.int64), data, 200) is None
    assert kernels.BoundShard.bind(indptr, indices, np.repeat(data, 2)[::2], 200) is None


def test_arrays_the_kernel_cannot_read_take_the_numpy_path():
    """A strided view or another dtype is not raw memory the C kernel may walk: same answer."""
    rng = np.random.default_rng(3)
    indptr, indices, data = random_shard(rng, 300, 40, per_row=8)
    cols, weights = np.arange(0, 40, 3, dtype=np.int64), np.full(14, 0.5, dtype=np.float32)
    want_scores, want_rows, _ = numpy_path(indptr, indices, data, 300, cols, weights, 10)
    strided = np.repeat(data, 2)[::2]
    assert not strided.flags.c_contiguous
    for ids, weights_ in ((indices, strided), (indices.astype(np.int64), data)):
        buffer = np.empty(300, dtype=np.float32)
        rows, _ = kernels.shard_top(indptr, ids, weights_, 300, cols, weights, buffer, 10)
        assert rows.tolist() == want_rows.tolist() and np.array_equal(buffer, want_scores)



def test_stored_weights_are_lucenes_feature_field_values():
    # 0.3f = 0x3E99999A; >>> 15 = 0x7D33 (32051); << 15 = 0x3E998000 = 0.2998046875 (worked by hand)
    stored = kernels.encode_weights(np.array([0.3, 1.0, 2.5, 64.0], dtype=np.float32))
    assert stored.dtype == np.uint16 and stored.tolist() == [0x7D33, 0x7F00, 0x8040, 0x8500]
    assert kernels.decode_weights(stored).tolist() == [0.2998046875, 1.0, 2.5, 64.0]
    # what cannot score is stored as 0; infinity as the largest float32 (truncated)
    odd = kernels.encode_weights(np.array([0.0, -1.0, np.nan, 1e-40, np.inf], dtype=np.float32))
    assert odd.tolist() == [0, 0, 0, 0, 0xFEFF]
    # the same value OpenSearch scores with (FeatureField), for many random weights
    from d2s_search.backends.opensearch.features import lucene_feature_value

    values = np.random.default_rng(0).lognormal(0, 2, size=500).astype(np.float32)
    decoded = kernels.decode_weights(kernels.encode_weights(values))
    assert decoded.tolist() == [lucene_feature_value(float(v)) for v in values]
    assert np.all(decoded <= values) and np.all(decoded >= values * (1 - 2**-8))


@pytest.mark.parametrize("seed", range(4))
def test_merging_shards_ranks_by_score_then_row(seed):
    """Per-shard lists (as the shards give them, or shuffled as a graph may) merge into the
    global order: score descending, then row; ties across shards included."""
    rng = np.random.default_rng(seed)
    candidates = []
    for start in (0, 1000, 2000):
        rows = start + rng.choice(1000, size=60, replace=False)
        scores = rng.integers(0, 8, size=60).astype(np.float32) / 4  # many ties
        if seed % 2:
            order = np.lexsort((rows, -scores))
            rows, scores = rows[order], scores[order]
        candidates.append((rows.astype(np.int64), scores))
    rows = np.concatenate([r for r, _ in candidates])
    scores = np.concatenate([s for _, s in candidates])
    expected = sorted(zip((-scores).tolist(), rows.tolist()))[:25]
    got_rows, got_scores = kernels.merge_top(candidates, 25)
    assert list(zip((-got_scores).tolist(), got_rows.tolist())) == expected
    distinct = [(r, np.arange(r.size, dtype=np.float32)[::-1].copy()) for r in (np.arange(3), np.arange(3, 6))]
    assert kernels.merge_top(distinct, 4)[0].tolist() == [0, 3, 1, 4]


@pytest.mark.parametrize("k", [1, 25, 59, 60, 200])
def test_selecting_the_top_of_unranked_shard_lists_equals_ranking_every_row(k):
    """A scan's shards hand on every row at least their k-th score, unranked
    (rows_at_least_kth); select_top ranks them once: score descending, then row, ties at the
    k-th kept in every shard so none is lost to another shard's order."""
    rng = np.random.default_rng(k)
    candidates, every = [], []
    for start in (0, 1000, 2000):
        scores = rng.integers(0, 6, size=60).astype(np.float32) / 4  # many ties, across shards too
        rows = kernels.rows_at_least_kth(scores, k)
        assert np.all(np.diff(rows) > 0) and rows.size >= min(k, 60)
        assert np.all(scores[rows] >= np.sort(scores)[::-1][min(k, 60) - 1])
        candidates.append((rows + start, scores[rows]))
        every += [(-float(v), start + i) for i, v in enumerate(scores)]
    got_rows, got_scores = kernels.select_top(candidates, k)
    assert list(zip((-got_scores).tolist(), got_rows.tolist())) == sorted(every)[:k]
    assert kernels.select_top([], k)[0].size == 0


@pytest.mark.parametrize("sizes", [(0,), (0, 0), (5, 0), (1, 1), (300, 250), (10, 10, 10)])
def test_the_union_of_fused_runs_and_their_places_equal_unique_and_searchsorted(sizes):
    """A hybrid's fused rows: every run's rows once, ascending, and where each run's rows sit
    in them, as np.unique of them all and np.searchsorted per run give it (overlapping runs,
    a row twice within a run, empty runs)."""
    rng = np.random.default_rng(sum(sizes) + len(sizes))
    parts = [rng.integers(0, 400, size=n).astype(np.int64) for n in sizes]
    rows, places = kernels.union_positions(parts)
    want = np.unique(np.concatenate(parts))
    assert rows.dtype == np.int64 and rows.tolist() == want.tolist()
    assert [p.tolist() for p in places] == [np.searchsorted(want, part).tolist() for part in parts]
    assert all(np.array_equal(rows[at], part) for at, part in zip(places, parts))
    assert kernels.union_positions([])[0].size == 0


def test_strings_copied_out_in_one_block_equal_one_by_one():
    """The strided gather of the hits' strings: ASCII, UTF-8, a non-UTF-8 name kept as
    surrogates, empty strings, rows at the blob's very end; a lone long string falls back."""
    from d2s_search.backends.local.cache import strided_strings, string_arrays

    rng = np.random.default_rng(0)
    kinds = ["/photos/{}.jpg", "/é/ß{}.jpg", "", "/raw/\udcff{}.jpg", "日本/{}.png", "x"]
    texts = [kinds[i % len(kinds)].format(i) for i in range(400)]
    blob, offsets = string_arrays(texts)
    for rows in (np.array([399, 0, 398, 2]), rng.choice(400, size=150, replace=False), np.arange(400)):
        got = strided_strings(blob, offsets[rows], offsets[rows + 1] - offsets[rows])
        assert got == [texts[r] for r in rows]
    long = np.frombuffer(b"a" * 500 + b"bc", dtype=np.uint8)
    assert strided_strings(long, np.array([0, 500, 501]), np.array([500, 1, 1])) is None
    assert strided_strings(blob, np.array([2, 2]), np.array([0, 0])) == ["", ""]


def without_c_kernel(kernel, *args):
    """``kernel(*args)`` with the compiled kernel turned off: the numpy path's answer."""
    saved, kernels._c_kernel = kernels._c_kernel, None
    try:
        return kernel(*args)
    finally:
        kernels._c_kernel = saved


def numpy_explain(*args):
    return without_c_kernel(kernels.explain_rows, *args)


def row_wise(indptr, indices, data, rows, id_type=np.int32):
    """The CSR (row-wise) copy of a CSC shard, as the cache keeps it: int64 pointers, term ids
    of ``id_type`` (16 bits when the shard's columns fit, else 32)."""
    cols = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    order = np.lexsort((cols, indices))
    csr_indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(indices, minlength=rows), out=csr_indptr[1:])
    return csr_indptr, cols[order].astype(id_type), data[order]


def random_row_reads(rng, id_type, most_rows: int | None = None, queries: int = 10):
    """A random shard's row-wise copy (term ids of ``id_type``) with, per query, rows picked in
    any order (up to ``most_rows``, else any number) and query columns in any order, some of
    them no row has: (csr, picked rows, columns)."""
    rows, n_cols = int(rng.integers(30, 300)), 50
    indptr, indices, data = random_shard(rng, rows, n_cols, per_row=int(rng.integers(3, 20)))
    csr = row_wise(indptr, indices, data, rows, id_type)
    for _ in range(queries):
        cols = rng.choice(n_cols + 5, size=int(rng.integers(1, 25)), replace=False).astype(np.int64)
        picked = rng.choice(rows, size=int(rng.integers(1, most_rows or rows)), replace=False)
        yield csr, picked, cols


@pytest.mark.parametrize("id_type", [np.int32, np.uint16])
@pytest.mark.parametrize("seed", range(5))
def test_explained_words_equal_the_numpy_path(seed, id_type):
    """Each row's n largest query weight * stored weight, largest first, ties by column (the
    weights come from few values, so ties occur); the query's columns in any order; term ids
    of 32 or 16 bits."""
    rng = np.random.default_rng(seed)
    for csr, picked, cols in random_row_reads(rng, id_type, most_rows=12):
        weights = rng.choice([0.5, 1.0, 0.3, 2.0], size=cols.size).astype(np.float32)
        for n in (1, 3, 5, 40):
            got = kernels.explain_rows(*csr, picked, cols, weights, n)
            want = numpy_explain(*csr, picked, cols, weights, n)
            assert got == want
            assert all(len(terms) <= n for terms in got)
    assert any(got)  # the queries did match something


def test_explanations_by_hand_and_damaged_rows():
    # row 0: terms 2 (0.5), 7 (1.0), 9 (2.0); row 1: term 7 (0.25); row 2: nothing
    indptr = np.array([0, 3, 4, 4], dtype=np.int64)
    indices = np.array([2, 7, 9, 7], dtype=np.int32)
    data = kernels.encode_weights(np.array([0.5, 1.0, 2.0, 0.25], dtype=np.float32))
    cols, weights = np.array([9, 2, 7], dtype=np.int64), np.array([0.5, 2.0, 1.0], dtype=np.float32)
    got = kernels.explain_rows(indptr, indices, data, np.array([0, 1, 2]), cols, weights, 2)
    # row 0: 9 -> 0.5*2.0 = 1.0, 2 -> 2.0*0.5 = 1.0, 7 -> 1.0: a three-way tie, the smaller columns first
    assert got == [[(2, 1.0), (7, 1.0)], [(7, 0.25)], []]
    short = indices.astype(np.uint16)  # 16-bit term ids: the same words
    assert kernels.explain_rows(indptr, short, data, np.array([0, 1, 2]), cols, weights, 2) == got
    assert_damaged_rows_refused(kernels.explain_rows, indptr, indices, data, cols, weights)
    assert_damaged_rows_refused(kernels.explain_rows, indptr, short, data, cols, weights)


def assert_damaged_rows_refused(explain, indptr, indices, data, cols, weights):
    """Row 1's end moved past the postings, and a row past the shard (of 3): DamagedArrays."""
    broken = indptr.copy()
    broken[2] = 99
    with pytest.raises(kernels.DamagedArrays):
        explain(broken, indices, data, np.array([1]), cols, weights, 2)
    with pytest.raises(kernels.DamagedArrays):
        explain(indptr, indices, data, np.array([3]), cols, weights, 2)


def test_a_query_column_given_twice_is_explained_as_the_numpy_path_does():
    indptr = np.array([0, 2], dtype=np.int64)
    indices = np.array([3, 5], dtype=np.int32)
    data = kernels.encode_weights(np.array([1.0, 2.0], dtype=np.float32))
    cols, weights = np.array([5, 3, 5], dtype=np.int64), np.array([1.0, 0.5, 4.0], dtype=np.float32)
    got = kernels.explain_rows(indptr, indices, data, np.array([0]), cols, weights, 3)
    assert got == numpy_explain(indptr, indices, data, np.array([0]), cols, weights, 3) == [[(5, 2.0), (3, 0.5)]]



def numpy_rescore(*args):
    return without_c_kernel(kernels.rescore_rows, *args)


@pytest.mark.parametrize("id_type", [np.int32, np.uint16])
@pytest.mark.parametrize("seed", range(5))
def test_rescored_rows_equal_the_numpy_path_bit_for_bit(seed, id_type):
    """A window's exact scores read from its rows' own postings in C: the same float32 bits as
    the numpy path (float32 products summed in float64 in the row's order), for rows in any
    order, a query's columns in any order and some no row has."""
    assert kernels._c_kernel is not None, "the compiled kernel is part of the build under test"
    rng = np.random.default_rng(seed)
    for csr, picked, cols in random_row_reads(rng, id_type):
        weights = rng.random(cols.size).astype(np.float32) * 3
        got = kernels.rescore_rows(*csr, picked, cols, weights)
        want = numpy_rescore(*csr, picked, cols, weights)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.any(got > 0)


def test_rescored_rows_by_hand_damaged_rows_and_a_column_given_twice():
    # row 0: terms 2 (0.5), 7 (1.0), 9 (2.0); row 1: term 7 (0.25); row 2: nothing
    indptr = np.array([0, 3, 4, 4], dtype=np.int64)
    indices = np.array([2, 7, 9, 7], dtype=np.int32)
    data = kernels.encode_weights(np.array([0.5, 1.0, 2.0, 0.25], dtype=np.float32))
    cols, weights = np.array([9, 2, 7], dtype=np.int64), np.array([0.5, 2.0, 1.0], dtype=np.float32)
    for ids in (indices, indices.astype(np.uint16)):
        got = kernels.rescore_rows(indptr, ids, data, np.array([2, 0, 1]), cols, weights)
        assert got.tolist() == [0.0, 0.5 * 2.0 + 2.0 * 0.5 + 1.0 * 1.0, 0.25]
        assert_damaged_rows_refused(lambda *a: kernels.rescore_rows(*a[:-1]), indptr, ids, data, cols, weights)
    # a column given twice: the C kernel declines, the numpy path takes the first of the sorted pair
    twice, twice_weights = np.array([7, 2, 7], dtype=np.int64), np.array([1.0, 2.0, 4.0], dtype=np.float32)
    got = kernels.rescore_rows(indptr, indices, data, np.array([0]), twice, twice_weights)
    assert got.tolist() == numpy_rescore(indptr, indices, data, np.array([0]), twice, twice_weights).tolist() == [2.0]


@pytest.mark.parametrize("id_type", [np.int32, np.uint16])
@pytest.mark.parametrize("seed", range(6))
def test_explanation_slots_read_row_wise_equal_the_numpy_path_through_the_lists(seed, id_type):
    """Many hits' words as slots and values: read in C from the rows' own postings (each column
    looked up in a table of the query's) they equal numpy's searches through the query's lists,
    dense columns included: the same slots and float32 products in the same order (ties by slot,
    then the zero-valued slots in order), for rows in any order, n above the query's length,
    terms newer than the shard, and term ids of 32 or 16 bits."""
    rng = np.random.default_rng(seed)
    rows, n_cols = int(rng.integers(200, 3000)), 60
    indptr, indices, data = random_shard(rng, rows, n_cols, per_row=int(rng.integers(3, 15)))
    indices = indices.astype(np.uint16)  # the cache's in-shard ids
    terms, columns = dense_columns(indptr, indices, data, rows)
    assert terms.size
    csr = row_wise(indptr, indices, data, rows, id_type)
    for _ in range(8):
        cols = np.sort(rng.choice(n_cols + 5, size=int(rng.integers(1, 30)), replace=False)).astype(np.int64)
        weights = rng.choice([0.5, 1.0, 0.3, 2.0], size=cols.size).astype(np.float32)
        picked = rng.choice(rows, size=int(rng.integers(1, min(rows, 700))), replace=False)
        for n in (1, 5, 40):
            got = kernels.explain_slots(*csr, picked, cols, weights, n)
            assert got is not None  # the compiled call took these arrays
            for extra in ((None, None), (terms, columns)):
                want = kernels.explain_by_postings(indptr, indices, data, picked, cols, weights, n, *extra)
                assert got[0].shape == want[0].shape == (picked.size, min(n, cols.size))
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert np.any(got[1] > 0)


def test_explanation_slots_by_hand_and_damage():
    # row 0: terms 2 (0.5), 7 (1.0), 9 (2.0); row 1: term 7 (0.25); row 2: nothing
    indptr = np.array([0, 3, 4, 4], dtype=np.int64)
    indices = np.array([2, 7, 9, 7], dtype=np.int32)
    data = kernels.encode_weights(np.array([0.5, 1.0, 2.0, 0.25], dtype=np.float32))
    cols, weights = np.array([2, 7, 9, 11], dtype=np.int64), np.array([2.0, 1.0, 0.5, 1.0], dtype=np.float32)
    slots, values = kernels.explain_slots(indptr, indices, data, np.array([0, 2, 1]), cols, weights, 3)
    # row 0: 2 -> 2.0*0.5 = 1.0, 7 -> 1.0, 9 -> 0.5*2.0 = 1.0: a three-way tie in slot order;
    # row 2: nothing, the first three slots at zero; row 1: 7 -> 0.25, then slots 0 and 2 at zero
    assert slots.tolist() == [[0, 1, 2], [0, 1, 2], [1, 0, 2]]
    assert values.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.25, 0.0, 0.0]]
    short = indices.astype(np.uint16)  # 16-bit term ids: the same slots and values
    got16 = kernels.explain_slots(indptr, short, data, np.array([0, 2, 1]), cols, weights, 3)
    assert np.array_equal(got16[0], slots) and np.array_equal(got16[1], values)
    assert_damaged_rows_refused(kernels.explain_slots, indptr, indices, data, cols, weights)
    assert_damaged_rows_refused(kernels.explain_slots, indptr, short, data, cols, weights)
    # columns out of order, given twice or past any vocabulary, ids of another type, a weight that is
    # not finite and positive (numpy sorts its products elsewhere): not taken
    assert kernels.explain_slots(indptr, indices, data, np.array([0]), cols[::-1].copy(), weights, 2) is None
    assert kernels.explain_slots(indptr, indices, data, np.array([0]), np.array([2, 2]), weights[:2], 2) is None
    assert kernels.explain_slots(indptr, indices, data, np.array([0]), np.array([2, 1 << 40]), weights[:2], 2) is None
    assert kernels.explain_slots(indptr, indices.astype(np.int64), data, np.array([0]), cols, weights, 2) is None
    for odd in (np.nan, np.inf, -1.0):
        assert kernels.explain_slots(indptr, indices, data, np.array([0]), cols,
                                     np.array([2.0, odd, 1.0, 1.0], dtype=np.float32), 2) is None
