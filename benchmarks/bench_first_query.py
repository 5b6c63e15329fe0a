"""The first sparse and the first dense search after opening the 123k index, in a new process,
with the index's pages dropped from the page cache, for two code trees alternated round by round
(or this tree alone, without ``--ref``).

    python benchmarks/bench_first_query.py [--ref /tmp/ref-main] [--rounds 6] [--docs N]
        [--collection synthetic|real-shaped] [--encoder BUNDLE] [--json OUT]

The index is a private copy of the one ``bench_local_backend.py`` caches for the collection
(benchmarks/.cache/local-123000 by default), opened once so its stamp is written; the query is
the collection's first. Before each cold process every file of the
copy is dropped from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``, what can be done
without root; the interpreter's and faiss's own files stay cached); a warm process follows
without the drop. Each process imports the local backend, opens the index, then runs one search
of each kind, sparse first or dense first (k=10, no words explained, one search thread), then
each again. Inside the process the time is split by part (faiss's import where a tree imports
it, the shards' checks, the graph's copy, check and opening, the search itself), timed by
wrapping those functions; ``faiss imported`` says whether the process ended with faiss loaded.
``--ref``: a checkout of the other commit with the compiled extensions copied in (as
bench_startup.py). Medians per tree, and the ratio current / ref.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _common  # benchmarks/ is on sys.path when a script runs
import numpy as np
from bench_local_backend import COLLECTIONS, index_path

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
t0 = time.perf_counter()
from d2s_search.backends.local import LocalBackend, cache, graph
from bench_local_backend import COLLECTIONS
q = COLLECTIONS[sys.argv[5]].queries(1)[0]
parts = {}

def timed(owner, name, key):
    if not hasattr(owner, name):
        return
    fn = getattr(owner, name)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[key] = parts.get(key, 0.0) + time.perf_counter() - start
    setattr(owner, name, wrapper)

timed(graph, "available", "import faiss")
timed(cache.Shard, "validate", "shard checks")
timed(graph, "huge_page_copy", "graph copy")
timed(graph, "layout", "graph check")
timed(graph, "check", "graph check")
timed(graph, "open_index", "graph read by faiss")
if hasattr(graph, "OpenedGraph"):
    timed(graph.OpenedGraph, "__init__", "graph opened")
timed(graph, "search", "graph search")
imported = time.perf_counter()
backend = LocalBackend(sys.argv[1], threads=1)
backend.open(None, create=False)
opened = time.perf_counter()
out = {"import": imported - t0, "open": opened - imported}
if sys.argv[4]:  # what `d2s-search query` does between opening the index and searching it
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    Encoder(Bundle.load(sys.argv[4]), device="cpu", threads=1).encode_texts(["dogs in a car"])
    out["query encoder"] = time.perf_counter() - opened
searches = {"sparse": lambda: backend.sparse_search(q.full, 10, explain=0),
            "dense": lambda: backend.dense_search(q.dense, 10, explain=0)}
for round_ in ("first", "second"):
    for kind in sys.argv[2].split(","):
        before = dict(parts)
        start = time.perf_counter()
        searches[kind]()
        out[f"{round_} {kind}"] = time.perf_counter() - start
        if round_ == "first":
            for key, value in parts.items():
                if value != before.get(key, 0.0):
                    out[f"first {kind}: {key}"] = value - before.get(key, 0.0)
out = {key: value * 1000 for key, value in out.items()}
out["faiss imported"] = float("faiss" in sys.modules)
print(json.dumps(out))
"""


def drop_pages(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def child(tree: Path, index: Path, order: str, encoder: str = "", collection: str = "synthetic") -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CHILD, str(index), order, str(Path(__file__).parent), encoder,
                           collection],
                          env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", help="the other code tree (its extensions built); without it this tree alone")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--collection", choices=tuple(COLLECTIONS), default="synthetic")
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--encoder", default="", help="a bundle whose query encoder is loaded and run between "
                        "opening and searching, as `d2s-search query` does (its vectors are not searched)")
    parser.add_argument("--json", dest="json_out", help="also write the results to this file")
    args = parser.parse_args()
    summary = _common.provenance(threads="1 search thread")
    args.encoder = str(Path(args.encoder).resolve()) if args.encoder else ""  # the children run in their trees
    trees = {"current": _common.ROOT, **({"ref": Path(args.ref).resolve()} if args.ref else {})}
    summary["collection"], summary["docs"] = args.collection, args.docs
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
        index = Path(tmp) / "index"
        shutil.copytree(index_path(args.cache, args.collection, args.docs), index)
        child(trees["current"], index, "sparse,dense", "", args.collection)  # read in full once; writes its stamp
        for round_ in range(args.rounds):
            names = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
            for order in ("sparse,dense", "dense,sparse"):
                for state in ("cold", "warm"):
                    for name in names:
                        if state == "cold":
                            drop_pages(index)
                        else:
                            child(trees[name], index, order, args.encoder, args.collection)  # pages back in
                        runs.setdefault(f"{name}|{state}|{order}", []).append(
                            child(trees[name], index, order, args.encoder, args.collection))
    rows = {}
    for key, samples in runs.items():
        name, state, order = key.split("|")
        medians = {part: round(float(np.median([s.get(part, 0.0) for s in samples])), 1)
                   for part in samples[0].keys() | {p for s in samples for p in s}}
        rows.setdefault(f"{state}, {order.replace(',', ' then ')} first", {})[name] = medians
    summary["rows"] = rows
    _common.finish(summary)
    print(render(summary))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))


def render(summary: dict) -> str:
    out = []
    for case, trees in summary["rows"].items():
        ref = trees.get("ref")
        parts = sorted(trees["current"].keys() | (ref or {}).keys(),
                       key=lambda p: (not p.startswith(("import", "open")), p))
        if ref is None:
            rows = [[part, trees["current"][part]] for part in parts]
            out.append(f"{case} (median ms)\n\n" + _common.table(["part", "current"], rows))
            continue
        rows = [[part, ref.get(part, 0.0), trees["current"].get(part, 0.0),
                 f"{trees['current'].get(part, 0.0) / ref[part]:.2f}x" if ref.get(part) else "-"]
                for part in parts]
        out.append(f"{case} (median ms)\n\n" + _common.table(["part", "ref", "current", "current / ref"], rows))
    return "\n\n".join(out)


if __name__ == "__main__":
    main()
