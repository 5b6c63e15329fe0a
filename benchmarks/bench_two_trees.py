"""One change's effect on whole searches: this code tree against another (``--ref``), the two
taking turns round by round, each round a new process per tree over the same index and queries.

    python benchmarks/bench_two_trees.py --ref /tmp/ref-main [--collection real-shaped] [--docs 123000]
        [--plans sparse@100,sparse@1000,hybrid@1000] [--queries 100] [--rounds 3] [--json OUT]

A round runs every plan (explained with 5 words, as ``query`` shows them) over every query in
each tree's process, the trees' order alternating, so load changes hit both alike; the first 10
queries of a plan are not timed. The table gives each tree's median over the rounds of its p50
and the ratio this/ref. The index is the one ``bench_local_backend.py`` builds and caches for the
collection (built by this tree when missing); both trees read it. ``--ref``: a checkout of the
other commit with its compiled extensions built (``git worktree add --detach /tmp/ref-main
main`` and ``python setup.py build_ext --inplace`` there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import _common
import bench_local_backend as blb

_common.use_repository()

ROUND = """
import json, sys, time
import d2s_search  # first, from PYTHONPATH's tree (the benchmarks' modules put this checkout first on the path)
sys.path.insert(0, sys.argv[1])  # this benchmarks folder: the collections' query makers
import numpy as np
import bench_local_backend as blb
from d2s_search.backends.local import LocalBackend
from d2s_search.search import SearchOptions, run_query
path, collection, n, plans = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(",")
backend = LocalBackend(path, threads=1)
backend.open(None, create=False)
queries = blb.COLLECTIONS[collection].queries(n)
out = {"package": d2s_search.__file__}
for plan in plans:
    mode, k = plan.split("@")
    options = SearchOptions(mode=mode, k=int(k), explain=5)
    times = []
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        run_query(backend, q, options)
        if i >= 10:
            times.append(time.perf_counter() - t0)
    out[plan] = float(np.median(times)) * 1000
print(json.dumps(out))
"""


def one_round(tree: Path, index: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", ROUND, str(Path(__file__).parent), str(index), args.collection,
                           str(args.queries), args.plans], env=dict(os.environ, PYTHONPATH=str(tree)), cwd=tree,
                          check=True, capture_output=True, text=True)  # cwd: `python -c` looks there first
    out = json.loads(done.stdout)
    if not Path(out.pop("package")).is_relative_to(tree):
        sys.exit(f"the round meant for {tree} imported d2s_search from elsewhere")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", required=True, help="the other code tree (its extensions built)")
    parser.add_argument("--collection", choices=tuple(blb.COLLECTIONS), default="real-shaped")
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--plans", default="sparse@100,sparse@1000,hybrid@1000")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()

    index = blb.index_path(args.cache, args.collection, args.docs)
    blb.build_index(index, args.docs, collection=args.collection)[0].close()
    trees = {"this": _common.ROOT, "ref": Path(args.ref).resolve()}
    summary = _common.provenance(threads="1 search thread")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            runs[name].append(one_round(trees[name], index, args))
            print(f"round {r + 1}/{args.rounds} {name}: {runs[name][-1]}", file=sys.stderr)
    summary.update({"collection": args.collection, "docs": args.docs, "queries": args.queries, "rounds": args.rounds,
                    "ref": str(trees["ref"]),
                    "p50_ms": {name: {plan: round(statistics.median(run[plan] for run in runs[name]), 3)
                                      for plan in args.plans.split(",")} for name in trees}})
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    this, ref = summary["p50_ms"]["this"], summary["p50_ms"]["ref"]
    rows = [[plan.replace("@", " k="), f"{ref[plan]:.2f}", f"{this[plan]:.2f}", f"{this[plan] / ref[plan]:.2f}x"]
            for plan in this]
    return (_common.table(["search, 5 words explained", "ref p50 ms", "this p50 ms", "this / ref"], rows)
            + "\n\n" + _common.caption(summary))


if __name__ == "__main__":
    main()
