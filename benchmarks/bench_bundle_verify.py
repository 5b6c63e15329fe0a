"""What checking a model bundle costs at start-up: every byte hashed (ingest, and the first
load), against the stamp every later load compares, and the size of each file as the floor.

    python benchmarks/bench_bundle_verify.py [--mb 120] [--repeats 5] [--json OUT]

Builds a bundle-shaped folder in a temp dir: ``image.onnx`` and ``text.onnx`` of random bytes
(``--mb`` in total, split like a CLIP-B bundle), a small tokenizer and vocab, and a manifest
with the right sizes, hashes and fingerprint (``Bundle.load`` checks files, it does not parse
ONNX). Times ``Bundle.load`` (median of ``--repeats``) with the page cache warm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import _common

_common.use_repository()

from d2s_search.bundle import BUNDLE_FORMAT, Bundle, compute_fingerprint  # noqa: E402
from d2s_search.bundle_stamp import STAMP_NAME  # noqa: E402


def make_bundle(root: Path, total_mb: int) -> Path:
    sizes = {"image.onnx": int(total_mb * 0.55 * 2**20), "text.onnx": int(total_mb * 0.45 * 2**20),
             "tokenizer.json": 700_000, "vocab.txt": 230_000}
    files = {}
    for name, size in sizes.items():
        data = os.urandom(size)
        (root / name).write_bytes(data)
        files[name] = {"bytes": size, "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": BUNDLE_FORMAT, "model": {"name": "bench"}, "dense_dim": 512, "vocab_size": 30522,
                "text": {"max_length": 77, "excluded_ids": []}, "image": {"size": 224}, "head": {}, "precision": "fp32",
                "files": files}
    manifest["fingerprint"] = compute_fingerprint(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def timed(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1000)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp), args.mb)
        Bundle.load(bundle, verify_hashes=True)  # warm the page cache and write the stamp

        def size_only() -> None:  # the cheapest check there is: stat each file
            manifest = json.loads((bundle / "manifest.json").read_text())
            for name, entry in manifest["files"].items():
                assert (bundle / name).stat().st_size == entry["bytes"]

        def first_load() -> None:
            (bundle / STAMP_NAME).unlink(missing_ok=True)
            Bundle.load(bundle)

        checks = {"size of each file only (reference)": timed(size_only, args.repeats),
                  "every byte hashed (ingest; any load without a valid stamp)": timed(
                      lambda: Bundle.load(bundle, verify_hashes=True), args.repeats),
                  "first load: hash and write the stamp": timed(first_load, args.repeats),
                  "later loads: the stamp matches the files' stat": timed(lambda: Bundle.load(bundle), args.repeats)}
    summary.update({"bundle_mb": args.mb, "repeats": args.repeats, "ms": {k: round(v, 3) for k, v in checks.items()}})
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    ms = summary["ms"]
    reference = next(iter(ms.values()))
    rows = [[name, f"{v:.2f}", _common.ratio(v, reference)] for name, v in ms.items()]
    return (_common.table(["bundle check", "ms", "vs size only"], rows)
            + f"\n\nA {summary['bundle_mb']} MB bundle of random bytes, page cache warm, median of {summary['repeats']}.\n\n"
            + _common.caption(summary))


if __name__ == "__main__":
    main()
