"""The exact sparse kernel alone at 123k documents: cold (caches evicted) and warm, and the
bytes a query makes it read.

    OMP_NUM_THREADS=1 python benchmarks/bench_kernel_cold.py [variant.so ...]

Times ``d2s_accumulate16`` over every shard of the cached synthetic index of
``bench_local_backend.py`` (built there first), for 300 queries: "cold" right after a 256 MB
array is rewritten (as the interleaved benchmark's brute-force reference leaves the caches),
"warm" the same query again at once. Extra arguments are other builds of ``_score.c`` (same
exported function), alternated query by query with the shipped one; their scores must be
identical. Also prints the median bytes of stored postings and dense columns a query reads:
the cold time is bound by reading them from memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_local_backend import TERMS, build_index  # noqa: E402
from benchmarks.synthetic import sample_vectors, zipf_probabilities  # noqa: E402
from d2s_search.backends.local import kernels  # noqa: E402


def load_accumulate(path: str):
    """The 16-bit-id accumulate of a build of ``_score.c``, declared as the backend declares it."""
    return kernels.bind_kernel(path)[0][np.dtype(np.uint16)]


def score_all(fn, shards, cols: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
    for s in shards:
        a = s.arrays
        ptr, ind, dat, dense = a["csc_indptr"], a["csc_indices"], a["csc_data"], a.get("dense_columns")
        slots = kernels._dense_slots(cols, a.get("dense_terms"))
        bad = fn(ptr.ctypes.data, ptr.size - 1, ind.ctypes.data, dat.ctypes.data, ind.size, s.rows, cols.ctypes.data,
                 weights.ctypes.data, cols.size, None if slots is None else slots.ctypes.data,
                 None if slots is None else dense.ctypes.data, 0 if slots is None else dense.shape[0], out.ctypes.data)
        assert bad == 0


def bytes_read(shards, cols: np.ndarray) -> tuple[int, int, float]:
    """(bytes of dense columns, bytes of postings: 16-bit id + 16-bit weight) one query reads,
    and what the postings would take with a bitmap of the shard's rows plus 16-bit weights
    wherever that is smaller (terms in 1/16 to 1/2 of the rows)."""
    dense = postings = 0
    bitmap = 0.0
    for s in shards:
        a = s.arrays
        dense_terms = set(a["dense_terms"].tolist()) if "dense_terms" in a else set()
        ptr = a["csc_indptr"]
        for c in cols.tolist():
            if c in dense_terms:
                dense += 2 * s.rows
            elif c < ptr.size - 1:
                df = int(ptr[c + 1] - ptr[c])
                postings += 4 * df
                bitmap += min(4 * df, 2 * df + s.rows / 8)
    return dense, postings, bitmap


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", help="other builds of _score.c to alternate with the shipped one")
    ap.add_argument("--docs", type=int, default=123000)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    shipped = kernels.kernel_path()
    if shipped is None:
        raise SystemExit("the compiled kernel is not built: pip install -e . (needs a C compiler)")
    libs = [shipped, *args.variants]
    fns = [load_accumulate(p) for p in libs]
    backend, _ = build_index(ROOT / "benchmarks" / ".cache" / f"local-{args.docs}", args.docs)
    state = backend._search_state()
    raw = sample_vectors(args.queries, 10, 40, zipf_probabilities(seed=0), seed=12345)
    queries = [backend._query_columns({TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())}) for ids, ws in raw]
    out = np.empty(state.shard_rows, np.float32)
    evict = np.zeros(64 << 20, np.float32)
    cold = {p: [] for p in libs}
    warm = {p: [] for p in libs}
    for cols, weights in queries:
        first = None
        for path, fn in zip(libs, fns):
            evict += 1.0
            t = time.perf_counter()
            score_all(fn, state.shards, cols, weights, out)
            cold[path].append(time.perf_counter() - t)
            t = time.perf_counter()
            score_all(fn, state.shards, cols, weights, out)
            warm[path].append(time.perf_counter() - t)
            if first is None:
                first = out.copy()
            elif not np.array_equal(first, out):
                raise SystemExit(f"{path} scores differ from the shipped kernel")
    for path in libs:
        print(f"{Path(path).name:40s} cold p50 {np.median(cold[path]) * 1e3:.3f} ms   warm p50 {np.median(warm[path]) * 1e3:.3f} ms")
    read = np.array([bytes_read(state.shards, cols) for cols, _ in queries])
    print(f"bytes per query (median): dense columns {np.median(read[:, 0]) / 1e6:.2f} MB, postings "
          f"{np.median(read[:, 1]) / 1e6:.2f} MB, total {np.median(read[:, :2].sum(axis=1)) / 1e6:.2f} MB "
          f"({np.median(read[:, 0] + read[:, 2]) / 1e6:.2f} MB with bitmaps); "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
