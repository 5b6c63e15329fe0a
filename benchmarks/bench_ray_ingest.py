"""``d2s-search ingest --engine ray`` against one process, same photos, same machine, one run.

    python benchmarks/bench_ray_ingest.py [--photos 800] [--workers 1,2] [--rounds 2] [--json OUT]

Each round ingests the flickr8k-800 photos (offline model) into a fresh local index with one
process, then with Ray on this machine for each worker count (a Ray instance the command starts
and stops itself). The rate with Ray is counted once its workers have loaded the bundle
(``images_per_second`` of the JSON report); Ray's own start-up is reported apart. Every Ray
index is checked against the one-process index: the same ids, paths and words.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _common

_common.use_repository()


def ingest(folder: Path, bundle: Path, index: Path, env: dict, *extra: str) -> dict:
    exe = str(Path(sys.executable).with_name("d2s-search"))
    done = subprocess.run([exe, "ingest", str(folder), "--bundle", str(bundle), "--index", str(index), "--json", *extra],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ingest {' '.join(extra)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def words(index: Path) -> dict[str, tuple[list[str], set[str]]]:
    from d2s_search.backends.local import LocalBackend

    store = LocalBackend(index)
    store.open(None, create=False)
    try:
        ids = sorted({doc_id for doc_id, _ in store.document_paths()})
        paths = store.paths_of(ids)
        return {d.id: (sorted(paths[d.id]), set(d.sparse)) for d in store.get(ids)}
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=800)
    parser.add_argument("--workers", default="1,2", help="worker counts to measure, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    bundle, _, env = _common.photo_index(photos=args.photos)
    folder = bundle.parent / "images"
    runs: dict[str, list[dict]] = {"process": [], **{f"ray-{w}": [] for w in counts}}
    same = True
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            reference = Path(tmp) / "one"
            runs["process"].append(ingest(folder, bundle, reference, env))
            expected = words(reference)
            for w in counts:
                index = Path(tmp) / f"ray-{w}"
                runs[f"ray-{w}"].append(ingest(folder, bundle, index, env, "--engine", "ray", "--workers", str(w)))
                same = same and words(index) == expected
    summary = _common.provenance(threads="one process: 2 ONNX Runtime threads, 2 decoding threads; Ray: 1 CPU "
                                         "(1 ONNX Runtime thread) a worker")
    summary |= {"photos": args.photos, "rounds": args.rounds, "identical_documents": same, "results": {}}
    for name, reports in runs.items():
        summary["results"][name] = {
            "images_per_second": statistics.median(r["images_per_second"] for r in reports),
            "seconds": statistics.median(r["seconds"] for r in reports),
            "start_seconds": statistics.median(r["workers"]["start_seconds"] for r in reports) if "workers" in reports[0]
            else None,
        }
    print(render(summary))
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    results = summary["results"]
    base = results["process"]["images_per_second"]
    rows = []
    for name, r in results.items():
        engine = "one process" if name == "process" else f"Ray, {name.split('-')[1]} worker(s)"
        start = "–" if r["start_seconds"] is None else f"{r['start_seconds']:.1f} s"
        rows.append([engine, start, f"{r['images_per_second']:.1f}", _common.ratio(r["images_per_second"], base),
                     f"{r['seconds']:.1f} s"])
    table = _common.table(["ingest", "Ray start-up", "images/s once started", "ratio", "wall time"], rows)
    note = (f"{summary['photos']} photos into a new local index, median of {summary['rounds']} round(s); "
            f"documents identical to one process's (ids, paths, words): {'yes' if summary['identical_documents'] else 'NO'}.")
    return "\n\n".join([table, note, _common.caption(summary)])


if __name__ == "__main__":
    main()
