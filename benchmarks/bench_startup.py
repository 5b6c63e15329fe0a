"""Start-up of the commands a user waits on, for two code trees alternated round by round.

    python benchmarks/bench_startup.py --ref /tmp/ref-main [--rounds 10] [--sizes 800,123000] [--json OUT]

Each timing is a new process (the page cache warm: "cold" means a fresh interpreter, as every
`d2s-search query` is), run with ``python -m d2s_search.cli`` and PYTHONPATH set to the tree:

* query: ``query TEXT --no-serve`` from process start to exit;
* serve: ``serve --json --port 0`` from process start to its ``{"ready": true, ...}`` line on
  stdout (index opened, models loaded, warm-up searches run), then stopped with Ctrl+C;
* open + first searches: inside a new process (no interpreter start, no model): import the
  local backend, open the index, one sparse and one dense search (a stored document's vectors);
  the part of a cold query these trees differ in;
* query, unstamped (123k, 3 rounds): the current tree's query after the cache's stamp was
  removed (the first open after an upgrade or a copy of the index reads every cache byte
  once), against the ref tree's ordinary query.

Two sizes: the flickr8k-800 photos of ../shared/data ingested with the offline model bundle
(``export-onnx --model offline-mini``), and 123,000 synthetic documents (benchmarks/synthetic.py,
as benchmarks/bench_local_backend.py makes them) written through the real backend under that
bundle's identity, their words drawn from its vocabulary and their vectors of its size: the
real CLI encodes the query text with the real model and searches them. Both indexes are built
once by the current tree and cached under --cache. The trees take turns in every round (the
order alternating), so a change in the machine's load hits both alike; the table gives the
median of each and the ratio new/ref. ``--ref``: a checkout of the other commit with the
compiled extensions copied in (``git worktree add /tmp/ref-main main`` and
``cp d2s_search/backends/local/*.so /tmp/ref-main/d2s_search/backends/local/``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

ROOT = _common.ROOT
_common.use_repository()
DATA = ROOT.parent / "shared" / "data" / "flickr8k-800" / "images"
TEXT = "a dog running on the grass"


def cli(tree: Path, env: dict, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "d2s_search.cli", *args],
        env=dict(env, PYTHONPATH=str(tree)),
        **kwargs,
    )


def bundle_path(cache: Path, env: dict) -> Path:
    path = cache / "bundle-offline-mini"
    if not (path / "manifest.json").is_file():
        cli(
            ROOT,
            env,
            "export-onnx",
            "--model",
            "offline-mini",
            "--out",
            str(path),
            check=True,
            stdout=sys.stderr,
        )
    return path


def photo_index(cache: Path, bundle: Path, env: dict) -> Path:
    path = cache / "index-flickr8k-800"
    cli(
        ROOT,
        env,
        "ingest",
        str(DATA),
        "--bundle",
        str(bundle),
        "--index",
        str(path),
        "--json",
        check=True,
        stdout=subprocess.DEVNULL,
    )  # skips what is stored
    return path


def synthetic_index(cache: Path, bundle_dir: Path, n_docs: int, seed: int = 0) -> Path:
    """``n_docs`` documents as bench_local_backend builds them (20-200 Zipf-drawn words, a unit
    vector), under the bundle's identity: words from its vocabulary, vectors of its size."""
    from benchmarks.synthetic import dense_vectors, sample_vectors, zipf_probabilities
    from d2s_search.backends.base import Document
    from d2s_search.backends.local import LocalBackend
    from d2s_search.bundle import Bundle

    bundle = Bundle.load(bundle_dir)
    path = cache / f"index-synthetic-{n_docs}"
    backend = LocalBackend(path)
    if backend.exists():
        backend.open(bundle.identity(), create=False)
        done = backend.count() == n_docs
        backend.close()
        if done:
            return path
        backend.drop()
    backend.open(bundle.identity())
    terms = [t for t, allowed in zip(bundle.terms, bundle.allowed_mask.tolist()) if allowed]
    probs = zipf_probabilities(vocab=len(terms), seed=seed)
    for start in range(0, n_docs, 5000):
        n = min(5000, n_docs - start)
        vectors = sample_vectors(n, 20, 200, probs, seed=seed + 1 + start)
        dense = dense_vectors(n, bundle.dense_dim, seed=seed + 2 + start)
        backend.upsert(
            [
                Document(
                    id=f"{start + i:064x}",
                    path=f"/synthetic/{start + i}.jpg",
                    size_bytes=0,
                    width=0,
                    height=0,
                    sparse={terms[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())},
                    dense=dense[i],
                )
                for i, (ids, ws) in enumerate(vectors)
            ]
        )
        print(f"\rbuilding {path.name}: {start + n}/{n_docs}", end="", file=sys.stderr)
    print(file=sys.stderr)
    backend.prepare_search()
    backend.close()
    return path


def time_query(tree: Path, env: dict, index: Path, bundle: Path) -> float:
    start = time.perf_counter()
    done = cli(
        tree,
        env,
        "query",
        TEXT,
        "--no-serve",
        "--index",
        str(index),
        "--bundle",
        str(bundle),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"query failed in {tree} ({done.returncode}): {done.stderr}")
    return took


def time_serve(tree: Path, env: dict, index: Path, bundle: Path) -> float:
    with tempfile.TemporaryDirectory() as thumbs, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "d2s_search.cli",
                "serve",
                "--json",
                "--port",
                "0",
                "--index",
                str(index),
                "--bundle",
                str(bundle),
                "--thumbnail-dir",
                thumbs,
            ],
            env=dict(env, PYTHONPATH=str(tree)),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        line = proc.stdout.readline()
        took = time.perf_counter() - start
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if '"ready": true' not in line:
            err.seek(0)
            raise SystemExit(f"serve did not start in {tree}: {err.read()}")
    return took


OPEN_AND_SEARCH = """
import json, sys, time
import numpy as np
start = time.perf_counter()
from d2s_search.backends.local import LocalBackend
backend = LocalBackend(sys.argv[1])
backend.open(None, create=False)
row = backend._connect(False).execute("SELECT id FROM docs ORDER BY seq LIMIT 1").fetchone()
(doc,) = backend.get([row[0]])
backend.sparse_search(doc.sparse, 10, explain=5)
backend.dense_search(np.asarray(doc.dense, dtype=np.float32), 10, explain=0)
print(json.dumps(time.perf_counter() - start))
"""


def time_open_and_search(tree: Path, env: dict, index: Path, bundle: Path) -> float:
    """In a new process, timed inside it (no interpreter start): import the backend, open the
    index, one sparse and one dense search (a stored document's vectors as the query)."""
    done = subprocess.run(
        [sys.executable, "-c", OPEN_AND_SEARCH, str(index)],
        env=dict(env, PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"open and search failed in {tree}: {done.stderr}")
    return float(done.stdout)


def unstamped_query(tree: Path, env: dict, index: Path, bundle: Path) -> float:
    for stamp in (index / "cache").glob("state-*/verified.json"):
        stamp.unlink()
    return time_query(tree, env, index, bundle)


PLANS = {"query": time_query, "serve": time_serve, "open + first searches": time_open_and_search}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ref", type=Path, required=True, help="the other code tree (with its .so files)"
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sizes", default="800,123000", help="800 (the photos) and/or a synthetic document count"
    )
    parser.add_argument("--cache", type=Path, default=ROOT / "benchmarks" / ".cache" / "startup")
    parser.add_argument("--json", dest="json_out", help="also write the record here")
    args = parser.parse_args()
    provenance = _common.provenance()
    trees = {"ref": args.ref.resolve(), "new": ROOT}
    args.cache.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("D2S_")}
    env["D2S_CONFIG_DIR"] = str(
        args.cache / "config"
    )  # remembered indexes, discovery files: not the user's
    bundle = bundle_path(args.cache, env)
    indexes = {}
    for size in (int(s) for s in args.sizes.split(",")):
        indexes[size] = (
            photo_index(args.cache, bundle, env)
            if size == 800
            else synthetic_index(args.cache, bundle, size)
        )
    for index in indexes.values():  # untimed: first opens (the new tree stamps the cache here)
        for tree in trees.values():
            for run in PLANS.values():
                run(tree, env, index, bundle)
    runs: dict[str, list[float]] = {}
    for round_no in range(args.rounds):
        order = list(trees) if round_no % 2 == 0 else list(trees)[::-1]
        for size, index in indexes.items():
            for plan, run in PLANS.items():
                for name in order:
                    runs.setdefault(f"{size}|{plan}|{name}", []).append(
                        run(trees[name], env, index, bundle)
                    )
            if size != 800 and round_no < 3:  # reads the whole cache: a few rounds tell it
                runs.setdefault(f"{size}|query, unstamped|new", []).append(
                    unstamped_query(ROOT, env, index, bundle)
                )
                runs.setdefault(f"{size}|query, unstamped|ref", []).append(
                    time_query(args.ref, env, index, bundle)
                )
                time_query(ROOT, env, index, bundle)  # stamped again
    rows = []
    for key in runs:
        size, plan, name = key.split("|")
        if name == "new":
            ref, new = runs[f"{size}|{plan}|ref"], runs[key]
            rows.append(
                {
                    "documents": int(size),
                    "start-up": plan,
                    "ref_median_s": statistics.median(ref),
                    "new_median_s": statistics.median(new),
                    "median_of_round_ratios": statistics.median(n / r for n, r in zip(new, ref)),
                }
            )
    record = {
        **provenance,
        "rounds": args.rounds,
        "trees": {k: str(v) for k, v in trees.items()},
        "results": rows,
        "runs_s": runs,
    }
    _common.finish(record)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(record, indent=1))
    print(render(record))


def render(record: dict) -> str:
    rows = [[f"{r['documents']:,}", r["start-up"], f"{r['ref_median_s']:.3f}", f"{r['new_median_s']:.3f}",
             f"{r['new_median_s'] / r['ref_median_s']:.3f}", f"{r['median_of_round_ratios']:.3f}"]
            for r in record["results"]]
    return (_common.table(["documents", "start-up", "ref median s", "new median s", "new / ref (medians)",
                           "new / ref (per round)"], rows)
            + f"\n\n{record['rounds']} rounds, the two trees alternated. " + _common.caption(record))


if __name__ == "__main__":
    main()
