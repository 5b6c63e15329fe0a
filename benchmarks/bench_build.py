"""Building a local index's search structures from its SQLite, for two code trees taking turns
round by round (or this tree alone, without ``--ref``): each build in a fresh process of its
tree, faiss on ``--build-threads`` threads, the cache removed before it.

    python benchmarks/bench_build.py [--collection real-shaped] [--docs 1000000] [--ref TREE]
        [--rounds 1] [--build-threads 2] [--json OUT]

Per build: the seconds to the searchable state, the part of them spent on the graphs once the
shards were made (``_common.build_in_a_process``), and the process's peak
resident memory. The index is the one ``bench_local_backend.py`` builds and caches for the
collection (benchmarks/.cache/<collection>-<docs>); its cache is left as the last build made it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import _common  # benchmarks/ is on sys.path when a script runs
import numpy as np
from bench_local_backend import COLLECTIONS, build_index, index_path


def build_once(tree: Path, index: Path, threads: int) -> dict:
    shutil.rmtree(index / "cache", ignore_errors=True)
    return _common.build_in_a_process(index, threads, tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", choices=tuple(COLLECTIONS), default="real-shaped")
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--ref", help="the other code tree (its extensions built); without it this tree alone")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--json", dest="json_out", help="also write the results to this file")
    args = parser.parse_args()
    summary = _common.provenance(threads=f"{args.build_threads} faiss threads")
    path = index_path(args.cache, args.collection, args.docs)
    backend, _ = build_index(path, args.docs, collection=args.collection)  # the documents, once
    backend.close()
    trees = {"current": _common.ROOT, **({"ref": Path(args.ref).resolve()} if args.ref else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        names = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
        if round_ == args.rounds - 1 and names[-1] != "current":
            names = names[::-1]  # the cache left behind is this tree's
        for name in names:
            runs[name].append(build_once(trees[name], path, args.build_threads))
            print(name, runs[name][-1], flush=True)
    summary.update({"collection": args.collection, "docs": args.docs, "rounds": args.rounds, "trees": {
        name: {"seconds": round(float(np.median([r["seconds"] for r in rs])), 1),
               "graphs_after_shards": round(float(np.median([r["graphs_after_shards"] for r in rs])), 1),
               "peak_rss_mb": int(np.median([r["peak_rss_mb"] for r in rs]))} for name, rs in runs.items()}})
    _common.finish(summary)
    rows = [[name, t["seconds"], t["graphs_after_shards"], round(t["seconds"] - t["graphs_after_shards"], 1),
             t["peak_rss_mb"], f"{t['seconds'] / summary['trees']['ref']['seconds']:.2f}x" if args.ref else "-"]
            for name, t in summary["trees"].items()]
    print(_common.table(["tree", "build s", "graphs after the shards s", "before them s", "peak MB", "vs ref"], rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
