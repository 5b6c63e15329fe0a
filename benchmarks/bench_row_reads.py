"""Rows read one by one, in C against numpy: a two-phase window's sparse rescoring from the
rows' own postings (``kernels.rescore_rows``) and the float vectors a graph's candidates or a
code scan's best are rescored with (``graph.gather``), on the indexes bench_local_backend.py
(synthetic) and bench_sparse_shaped.py (real-shaped: 368 terms a document) build.

    python benchmarks/bench_row_reads.py [--queries 60] [--json OUT]

Blocks of 20 queries back to back (a serving process; the first 3 of each block not timed),
the two ways and exact sparse (the reference) taking turns block by block, each the whole
search as a user runs it: two-phase at k=10, 100 and 1000 (windows of 100, 1,000 and 10,000)
on both indexes, dense k=10 and hybrid k=1000 (5 words explained) on the synthetic one. Both
ways must return the same hits with the same scores. One thread.
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: E402
import numpy as np

_common.use_repository()
import bench_local_backend as blb  # noqa: E402
import sparse_shaped  # noqa: E402

from d2s_search.backends.local import LocalBackend, graph, kernels  # noqa: E402
from d2s_search.search import QueryVectors, SearchOptions, run_query  # noqa: E402

C_RESCORE, C_GATHER = kernels._rescore_rows_c, graph.gather


def numpy_ways(on: bool) -> None:
    """Turn the numpy paths on (the C kernels' callers fall back to them) or back off."""
    kernels._rescore_rows_c = (lambda *a: None) if on else C_RESCORE
    graph.gather = (lambda matrix, rows, out=None: np.take(matrix, rows, axis=0, out=out)) if on else C_GATHER


def taking_turns(backend: LocalBackend, queries: list, options: SearchOptions, block: int = 20,
                 settle: int = 3) -> dict:
    """Blocks of ``block`` queries back to back (as a serving process answers them; the first
    ``settle`` of each not timed), the two ways and exact sparse taking turns block by block."""
    exact = SearchOptions(mode="sparse", k=options.k, explain=options.explain)
    times: dict[str, list[float]] = {"C": [], "numpy": [], "exact sparse": []}
    hits: dict[str, list] = {"C": [], "numpy": []}
    for b, start in enumerate(range(0, len(queries), block)):
        chunk = queries[start : start + block]
        for name in ("C", "numpy", "exact sparse")[:: 1 if b % 2 else -1]:
            numpy_ways(name == "numpy")
            for i, q in enumerate(chunk):
                t0 = time.perf_counter()
                found = run_query(backend, q, exact if name == "exact sparse" else options).hits
                if i >= settle:
                    times[name].append(time.perf_counter() - t0)
                if name in hits:
                    hits[name].append([(h.id, h.score) for h in found])
    numpy_ways(False)
    assert hits["C"] == hits["numpy"], "the two ways must find the same hits with the same scores"
    return {name: _common.percentiles(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--synthetic", default="local-1000000")
    parser.add_argument("--real-shaped", default="sparse-shaped-1000000")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads="1 search thread")
    results = {}
    for name in (args.synthetic, args.real_shaped):
        path = _common.CACHE / name
        if not (path / "index.sqlite").is_file():
            raise SystemExit(f"no index at {path}: build it with bench_local_backend.py / bench_sparse_shaped.py")
        backend = LocalBackend(path, threads=1)
        backend.open(None, create=False)
        if name == args.real_shaped:
            queries = [QueryVectors(full=q, own=dict(sorted(q.items(), key=lambda kv: -kv[1])[:8]),
                                    dense=np.zeros(1, np.float32)) for q in sparse_shaped.queries(args.queries)]
            plans = [("two-phase", k) for k in (10, 100, 1000)]
        else:
            queries = blb.benchmark_queries(args.queries)
            plans = [("two-phase", k) for k in (10, 100, 1000)] + [("dense", 10), ("hybrid", 1000)]
        for mode, k in plans:
            options = SearchOptions(mode=mode, k=k, explain=5 if mode == "hybrid" else 0)
            results[f"{name} {mode} @{k}"] = taking_turns(backend, queries, options)
        backend.close()
    numpy_ways(False)
    summary.update({"queries": args.queries, "latency": results})
    _common.write_json(_common.finish(summary), args.json_out)


if __name__ == "__main__":
    main()
