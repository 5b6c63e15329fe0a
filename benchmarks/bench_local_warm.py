"""The local index's sparse search warm and back to back: what one long-running process (serve)
sees, without ``bench_local_backend.py``'s brute-force reference between queries (which evicts
the CPU caches before every query).

    OMP_NUM_THREADS=1 python benchmarks/bench_local_warm.py --docs 123000 [--queries 100]

Uses the index ``bench_local_backend.py`` built under ``--cache``. Prints the p50 of
``_sparse_top`` (kernel, per shard top-k and merge) and of ``run_query`` (the full call with
hits, no explanations), timed alternately query by query after 10 warm-up queries.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.synthetic import sample_vectors, zipf_probabilities  # noqa: E402
from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402
from d2s_search.search import QueryVectors, SearchOptions, run_query  # noqa: E402

TERMS = [f"t{i}" for i in range(30522)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--cache", default=str(Path(__file__).parent / ".cache"))
    args = parser.parse_args()
    backend = LocalBackend(Path(args.cache) / f"local-{args.docs}", threads=1)
    backend.open(None, create=False)
    queries = [{TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())}
               for ids, ws in sample_vectors(args.queries, 10, 40, zipf_probabilities(seed=0), seed=12345)]
    options = SearchOptions(mode="sparse", k=10, explain=0)
    for q in queries[:10]:
        run_query(backend, QueryVectors(full=q, own=q, dense=None), options)
    kernel, full = [], []
    load = os.getloadavg()
    for q in queries:
        t0 = time.perf_counter()
        backend._sparse_top(backend._search_state(), q, 10)
        t1 = time.perf_counter()
        run_query(backend, QueryVectors(full=q, own=q, dense=None), options)
        full.append(time.perf_counter() - t1)
        kernel.append(t1 - t0)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load[0]:.2f} -> {os.getloadavg()[0]:.2f}, "
          f"{args.docs} docs, {len(queries)} queries, kernel {'compiled' if kernels.c_kernel_loaded() else 'numpy'}")
    print(f"_sparse_top p50 {np.median(kernel) * 1e3:.3f} ms, run_query p50 {np.median(full) * 1e3:.3f} ms "
          f"(p99 {np.percentile(full, 99) * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
