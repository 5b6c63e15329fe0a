"""Cost of checking a bundle at startup: size-only (the old query/serve check), a full
hash of every file (ingest's check, and the first load), and the stamp (every later load).

    python benchmarks/bench_bundle_verify.py [--mb 120] [--repeats 5]

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
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp), args.mb)
        Bundle.load(bundle, verify_hashes=True)  # warm the page cache and write the stamp

        def size_only() -> None:  # the old query/serve check: stat each file
            manifest = json.loads((bundle / "manifest.json").read_text())
            for name, entry in manifest["files"].items():
                assert (bundle / name).stat().st_size == entry["bytes"]

        def first_load() -> None:
            (bundle / STAMP_NAME).unlink(missing_ok=True)
            Bundle.load(bundle)

        reference = timed(size_only, args.repeats)
        full = timed(lambda: Bundle.load(bundle, verify_hashes=True), args.repeats)
        first = timed(first_load, args.repeats)
        stamped = timed(lambda: Bundle.load(bundle), args.repeats)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; "
          f"bundle {args.mb} MB; median of {args.repeats}")
    print("| check | ms | vs size-only |")
    print("|---|---|---|")
    for label, ms in (("size only (old query/serve)", reference), ("full hash (ingest)", full),
                      ("first load: hash + write stamp", first), ("later loads: stamp", stamped)):
        print(f"| {label} | {ms:.2f} | {ms / reference:.1f}x |")


if __name__ == "__main__":
    main()
