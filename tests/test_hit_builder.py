"""The compiled hit builder (``backends/local/_hits.c``) against the Python path: the same
hits (ids, scores, paths, URLs, explained words) for any rows across shards, names that are
not UTF-8 included; and arrays that do not hold together refused with ValueError, never
read out of bounds."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.base import Hit
from d2s_search.backends.local import LocalBackend, cache, kernels
from tests.helpers import brute_force_sparse
from tests.reliability.local_index_fixtures import IDENTITY, VOCAB, synthetic_docs, warning_lines

pytestmark = pytest.mark.skipif(kernels._c_hits is None,
                                reason="the C hit builder was not built (no C compiler at install time)")

NAMES = ["/photos/{}.jpg", "/é/ß{}.jpg", "日本/{}.png", ""]


@pytest.fixture
def backend(tmp_path, monkeypatch):
    """40 documents in shards of 16 rows, read back from the cache files, with ids, paths and
    URLs of every kind (non-ASCII, empty paths, URLs on a third)."""
    monkeypatch.setattr(cache, "SHARD_ROWS", 16)
    docs = synthetic_docs(40, seed=3)
    for i, doc in enumerate(docs):
        doc.path = NAMES[i % len(NAMES)].format(i)
        if i % 7 == 0:
            doc.id = f"id-\u00e9-{i}"
    first = LocalBackend(tmp_path / "idx")
    first.open(IDENTITY)
    first.upsert(docs)
    first.sparse_search({"w1": 1.0}, 5)  # writes the cache
    first.close()
    reopened = LocalBackend(tmp_path / "idx")
    reopened.open(None, create=False)
    reopened.docs = docs
    yield reopened
    reopened.close()


def python_hits(backend, state, rows, scores, query, explain, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(kernels, "_c_hits", None)
        return backend._hits(state, rows, scores, query, explain)


@pytest.mark.parametrize("by_postings", [False, True])  # explained from the rows' own postings / the query's lists
@pytest.mark.parametrize("explain", [0, 3])
def test_compiled_hits_equal_the_python_path(backend, monkeypatch, explain, by_postings):
    from d2s_search.backends.local import backend as backend_mod

    if by_postings:
        monkeypatch.setattr(backend_mod, "EXPLAIN_BY_POSTINGS_FROM", 1)
    state = backend._search_state()
    assert len(state.shards) == 3
    query = backend._query_columns({w: 1.0 + i / 10 for i, w in enumerate(VOCAB[:12])})
    rng = np.random.default_rng(0)
    for rows in (np.array([39]), np.array([0, 16, 32, 15, 31]), rng.permutation(40), rng.choice(40, 20, replace=False)):
        scores = rng.uniform(0, 5, rows.size).astype(np.float32)
        got = backend._hits(state, rows, scores, query, explain)
        want = python_hits(backend, state, rows, scores, query, explain, monkeypatch)
        assert got == want
        assert [h.score for h in got] == np.asarray(scores, dtype=np.float64).tolist()
        if explain:
            assert all(len(h.matched) <= explain for h in got) and sum(len(h.matched) for h in got) > rows.size
    assert any("日本" in h.path for h in got) and any(h.url for h in got) and any(h.url is None for h in got)


def test_compiled_hits_behave_as_hits(backend):
    hit = backend._hits(backend._search_state(), np.array([2]), np.array([1.5], np.float32), {}, 0)[0]
    assert type(hit) is Hit and hit.matched == [] and hit.parts == {}
    hit.parts["dense"] = 0.5
    hit.matched = [("w1", 1.0)]
    assert hit.to_json()["parts"] == {"dense": 0.5} and hit.to_json()["matched"] == [{"term": "w1", "contribution": 1.0}]
    with pytest.raises(AttributeError):
        hit.other = 1  # still slotted


def sources(strings: list[str], urls: dict[int, str] | None = None, start: int = 0):
    urls = urls or {}
    ids, id_off = cache.string_arrays([f"id{i}" for i in range(len(strings))])
    paths, path_off = cache.string_arrays(strings)
    url_blob, url_off = cache.string_arrays([urls.get(i, "") for i in range(len(strings))])
    has_url = np.array([i in urls for i in range(len(strings))], dtype=np.bool_)
    return (start, len(strings), ids, id_off, paths, path_off, url_blob, url_off, has_url)


def build(rows, scores, shard_rows, srcs, matched=None):
    return kernels._c_hits.build(Hit, np.asarray(rows, dtype=np.int64), np.asarray(scores, dtype=np.float64),
                                 shard_rows, tuple(srcs), matched)


def test_built_by_hand():
    srcs = [sources(["a", "é"], {1: "https://x/1"}), sources(["\udcff", ""], start=4)]
    hits = build([5, 1, 4, 0], [4.0, 3.0, 2.0, 1.0], 4, srcs, [[("w", 1.0)], [], None, [("v", 2.0)]])
    assert [(h.id, h.score, h.path, h.url) for h in hits] == [
        ("id1", 4.0, "", None), ("id1", 3.0, "é", "https://x/1"), ("id0", 2.0, "\udcff", None), ("id0", 1.0, "a", None)]
    assert [h.matched for h in hits] == [[("w", 1.0)], [], [], [("v", 2.0)]]
    assert build([], [], 4, srcs) == []
    # the first count rows of longer buffers (reused query after query); rows past them are not read
    rows, scores = np.array([5, 1, -7], np.int64), np.array([4.0, 3.0, 9.0])
    hits = kernels._c_hits.build(Hit, rows, scores, 4, tuple(srcs), None, 2)
    assert [(h.id, h.score) for h in hits] == [("id1", 4.0), ("id1", 3.0)]
    assert kernels._c_hits.build(Hit, rows, scores, 4, tuple(srcs), None, 0) == []
    with pytest.raises(ValueError):  # more than the buffers hold, or matched of another length
        kernels._c_hits.build(Hit, rows, scores, 4, tuple(srcs), None, 4)
    with pytest.raises(ValueError):
        kernels._c_hits.build(Hit, rows, scores, 4, tuple(srcs), [[]], 2)


def test_explained_lists_by_hand_and_refused():
    out = [[], [], []]
    slots = np.array([[1, 0, 0], [2, 1, 0]], dtype=np.int64)
    values = np.array([[2.5, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    kernels._c_hits.explained(out, np.array([2, 0]), ("a", "b", "c"), slots, values)
    assert out == [[], [], [("b", 2.5), ("a", 1.0)]]
    for picked, bad_slots, bad_values in ((np.array([3, 0]), slots, values), (np.array([0, 1]), slots + 2, values + 1),
                                          (np.array([0]), slots, values), (np.array([0, 1]), slots, values.astype(np.float64))):
        with pytest.raises(ValueError):
            kernels._c_hits.explained([[], [], []], picked, ("a", "b", "c"), bad_slots, bad_values)


def test_arrays_that_do_not_hold_together_are_refused():
    good = sources(["a", "bb", "ccc"])
    bad_offsets = list(good)
    bad_offsets[5] = np.array([0, 1, 99, 6], dtype=np.int64)  # past the blob's end
    backwards = list(good)
    backwards[5] = np.array([0, 3, 1, 6], dtype=np.int64)
    short = list(good)
    short[5] = np.array([0, 1], dtype=np.int64)  # fewer offsets than rows + 1
    short_flags = list(good)
    short_flags[8] = np.zeros(1, dtype=np.bool_)
    for src, rows in ((bad_offsets, [1]), (backwards, [1]), (short, [0]), (short_flags, [0]),
                      (good, [3]), (good, [-1]), (good, [8]), (good, [4])):
        with pytest.raises(ValueError):
            build(rows, [1.0] * len(rows), 4, [tuple(src)])
    with pytest.raises(ValueError):  # int32 rows, or scores of another length
        kernels._c_hits.build(Hit, np.zeros(2, np.int32), np.zeros(2), 4, (good,), None)
    with pytest.raises(TypeError):  # a shard's strings must be a tuple
        kernels._c_hits.build(Hit, np.zeros(1, np.int64), np.zeros(1), 4, (list(good),), None)
    with pytest.raises(ValueError):
        build([0, 1], [1.0], 4, [good])
    with pytest.raises(ValueError):
        build([0, 1], [1.0, 2.0], 4, [good], [[]])
    with pytest.raises(TypeError):
        kernels._c_hits.build(dict, np.zeros(1, np.int64), np.zeros(1), 4, (good,), None)


def test_string_offsets_damaged_after_validation_rebuild_the_cache(backend, capsys):
    query = {w: 1.0 + i / 40 for i, w in enumerate(VOCAB)}
    backend.sparse_search(query, 5)  # every shard validated
    state = backend._search_state()
    shard = state.shards[1]
    damaged = shard.arrays["paths_offsets"].copy()
    damaged[5] = 1 << 40
    shard.arrays["paths_offsets"] = damaged  # as if the file changed under the memory map
    state._hit_sources = None
    hits = backend.sparse_search(query, 40, explain=0)
    by_id = {d.id: d for d in backend.docs}
    assert [h.id for h in hits] == [doc_id for doc_id, _ in brute_force_sparse(backend.docs, query)]
    assert [(h.path, h.url) for h in hits] == [(by_id[h.id].path, by_id[h.id].url) for h in hits]
    (line,) = warning_lines(capsys.readouterr().err)
    assert "unusable" in line and "outside their blob" in line


@pytest.mark.parametrize("seed", range(6))
def test_merging_shards_in_c_equals_the_numpy_merge(seed, monkeypatch):
    """The k-way merge of the shards' lists (each best first, ties by row): the numpy merge's
    result for any k, ties across shards included; lists it cannot take are left to numpy (-1)."""
    rng = np.random.default_rng(seed)
    candidates = []
    for start in range(0, 1000 * int(rng.integers(1, 6)), 1000):
        rows = start + rng.choice(1000, size=int(rng.integers(0, 80)), replace=False)
        scores = (rng.integers(-4, 8, size=rows.size) / 4).astype(np.float32)  # ties, and negatives (inner products)
        order = np.lexsort((rows, -scores))
        candidates.append((rows[order].astype(np.int64), scores[order]))
    total = sum(r.size for r, _ in candidates)
    for k in (1, 10, 25, total, total + 3):
        with monkeypatch.context() as m:
            m.setattr(kernels, "_c_hits", None)
            want_rows, want_scores = kernels.merge_top(candidates, k)
        out_rows, out_scores = np.empty(k, np.int64), np.empty(k, np.float32)
        n = kernels._c_hits.merge(candidates, k, out_rows, out_scores)
        assert n == want_rows.size and out_rows[:n].tolist() == want_rows.tolist()
        assert np.array_equal(out_scores[:n], want_scores)
        got_rows, _ = kernels.merge_top(candidates, k)
        assert got_rows.tolist() == want_rows.tolist()
    rows, scores = candidates[0] if candidates[0][0].size > 1 else (np.array([1, 2]), np.array([1.0, 1.0], np.float32))
    out = np.empty(5, np.int64), np.empty(5, np.float32)
    assert kernels._c_hits.merge([(rows[::-1].copy(), scores[::-1].copy())], 5, *out) == -1  # not best first
    assert kernels._c_hits.merge([(np.array([3, 4]), np.array([2.0, np.nan], np.float32))], 5, *out) == -1
    assert kernels._c_hits.merge([(np.array([3, 4], np.int32), np.array([2.0, 1.0], np.float32))], 5, *out) == -1
    assert kernels._c_hits.merge([(np.array([3]), np.array([1.0], np.float32))] * 65, 5, *out) == -1
    with pytest.raises(ValueError):  # outputs too short for k
        kernels._c_hits.merge([(np.array([3]), np.array([1.0], np.float32))], 6, *out)
