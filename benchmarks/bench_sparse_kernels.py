"""Exact sparse accumulation kernels, side by side, on the local index's own shards.

    python benchmarks/bench_sparse_kernels.py [--docs 123000] [--queries 300] [--cache DIR]

Uses the index that ``bench_local_backend.py`` builds (same synthetic collection, same
queries). For every query, every variant accumulates the scores of every shard and takes
the shard's top 10 (``kernels.top_rows``, or the variant's own); the variants run interleaved query by query, the
order rotating, so a busy machine slows them alike. Reported: p50/p99 of the whole shard
loop per variant and its ratio to the reference (``kernels.accumulate``: scipy's C++
``csc_matvec`` once per term, int32 ids, float32 weights) measured in the same run. Every
variant's top 10 is checked against the reference's on every query (ids, and scores to
float32 rounding). The postings in other layouts (16-bit ids, fp16 weights, dense columns
for frequent terms) are converted once before timing. Since cache format 6 the cache stores
16-bit weights (Lucene's FeatureField encoding); the float32 variants run on their decoded
values, so every variant computes the same scores. ``--fp32-kernel SO`` adds the kernel as
it was before that change (float32 weights and columns), built from its source, e.g.::

    git show 6f9a7af:d2s_search/backends/local/_score.c > /tmp/score32.c
    gcc -O3 -ffp-contract=off -shared -fPIC -o /tmp/score32.so /tmp/score32.c
    python benchmarks/bench_sparse_kernels.py --fp32-kernel /tmp/score32.so --only 12,13

Compare those two alone: variants 9 and 11 read the cache's own 16-bit arrays, so run in the
same query before the shipped kernel they warm its data and flatter it (0.75x vs 0.91-1.00x).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from benchmarks.synthetic import sample_vectors, zipf_probabilities  # noqa: E402
from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402

TERMS = [f"t{i}" for i in range(30522)]
K = 10


def shard_layouts(shard, dense_min_fraction: float) -> dict:
    a = shard.arrays
    indptr, indices, stored = np.asarray(a["csc_indptr"]), np.asarray(a["csc_indices"]), np.asarray(a["csc_data"])
    data = np.ascontiguousarray(kernels.decode_weights(stored))
    lengths = np.diff(indptr)
    frequent = np.flatnonzero(lengths >= dense_min_fraction * shard.rows)
    dense_cols = {}
    for col in frequent.tolist():
        column = np.zeros(shard.rows, dtype=np.float32)
        column[indices[indptr[col] : indptr[col + 1]]] = data[indptr[col] : indptr[col + 1]]
        dense_cols[col] = column
    return {
        "rows": shard.rows, "indptr": indptr, "ids32": indices.astype(np.int32), "w32": data,
        "stored_ids": indices,  # the cache's own (16-bit in-shard ids since cache format 4)
        "stored_w": stored,  # the cache's own (16-bit weights since cache format 6)
        "ids16": indices.astype(np.uint16), "w16": data.astype(np.float16), "ids64": indices.astype(np.intp),
        "dense_cols": dense_cols,
        "stored_dense_terms": a.get("dense_terms"), "stored_dense_columns": a.get("dense_columns"),
        # the same columns decoded, for the float32 kernel of --fp32-kernel (made before timing)
        "w32_columns": np.ascontiguousarray(kernels.decode_weights(np.asarray(a["dense_columns"]))),
    }


def spans(layout: dict, cols: np.ndarray, weights: np.ndarray):
    indptr = layout["indptr"]
    n_cols = indptr.size - 1
    for col, w in zip(cols.tolist(), weights.tolist()):
        if col < n_cols and indptr[col + 1] > indptr[col]:
            yield col, int(indptr[col]), int(indptr[col + 1]), np.float32(w)


# -- variants: each fills out[:rows] with the shard's exact scores ----------------------------


def v_reference(layout, cols, weights, out):
    kernels.accumulate(layout["indptr"], layout["ids32"], layout["w32"], layout["rows"], cols, weights, out, use_c=False)


def v_fancy_add(layout, cols, weights, out, ids_name="ids32"):
    """scores[ids] += w * data: exact because a posting list holds a document once."""
    scores = out[: layout["rows"]]
    scores.fill(0)
    for _, s, e, w in spans(layout, cols, weights):
        scores[layout[ids_name][s:e]] += layout["w32"][s:e] * w


def v_add_at_uint16_fp16(layout, cols, weights, out):
    scores = out[: layout["rows"]]
    scores.fill(0)
    for _, s, e, w in spans(layout, cols, weights):
        np.add.at(scores, layout["ids16"][s:e], layout["w16"][s:e].astype(np.float32) * w)


def v_scipy_fp16_weights(layout, cols, weights, out):
    """fp16 weights widened per term, then scipy's kernel (fp16 halves the weight bytes read)."""
    scores = out[: layout["rows"]]
    scores.fill(0)
    one = np.zeros(2, dtype=layout["indptr"].dtype)
    w1 = np.zeros(1, dtype=np.float32)
    for _, s, e, w in spans(layout, cols, weights):
        one[1] = e - s
        w1[0] = w
        kernels._csc_matvec(layout["rows"], 1, one, layout["ids32"][s:e], layout["w16"][s:e].astype(np.float32), w1, scores)


def v_scipy_uint16_ids(layout, cols, weights, out):
    """uint16 in-shard ids handed to scipy's kernel (which accepts them by widening them to
    its int32 instantiation: a copy per term)."""
    scores = out[: layout["rows"]]
    scores.fill(0)
    one = np.zeros(2, dtype=np.int32)
    w1 = np.zeros(1, dtype=np.float32)
    for _, s, e, w in spans(layout, cols, weights):
        one[1] = e - s
        w1[0] = w
        kernels._csc_matvec(layout["rows"], 1, one, layout["ids16"][s:e], layout["w32"][s:e], w1, scores)


def v_bincount_all_terms(layout, cols, weights, out):
    """One np.bincount over the query's postings gathered together (float64 sums)."""
    parts = list(spans(layout, cols, weights))
    scores = out[: layout["rows"]]
    if not parts:
        scores.fill(0)
        return
    ids = np.concatenate([layout["ids32"][s:e] for _, s, e, _ in parts])
    vals = np.concatenate([layout["w32"][s:e] * w for _, s, e, w in parts])
    scores[:] = np.bincount(ids, weights=vals, minlength=layout["rows"])


def v_dense_frequent_terms(layout, cols, weights, out):
    """Terms in at least ``--dense-fraction`` of the shard's documents as dense fp32 columns
    (a sequential scaled add, the same float32 products and order), the rest through scipy."""
    scores = out[: layout["rows"]]
    scores.fill(0)
    one = np.zeros(2, dtype=layout["indptr"].dtype)
    w1 = np.zeros(1, dtype=np.float32)
    dense = layout["dense_cols"]
    for col, s, e, w in spans(layout, cols, weights):
        column = dense.get(col)
        if column is not None:
            scores += column * w  # one temporary; np.multiply(..., out=) then add is the same work
            continue
        one[1] = e - s
        w1[0] = w
        kernels._csc_matvec(layout["rows"], 1, one, layout["ids32"][s:e], layout["w32"][s:e], w1, scores)


def v_dense_frequent_terms_no_temp(layout, cols, weights, out):
    """As above, the scaled column written into a reused buffer instead of a new array."""
    scores = out[: layout["rows"]]
    scores.fill(0)
    one = np.zeros(2, dtype=layout["indptr"].dtype)
    w1 = np.zeros(1, dtype=np.float32)
    dense = layout["dense_cols"]
    tmp = layout.setdefault("tmp", np.empty(layout["rows"], dtype=np.float32))
    for col, s, e, w in spans(layout, cols, weights):
        column = dense.get(col)
        if column is not None:
            np.multiply(column, w, out=tmp)
            np.add(scores, tmp, out=scores)
            continue
        one[1] = e - s
        w1[0] = w
        kernels._csc_matvec(layout["rows"], 1, one, layout["ids32"][s:e], layout["w32"][s:e], w1, scores)


def v_numpy_path(layout, cols, weights, out):
    """``kernels.accumulate`` without the C kernel, with the shard's stored dense columns
    (what the backend ran before ``_score.c``, and runs when no compiler built it)."""
    kernels.accumulate(layout["indptr"], layout["ids32"], layout["stored_w"], layout["rows"], cols, weights, out,
                       layout["stored_dense_terms"], layout["stored_dense_columns"], use_c=False)


def v_c_accumulate(layout, cols, weights, out):
    """The compiled kernel's accumulation (``_score.c``), the top-k still numpy's."""
    kernels.accumulate(layout["indptr"], layout["ids32"], layout["stored_w"], layout["rows"], cols, weights, out,
                       layout["stored_dense_terms"], layout["stored_dense_columns"])


def v_shipped(layout, cols, weights, out):
    """``kernels.shard_top`` as the backend calls it: accumulation and top-k in C, on the
    cache's 16-bit ids."""
    return kernels.shard_top(layout["indptr"], layout["stored_ids"], layout["stored_w"], layout["rows"], cols, weights,
                             out, K, layout["stored_dense_terms"], layout["stored_dense_columns"])


_FP32_KERNEL = None  # (accumulate16, top) of --fp32-kernel


def v_fp32_kernel(layout, cols, weights, out):
    """The C kernel before cache format 6 (float32 weights and dense columns; 16-bit ids),
    accumulate and heap top-k, on the decoded weights: what the 16-bit weights are measured against."""
    accumulate16, top = _FP32_KERNEL
    slots = kernels._dense_slots(cols, layout["stored_dense_terms"])
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    ids, data, columns, rows = layout["stored_ids"], layout["w32"], layout["w32_columns"], layout["rows"]
    accumulate16(layout["indptr"].ctypes.data, layout["indptr"].size - 1, ids.ctypes.data, data.ctypes.data, ids.size,
                 rows, cols.ctypes.data, weights.ctypes.data, cols.size, slots.ctypes.data, columns.ctypes.data,
                 columns.shape[0], out.ctypes.data)
    heap = np.empty(2 * K, dtype=np.int32)
    found_rows, found_scores = np.empty(K, dtype=np.int32), np.empty(K, dtype=np.float32)
    n = top(out.ctypes.data, rows, K, heap.ctypes.data, found_rows.ctypes.data, found_scores.ctypes.data)
    return found_rows[:n].astype(np.int64), found_scores[:n]


def load_fp32_kernel(path: str) -> None:
    import ctypes

    global _FP32_KERNEL
    lib = ctypes.CDLL(path)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.d2s_accumulate16.argtypes = [p, i64, p, p, i64, i64, p, p, i64, p, p, i64, p]
    lib.d2s_accumulate16.restype = i64
    lib.d2s_top_positive.argtypes = [p, i64, i64, p, p, p]
    lib.d2s_top_positive.restype = i64
    _FP32_KERNEL = (lib.d2s_accumulate16, lib.d2s_top_positive)


VARIANTS = {
    "reference: scipy csc_matvec per term (int32 ids, fp32)": v_reference,
    "numpy scores[ids] += w*data (int32 ids)": v_fancy_add,
    "numpy scores[ids] += w*data (uint16 in-shard ids)": partial(v_fancy_add, ids_name="ids16"),
    "numpy np.add.at (uint16 ids, fp16 weights)": v_add_at_uint16_fp16,
    "scipy per term, fp16 weights widened per term": v_scipy_fp16_weights,
    "numpy bincount over all query postings (float64 sums)": v_bincount_all_terms,
    "dense columns for frequent terms + scipy for the rest": v_dense_frequent_terms,
    "dense columns for frequent terms (reused buffer) + scipy": v_dense_frequent_terms_no_temp,
    "numpy path: kernels.accumulate with the cache's dense columns (terms in >= 1/2 of a shard)": v_numpy_path,
    "scipy per term, uint16 in-shard ids": v_scipy_uint16_ids,
    "C kernel accumulate (int32 ids) + numpy top-k": v_c_accumulate,
    "shipped: C kernel, accumulate and top-k in one call (kernels.shard_top)": v_shipped,
    "previous C kernel, fp32 weights and columns (--fp32-kernel)": v_fp32_kernel,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cache", default=str(Path(__file__).parent / ".cache"))
    parser.add_argument("--dense-fraction", type=float, default=0.25)
    parser.add_argument("--only", default="", help="comma-separated variant numbers (1 = reference, always run)")
    parser.add_argument("--fp32-kernel", default="", help="a .so built from the kernel before 16-bit weights (see above)")
    args = parser.parse_args()
    if args.fp32_kernel:
        load_fp32_kernel(args.fp32_kernel)

    backend = LocalBackend(Path(args.cache) / f"local-{args.docs}", threads=1)
    backend.open(None, create=False)
    state = backend._search_state()
    layouts = [shard_layouts(s, args.dense_fraction) for s in state.shards]
    probs = zipf_probabilities(seed=0)
    queries = []
    for ids, ws in sample_vectors(args.queries, 10, 40, probs, seed=12345):  # bench_local_backend's queries
        cols, weights = backend._query_columns({TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())})
        queries.append((cols, weights))
    names = [n for n in VARIANTS if args.fp32_kernel or VARIANTS[n] is not v_fp32_kernel]
    if args.only:
        chosen = {0, *(int(i) - 1 for i in args.only.split(","))}
        names = [n for i, n in enumerate(names) if i in chosen]
    out = np.empty(state.shard_rows, dtype=np.float32)

    def run(name, cols, weights):
        found = []
        for j, layout in enumerate(layouts):
            top = VARIANTS[name](layout, cols, weights, out)
            if top is None:  # the variant filled the scores; the top-k is numpy's
                scores = out[: layout["rows"]]
                rows = kernels.top_rows(scores, K)
                top = (rows, scores[rows].astype(np.float32))
            found.append((top[0] + state.shards[j].start, top[1]))
        return kernels.merge_top(found, K)

    times = {n: [] for n in names}
    mismatches = dict.fromkeys(names, 0)
    load_before = os.getloadavg()
    for qi, (cols, weights) in enumerate(queries):
        order = names[qi % len(names):] + names[: qi % len(names)]
        got = {}
        for name in order:
            t0 = time.perf_counter()
            got[name] = run(name, cols, weights)
            times[name].append((time.perf_counter() - t0) * 1000)
        ref_rows, ref_scores = got[names[0]]
        for name in names[1:]:
            rows, scores = got[name]
            if not (np.array_equal(rows, ref_rows) and np.allclose(scores, ref_scores, rtol=1e-5, atol=0)):
                mismatches[name] += 1
    load_after = os.getloadavg()
    warm = min(10, len(queries) // 10)
    ref50 = float(np.percentile(times[names[0]][warm:], 50))
    dense_terms = sum(len(lay["dense_cols"]) for lay in layouts)
    stored = sum(0 if s.arrays.get("dense_columns") is None else s.arrays["dense_columns"].nbytes for s in state.shards)
    total = sum(v.nbytes for s in state.shards for v in s.arrays.values())
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} cores, "
          f"numpy {np.__version__}, load {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f} -> "
          f"{load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}")
    print(f"# {args.docs} docs, {len(layouts)} shards, {len(queries)} queries (first {warm} not counted), top {K}, "
          f"dense columns (>= {args.dense_fraction} of a shard): {dense_terms}; in the cache: "
          f"{sum(0 if s.arrays.get('dense_terms') is None else s.arrays['dense_terms'].size for s in state.shards)} "
          f"columns, {stored / 2**20:.1f} MB of {total / 2**20:.1f} MB of arrays")
    print("| variant | p50 ms | p99 ms | p50 / reference | top-10 differs from reference |")
    print("|---|---|---|---|---|")
    for name in names:
        t = times[name][warm:]
        p50, p99 = float(np.percentile(t, 50)), float(np.percentile(t, 99))
        print(f"| {name} | {p50:.3f} | {p99:.3f} | {p50 / ref50:.2f} | {mismatches[name]}/{len(queries)} |")


if __name__ == "__main__":
    main()
