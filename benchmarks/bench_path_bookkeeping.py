"""Cost of keeping one path per document in the local index, per ingest batch: the write
(``upsert``: which documents hold the batch's paths, the copies table) and the lookups of a
re-ingest of unchanged files (``ids_present`` + ``paths_of``: every path of the known ids).

    python benchmarks/bench_path_bookkeeping.py [--docs 20000] [--batch 32] [--repeats 3]

Synthetic documents (tests/reliability/local_index_fixtures.py), a fresh index per repeat;
the median of ``--repeats`` per batch. Run it from two checkouts (before and after) to compare:
an ingest batch also decodes and encodes its pictures, hundreds of milliseconds on a CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2s_search.backends.local import LocalBackend  # noqa: E402
from tests.reliability.local_index_fixtures import IDENTITY, synthetic_docs  # noqa: E402


def one_run(docs: list, batch: int) -> tuple[float, float]:
    """(ms per upsert batch, ms per re-ingest lookup batch)."""
    with tempfile.TemporaryDirectory() as folder:
        backend = LocalBackend(Path(folder) / "index")
        backend.open(IDENTITY)
        try:
            batches = [docs[s : s + batch] for s in range(0, len(docs), batch)]
            start = time.perf_counter()
            for chunk in batches:
                backend.upsert(chunk)
            written = time.perf_counter() - start
            start = time.perf_counter()
            for chunk in batches:
                ids = [d.id for d in chunk]
                backend.ids_present(ids)
                backend.paths_of(ids)
            looked = time.perf_counter() - start
        finally:
            backend.close()
    return written * 1000 / len(batches), looked * 1000 / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    docs = synthetic_docs(args.docs, 7)
    runs = [one_run(docs, args.batch) for _ in range(args.repeats)]
    write = statistics.median(r[0] for r in runs)
    look = statistics.median(r[1] for r in runs)
    print(
        f"{args.docs} documents, batches of {args.batch}: upsert {write:.3f} ms/batch, "
        f"re-ingest lookups {look:.3f} ms/batch (median of {args.repeats})"
    )


if __name__ == "__main__":
    main()
