"""The compiled graph walk (``_graph.c``) against faiss's own search of the same graph, and the
walk over the file's mapping against the same walk over a copy on huge pages.

    python benchmarks/bench_graph_walk.py [--model offline-mini|clip] [--docs 140000] [--queries 300]
        [--widths 16,64,256,1000] [--json OUT]

One graph (the index's: ``graph.build``, M 32, efConstruction 80, 8-bit copies) over
``--docs`` real-shaped offline-mini vectors (:mod:`real_shaped`), written to a file and
memory-mapped as the index reads it; validation captions as queries. Per width: the share of
faiss's candidates the walk also returns, recall@10 of both (candidates rescored with the float
vectors, as ``graph.search`` does), and p50 of the candidates' search alone, the two taking
turns query by query (so each runs as often right after the other); then the walk on the
mapping against the walk on :func:`graph.huge_page_copy`, the same way. One thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: E402
import numpy as np

_common.use_repository()
os.environ.setdefault("OMP_NUM_THREADS", "1")

import real_shaped  # noqa: E402

from d2s_search.backends.local import graph  # noqa: E402


def timed_turns(walkers: dict, queries: np.ndarray, width: int) -> tuple[dict, dict]:
    """(p50 seconds, candidates per query) of each walker, taking turns query by query."""
    times: dict = {name: [] for name in walkers}
    found: dict = {name: [] for name in walkers}
    names = list(walkers)
    for i, query in enumerate(queries):
        for name in names if i % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            rows = walkers[name].candidates(query, width)
            times[name].append(time.perf_counter() - start)
            found[name].append(rows)
    return {name: float(np.median(t)) for name, t in times.items()}, found


def recall_at_10(docs: np.ndarray, queries: np.ndarray, found: list, exact: list) -> float:
    hits = 0
    for query, rows, want in zip(queries, found, exact):
        scores = docs[rows] @ query
        hits += len(want & set(rows[np.argsort(-scores)[:10]].tolist()))
    return hits / (10 * len(queries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("offline-mini", "clip"), default="offline-mini")
    parser.add_argument("--docs", type=int, default=140_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--widths", default="16,64,256,1000")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    if graph._c_graph is None or not graph.available():
        sys.exit("needs the compiled walk (_graph.c) and faiss 1.11+ to compare them")
    import faiss

    faiss.omp_set_num_threads(1)
    summary = _common.provenance(threads="1 thread")
    docs, validation, _ = real_shaped.collection(args.model, args.docs)
    queries = validation[: args.queries]
    exact = [set(np.argsort(-(docs @ q))[:10].tolist()) for q in queries]
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    blob = graph.build([docs])
    build_s = time.perf_counter() - start
    faiss.omp_set_num_threads(1)
    rows, dim = docs.shape
    with tempfile.TemporaryDirectory(dir=_common.CACHE) as tmp:
        np.save(Path(tmp) / "graph.npy", blob)
        del blob
        mapped = np.asarray(np.load(Path(tmp) / "graph.npy", mmap_mode="r"))  # as the cache maps it
        where = graph.layout(mapped, rows, dim)
        graph.check(mapped, where, rows)
        walk = graph.OpenedGraph(mapped, where, rows, dim)
        by_faiss = graph.OpenedGraph(mapped, where, rows, dim, compiled=False)
        copy = graph.huge_page_copy(mapped)
        on_huge_pages = graph.OpenedGraph(copy, where, rows, dim) if copy is not None else None
        table = []
        for width in (int(w) for w in args.widths.split(",")):
            p50, found = timed_turns({"walk": walk, "faiss": by_faiss}, queries, width)
            same = np.mean([len(set(a.tolist()) & set(b.tolist())) / max(1, b.size)
                            for a, b in zip(found["walk"], found["faiss"])])
            row = {"width": width, "same_candidates": round(float(same), 4),
                   "recall@10 walk": round(recall_at_10(docs, queries, found["walk"], exact), 4),
                   "recall@10 faiss": round(recall_at_10(docs, queries, found["faiss"], exact), 4),
                   "p50 ms walk": round(p50["walk"] * 1e3, 3), "p50 ms faiss": round(p50["faiss"] * 1e3, 3)}
            if on_huge_pages is not None:
                pages, _ = timed_turns({"mapping": walk, "huge pages": on_huge_pages}, queries, width)
                row["p50 ms walk, mapping"] = round(pages["mapping"] * 1e3, 3)
                row["p50 ms walk, huge pages"] = round(pages["huge pages"] * 1e3, 3)
            table.append(row)
            print(row, file=sys.stderr)
        del walk, by_faiss, on_huge_pages, mapped
    summary.update({"model": args.model, "documents": rows, "dim": dim, "queries": len(queries), "build_s": round(build_s, 1),
                    "rows": table})
    _common.write_json(_common.finish(summary), args.json_out)


if __name__ == "__main__":
    main()
