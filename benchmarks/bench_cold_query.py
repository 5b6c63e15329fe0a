"""Where a cold exact sparse k=10 search's time goes, as ``bench_local_backend.py`` measures it.

    OMP_NUM_THREADS=1 python benchmarks/bench_cold_query.py [--docs 123000] [--queries 300]

On the cached synthetic index of ``bench_local_backend.py`` (built there first) and its
queries, interleaved as that benchmark does it: every plan right after a brute-force reference
on the same query, so each starts with the CPU caches evicted. Plans:

* ``run_query``: the whole call (the benchmark's "sparse @10");
* ``stages``: the same steps called one by one, each timed: the options' check, the freshness
  check (``_search_state``), the C search (``_query.c``: the query's columns, every shard
  scored, the lists merged), the hits (``_hits.c``), the result object; what is left of
  ``run_query`` is Python calling between them;
* ``kernel``: the C search alone (its buffers ready), the floor of any path around it.

Medians of the per-query times, in ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_local_backend import benchmark_queries, brute_force, build_index, interleaved  # noqa: E402
from d2s_search.backends.base import Hit  # noqa: E402
from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402
from d2s_search.search import SearchOptions, SearchResult, StrongestTerms, run_query  # noqa: E402

STAGES = ("options", "freshness check", "C search", "hits", "result")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=123_000)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    if kernels._c_query is None or kernels._c_hits is None:
        raise SystemExit("the C parts are not built: pip install -e . (needs a C compiler)")
    path = ROOT / "benchmarks" / ".cache" / f"local-{args.docs}"
    build_index(path, args.docs)[0].close()
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    state = backend._search_state()
    queries = benchmark_queries(args.queries)
    brute_sparse, brute_dense = brute_force(backend, state)
    options = SearchOptions(mode="sparse", k=10, explain=0)
    run_query(backend, queries[0], options)  # the shard table and this thread's buffers exist from here
    top, table, clock = backend._per_thread.query_top, state.shard_table, time.perf_counter
    spent: list[np.ndarray] = []

    def stages(q) -> None:
        t = [clock()]
        options.validate()
        t.append(clock())
        now = backend._search_state()
        t.append(clock())
        n = top.run(table, q.full, backend._term_ids, 10)
        t.append(clock())
        hits = kernels._c_hits.build(Hit, top.out_rows, top.out_scores64, now.shard_rows, now.hit_sources(), None, n)
        t.append(clock())
        SearchResult(mode="sparse", hits=hits, took_ms=0.0, query_terms=StrongestTerms(q.full, 50),
                     weak_query=q.weak, unrecognised_words=list(q.unrecognised))
        t.append(clock())
        spent.append(np.diff(t))

    plans = {"run_query": lambda q: run_query(backend, q, options), "stages": stages,
             "kernel": lambda q: top.run(table, q.full, backend._term_ids, 10)}
    refs = {"brute-force sparse": lambda q: brute_sparse(q, 10), "brute-force dense": lambda q: brute_dense(q, 10)}
    results = interleaved(plans, refs, queries)
    parts = np.median(np.array(spent[10:]), axis=0) * 1e3  # the first 10: interleaved()'s warm-up
    print(f"{state.size} documents, {args.queries} queries, one search thread, cold (after a brute-force pass)")
    for name in plans:
        print(f"  {name:<12} {results[name]['p50_ms']:.3f} ms p50")
    for name, value in zip(STAGES, parts):
        print(f"    {name:<16} {value:.3f}")
    print(f"    {'sum':<16} {parts.sum():.3f}")


if __name__ == "__main__":
    main()
