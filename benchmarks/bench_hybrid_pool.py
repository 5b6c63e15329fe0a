"""Hybrid candidates per side: the fused top-k's recall against fusion over every document, and
p50 latency, for pools of c*k candidates per side, on the synthetic 123k index (or the photos).

    python benchmarks/bench_hybrid_pool.py [--docs 123000] [--queries 100] [--json OUT]
    python benchmarks/bench_hybrid_pool.py --photos --k 10,50 [--queries 200]

``--photos``: the flickr8k-800 photos as the quick start's index stored them (real sparse and
dense vectors of the offline model, benchmarks/.cache/photos-800, a copy searched), queried
with held-out captions of the last 400 photos (every 10th) through the same bundle.

The reference per query is the local index's own fusion with every document a candidate on
both sides (a pool of the collection's size: each side's scores over all documents, min-max
normalised over all of them); it also reports how much of that top-k a pool of half the
collection keeps (RRF: all of it; min-max, whose normalisation moves with its pool: not all). Each pool (c*k, c in --factors) is timed query by query, pools taking turns
(which goes first rotating), through ``run_query`` with 5 words explained, one search thread;
the ratios are against the pool the hybrid plan used before (max(100, 10k), c = 10 at k=10
and k=1000), measured in the same run.
The index is the one ``bench_local_backend.py`` builds and caches under benchmarks/.cache/.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from pathlib import Path

import _common  # benchmarks/ is on sys.path when a script runs
import numpy as np

_common.use_repository()

from bench_local_backend import benchmark_queries, build_index  # noqa: E402

from d2s_search.backends.local import LocalBackend  # noqa: E402
from d2s_search.search import FUSIONS, SearchOptions, run_query  # noqa: E402

OLD_FACTOR = 10  # the pool before: max(100, 10k), c = 10 at both k measured


def top_ids(backend: LocalBackend, query, k: int, pool: int, fusion: str) -> list[str]:
    options = SearchOptions(mode="hybrid", k=k, window=pool, fusion=fusion, explain=0)
    return [h.id for h in run_query(backend, query, options).hits]


def measure(backend: LocalBackend, queries: list, n_docs: int, ks: list[int], factors: list[int]) -> dict:
    rows = {}
    for k in ks:
        for fusion in FUSIONS:
            reference = [top_ids(backend, q, k, n_docs, fusion) for q in queries]
            half = [top_ids(backend, q, k, n_docs // 2, fusion) for q in queries]
            recall = {c: [] for c in factors}
            seconds = {c: [] for c in factors}
            for i, (q, ref) in enumerate(zip(queries, reference)):
                expected = set(ref)
                for c in factors[i % len(factors):] + factors[:i % len(factors)]:  # pools take turns, first in rotation
                    options = SearchOptions(mode="hybrid", k=k, window=c * k, fusion=fusion, explain=5)
                    t0 = time.perf_counter()
                    hits = run_query(backend, q, options).hits
                    seconds[c].append(time.perf_counter() - t0)
                    recall[c].append(len({h.id for h in hits} & expected) / len(expected))
            old_p50 = float(np.median(seconds[OLD_FACTOR]))
            rows[f"{fusion} @{k}"] = {
                "half_collection_recall": round(float(np.mean([len(set(a) & set(b)) / len(b)
                                                               for a, b in zip(half, reference)])), 4),
                "pools": {c: {"pool": c * k, "recall_mean": round(float(np.mean(recall[c])), 4),
                              "recall_min": round(float(np.min(recall[c])), 4),
                              "p50_ms": round(float(np.median(seconds[c])) * 1000, 3),
                              "p50_vs_old": round(float(np.median(seconds[c])) / old_p50, 3)} for c in factors},
            }
            print(f"{fusion} @{k}: " + ", ".join(f"c={c} {v['recall_mean']:.4f}/{v['recall_min']:.2f} "
                                                 f"{v['p50_ms']:.2f} ms" for c, v in rows[f'{fusion} @{k}']['pools'].items()),
                  flush=True)
    return rows


def photo_queries(index, n: int) -> list:
    """Held-out captions (the last 400 photos', every 10th), encoded once by the index's bundle."""
    from d2s_search.search import encode_text_query

    with open(_common.DATA / "flickr8k-800" / "captions.txt", newline="") as f:
        rows = [(r["image"], r["caption"]) for r in csv.DictReader(f)]
    photos = sorted({image for image, _ in rows})
    held = set(photos[len(photos) // 2:])
    texts = [c for image, c in rows if image in held][::10][:n]
    encoder = index._encoder()
    return [encode_text_query(encoder, text) for text in texts]


def render(summary: dict) -> str:
    factors = list(next(iter(summary["rows"].values()))["pools"])
    headers = ["fusion @k", "half-collection pool", *[f"c={c}: recall mean / min, p50 vs c={OLD_FACTOR}" for c in factors]]
    rows = [[name, f"{row['half_collection_recall']:.4f}",
             *[f"{p['recall_mean']:.4f} / {p['recall_min']:.2f}, {p['p50_vs_old']:.2f}x" for p in row["pools"].values()]]
            for name, row in summary["rows"].items()]
    return _common.table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--k", default="10,1000")
    parser.add_argument("--factors", default="1,2,3,5,10")
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--photos", action="store_true", help="the 800 real photos and held-out captions instead")
    parser.add_argument("--json", dest="json_out", help="also write the results to this file")
    args = parser.parse_args()
    factors = [int(c) for c in args.factors.split(",")]
    if OLD_FACTOR not in factors:
        factors.append(OLD_FACTOR)
    summary = _common.provenance(threads="1 search thread")
    ks = [int(k) for k in args.k.split(",")]
    if args.photos:
        from d2s_search import Index

        photos = Path(args.cache) / "photos-800"
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(photos / "index", Path(tmp) / "index")
            with Index.open(Path(tmp) / "index", bundle=photos / "bundle", search_threads=1) as index:
                backend, queries = index._open_backend(), photo_queries(index, args.queries)
                summary["rows"] = measure(backend, queries, backend.count(), ks, factors)
    else:
        path = Path(args.cache) / f"local-{args.docs}"
        backend, _ = build_index(path, args.docs)
        backend.close()
        backend = LocalBackend(path, threads=1)
        backend.open(None, create=False)
        queries = benchmark_queries(args.queries)
        for q in queries[:10]:  # page the index in before timing
            run_query(backend, q, SearchOptions(mode="hybrid", k=10))
        summary["rows"] = measure(backend, queries, args.docs, ks, factors)
    _common.finish(summary)
    print(render(summary))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
