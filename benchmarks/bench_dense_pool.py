"""A hybrid search's dense pool past the graphs: a scan of the graph's 8-bit codes, its best
rescored with the float vectors, against a scan of the float vectors, on the synthetic index
bench_local_backend.py builds.

    python benchmarks/bench_dense_pool.py [--docs 1000000] [--queries 64] [--k 1000] [--json OUT]

Per query the two take turns (the order alternating): the dense pool alone (the 10,000 a
min-max hybrid fuses at k=1000) and the whole hybrid search (5 words explained). Reports p50 of
each, the share of the exact pool (the float scan's) the codes' pool holds, and the share of the
float pool's fused top k the codes' pool returns; the scores of rows both pools hold must be
equal (both are the float inner products). One thread.
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: E402
import numpy as np

_common.use_repository()
import bench_local_backend as blb  # noqa: E402

from d2s_search.backends.local import LocalBackend, graph  # noqa: E402
from d2s_search.search import SearchOptions, run_query  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads="1 search thread")
    path = _common.CACHE / f"local-{args.docs}"
    if not (path / "index.sqlite").is_file():
        raise SystemExit(f"no index at {path}: run bench_local_backend.py --docs {args.docs} first")
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    state = backend._search_state()
    options = SearchOptions(mode="hybrid", k=args.k, explain=5)
    pool = options.candidates
    scanned = graph.scanned
    ways = {"codes": scanned, "floats": lambda *a: None}  # None: the float scan

    queries = blb.benchmark_queries(args.queries + 6)
    for q in queries[:6]:
        for way in ways.values():
            graph.scanned = way
            run_query(backend, q, options)
    times: dict[str, list[float]] = {f"{w} {part}": [] for w in ways for part in ("pool", "hybrid")}
    pool_share, top_share = [], []
    for i, q in enumerate(queries[6:]):
        found = {}
        for name in list(ways)[:: 1 if i % 2 else -1]:
            graph.scanned = ways[name]
            t0 = time.perf_counter()
            rows, scores = backend._dense_top(state, q.dense, pool, exact=False)
            t1 = time.perf_counter()
            hits = run_query(backend, q, options).hits
            t2 = time.perf_counter()
            times[f"{name} pool"].append(t1 - t0)
            times[f"{name} hybrid"].append(t2 - t1)
            found[name] = (dict(zip(rows.tolist(), scores.tolist())), {h.id for h in hits})
        graph.scanned = scanned
        codes, floats = found["codes"], found["floats"]
        assert all(codes[0][r] == s for r, s in floats[0].items() if r in codes[0])  # float scores both ways
        pool_share.append(len(codes[0].keys() & floats[0].keys()) / len(floats[0]))
        top_share.append(len(codes[1] & floats[1]) / max(1, len(floats[1])))
    summary.update({
        "docs": args.docs, "queries": args.queries, "k": args.k, "pool": pool,
        "latency": {name: _common.percentiles(t) for name, t in times.items()},
        "pool_share_mean": round(float(np.mean(pool_share)), 6), "pool_share_min": round(float(min(pool_share)), 6),
        "top_k_share_mean": round(float(np.mean(top_share)), 6), "top_k_share_min": round(float(min(top_share)), 6),
    })
    _common.write_json(_common.finish(summary), args.json_out)


if __name__ == "__main__":
    main()
