"""Where one search's time goes on the local index, cold and warm, stage by stage.

    OMP_NUM_THREADS=1 python benchmarks/bench_query_stages.py [--docs 123000] [--queries 300]
    D2S_GRAPH_HUGE_PAGES=0 OMP_NUM_THREADS=1 python benchmarks/bench_query_stages.py   # graphs read from the mapping
    D2S_C_KERNEL=0 OMP_NUM_THREADS=1 python benchmarks/bench_query_stages.py           # no compiled parts
    OMP_NUM_THREADS=1 python benchmarks/bench_query_stages.py --python-hits            # hits built in Python

Uses the synthetic index of ``bench_local_backend.py`` (built there first) and the same
queries. Each query runs through ``search.run_query`` twice: "cold" right after a 256 MB array
is rewritten (as the interleaved benchmark's brute-force reference leaves the caches), "warm"
at once again. The backend's stages are timed by wrapping its methods (their times nest:
``_fused_hits`` includes ``_hits`` and ``_explain``); "total" is the whole call. Medians in ms.
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

from benchmarks.bench_local_backend import benchmark_queries, build_index  # noqa: E402
from d2s_search.backends.local import LocalBackend, graph, kernels  # noqa: E402
from d2s_search.search import SearchOptions, run_query  # noqa: E402

STAGES = ("_search_state", "_query_top", "_query_columns", "_sparse_top", "_dense_top", "_fused_hits", "_hits", "_explain")
PLANS = (("sparse", 10, 0), ("sparse", 1000, 0), ("sparse", 1000, 5), ("dense", 10, 0), ("hybrid", 10, 5))


def timed(backend: LocalBackend) -> dict[str, float]:
    """Wrap the backend's stages; returns the dict their times add up in."""
    spent: dict[str, float] = {}
    for name in STAGES:
        method = getattr(backend, name)

        def wrapper(*args, _method=method, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - t0

        setattr(backend, name, wrapper)
    return spent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=123_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--python-hits", action="store_true", help="build hits in Python, not with _hits.c")
    args = ap.parse_args()
    if args.python_hits:
        kernels._c_hits = None
    path = ROOT / "benchmarks" / ".cache" / f"local-{args.docs}"
    build_index(path, args.docs)[0].close()
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    backend._search_state()
    spent = timed(backend)
    qs = benchmark_queries(args.queries)
    evict = np.zeros(64 << 20, np.float32)
    print(f"{args.docs} documents, {len(qs)} queries, one search thread; compiled kernel "
          f"{kernels.c_kernel_loaded()}, hit builder {kernels._c_hits is not None}, graph huge pages "
          f"{graph.huge_page_copy(np.zeros(1, np.uint8)) is not None}; load {os.getloadavg()[0]:.2f}")
    for mode, k, explain in PLANS:
        options = SearchOptions(mode=mode, k=k, explain=explain)
        samples: dict[str, dict[str, list[float]]] = {"cold": {}, "warm": {}}
        for q in qs:
            for state in ("cold", "warm"):
                if state == "cold":
                    evict += 1.0
                spent.clear()
                t0 = time.perf_counter()
                run_query(backend, q, options)
                spent["total"] = time.perf_counter() - t0
                for name, seconds in spent.items():
                    samples[state].setdefault(name, []).append(seconds)
        print(f"\n{mode} k={k} explain={explain}: stage, cold / warm p50 ms")
        for name in samples["cold"]:
            print(f"  {name:16s} {np.median(samples['cold'][name]) * 1e3:7.3f} / {np.median(samples['warm'][name]) * 1e3:7.3f}")
    print(f"\nload {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
