"""An approximate sparse side from impact-pruned posting lists: what it would find and save.

    python benchmarks/bench_pruned_lists.py [--collection real-shaped] [--docs 1000000]
        [--lengths 1000,3000] [--pools 100,3000] [--queries 100] [--json OUT]

Per shard of the local index (65,536 documents), each term keeps only its L highest-weight
postings (ties: the lower row; a shorter list whole). A query scores those with the index's own
compiled kernel, takes the best N (N = the pool, and twice the pool), rescores them exactly from
their rows and keeps the pool's best: the sparse side a hybrid would fuse. Against the exact
sparse pool of the same size: the sparse top 10's recall, the fused top k's overlap with the
hybrid fused from the exact pool (min-max, alpha 0.5, the same dense pool from the graphs; k=10
for a pool of 100, else 1000), and p50 of the approximate side against the exact one, the two
taking turns query by query (the exact one as a hybrid search
takes it: one compiled call over every shard). The index is the one ``bench_local_backend.py`` builds and caches;
the pruned lists are made in memory (their postings' share of the shard's is reported).
"""

from __future__ import annotations

import argparse
import time

import _common  # benchmarks/ is on sys.path when a script runs
import numpy as np

_common.use_repository()

from bench_local_backend import COLLECTIONS, build_index, index_path  # noqa: E402

from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402
from d2s_search.backends.local.backend import QueryColumns  # noqa: E402
from d2s_search.search import minmax_normalised  # noqa: E402


def pruned(arrays: dict, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A shard's column-wise postings with each term's ``length`` highest weights, rows ascending."""
    indptr = np.asarray(arrays["csc_indptr"], dtype=np.int64)
    indices, data = arrays["csc_indices"], arrays["csc_data"]
    sizes = np.minimum(np.diff(indptr), length)
    out_ptr = np.zeros(indptr.size, dtype=np.int64)
    np.cumsum(sizes, out=out_ptr[1:])
    keep = np.empty(int(out_ptr[-1]), dtype=np.int64)
    for col in range(indptr.size - 1):
        start, end = int(indptr[col]), int(indptr[col + 1])
        at = int(out_ptr[col])
        if end - start <= length:
            keep[at:at + end - start] = np.arange(start, end)
            continue
        weights = data[start:end]  # encoded weights order as the weights do (positive)
        cut = np.partition(weights, weights.size - length)[weights.size - length]
        above = np.flatnonzero(weights > cut)
        tied = np.flatnonzero(weights == cut)[:length - above.size]
        keep[at:at + length] = np.sort(np.concatenate([above, tied])) + start
    return out_ptr.astype(np.int32), np.ascontiguousarray(indices[keep]), np.ascontiguousarray(data[keep])


def exact_top(backend: LocalBackend, state, query, pool: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact sparse pool as a hybrid search takes it (one compiled call over every shard)."""
    top = backend._query_top(state, query, pool)
    if top is None:
        return backend._sparse_top(state, query, pool)
    rows, scores, _, _ = top.results()
    return rows, scores


def approximate_top(backend: LocalBackend, state, bound: list, query: QueryColumns, pool: int,
                    scored: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``scored`` rows by the pruned lists, rescored exactly; the ``pool`` best of them."""
    scratch = kernels.QueryScratch(query.cols, query.weights, state.shard_rows, len(state.shards), scored)
    found = []
    for j, (lists, shard) in enumerate(zip(bound, state.shards)):
        rows, scores = lists.top(scratch, j)
        found.append((rows + shard.start, scores.copy()))
    rows, _ = kernels.merge_top(found, scored)
    exact = backend._rescore(state, rows, query)
    order = np.lexsort((rows, -exact))[:pool]
    return rows[order], exact[order]


def minmax_fused(runs: list[tuple[np.ndarray, np.ndarray]], k: int) -> set[int]:
    totals: dict[int, float] = {}
    for rows, scores in runs:
        for row, value in zip(rows.tolist(), (0.5 * minmax_normalised(scores)).tolist()):
            totals[row] = totals.get(row, 0.0) + value
    return {row for row, _ in sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:k]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", choices=tuple(COLLECTIONS), default="real-shaped")
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--lengths", default="1000,3000")
    parser.add_argument("--pools", default="100,3000")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads="1 search thread")
    path = index_path(args.cache, args.collection, args.docs)
    if not (path / "index.sqlite").exists():
        build_index(path, args.docs, collection=args.collection)
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    state = backend._search_state()
    for shard in state.shards:
        backend._validated(shard)
    queries = COLLECTIONS[args.collection].queries(args.queries)
    columns = [backend._query_columns(q.full) for q in queries]
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        lists = [pruned(shard.arrays, length) for shard in state.shards]
        share = sum(p[1].size for p in lists) / sum(s.arrays["csc_indices"].size for s in state.shards)
        bound = [kernels.BoundShard.bind(*p, shard.rows) for p, shard in zip(lists, state.shards)]
        for pool in (int(x) for x in args.pools.split(",")):
            k = 10 if pool <= 100 else 1000
            for scored in (pool, 2 * pool):
                recall, overlap, exact_s, approx_s = [], [], [], []
                for i, (q, query) in enumerate(zip(queries, columns)):
                    sides = {}
                    turns = ("exact", "approximate") if i % 2 == 0 else ("approximate", "exact")  # taking turns
                    for side in turns:
                        t0 = time.perf_counter()
                        sides[side] = (exact_top(backend, state, q.full, pool) if side == "exact"
                                       else approximate_top(backend, state, bound, query, pool, scored))
                        (exact_s if side == "exact" else approx_s).append(time.perf_counter() - t0)
                    (exact_rows, exact_scores), (approx_rows, approx_scores) = sides["exact"], sides["approximate"]
                    dense = backend._dense_top(state, q.dense, pool, exact=False)
                    recall.append(len(set(approx_rows[:10].tolist()) & set(exact_rows[:10].tolist())) / 10)
                    want = minmax_fused([(exact_rows, exact_scores), dense], k)
                    overlap.append(len(minmax_fused([(approx_rows, approx_scores), dense], k) & want) / len(want))
                rows.append({"length": length, "postings_share": round(share, 3), "pool": pool, "scored": scored,
                             "k": k, "sparse_recall_at_10": round(float(np.mean(recall)), 3),
                             "hybrid_overlap": round(float(np.mean(overlap)), 3),
                             "exact_p50_ms": round(float(np.median(exact_s)) * 1e3, 2),
                             "approximate_p50_ms": round(float(np.median(approx_s)) * 1e3, 2)})
                print(rows[-1], flush=True)
    summary.update({"collection": args.collection, "docs": args.docs, "queries": len(queries), "rows": rows})
    summary = _common.finish(summary)
    print(_common.table(
        ["L a term a shard", "postings kept", "pool (scored)", "sparse recall@10", "hybrid top k overlap",
         "p50 vs exact"],
        [(r["length"], f"{r['postings_share']:.0%}", f"{r['pool']} ({r['scored']})", r["sparse_recall_at_10"],
          f"{r['hybrid_overlap']} @{r['k']}",
          f"{r['approximate_p50_ms']} / {r['exact_p50_ms']} ms, "
          f"{_common.ratio(r['approximate_p50_ms'], r['exact_p50_ms'])}") for r in rows]))
    print(_common.caption(summary))
    _common.write_json(summary, args.json_out)


if __name__ == "__main__":
    main()
