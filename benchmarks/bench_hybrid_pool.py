"""Hybrid candidates per side: the fused top-k's recall against fusion over every document, and
p50 latency, for pools of c*k candidates per side, on the synthetic 123k index (or another
collection bench_local_backend.py builds: --collection, --docs; or the photos).

    python benchmarks/bench_hybrid_pool.py [--collection synthetic|real-shaped] [--docs 123000]
        [--k 10,1000] [--factors 1,2,3,5,10] [--queries 100] [--json OUT]
    python benchmarks/bench_hybrid_pool.py --photos --k 10,50 [--queries 200]

``--photos``: the flickr8k-800 photos as the quick start's index stored them (real sparse and
dense vectors of the offline model, benchmarks/.cache/photos-800, a copy searched), queried
with held-out captions of the last 400 photos (evenly spaced; every 10th for 200) through the
same bundle. There each caption's own photo also gives relevance: MRR@10 of every pool and of
the reference.

The reference per query is the local index's own fusion with every document a candidate on
both sides (a pool of the collection's size: each side's scores over all documents, min-max
normalised over all of them); it also reports how much of that top-k a pool of half the
collection keeps (RRF: all of it; min-max, whose normalisation moves with its pool: not all). Each pool (c*k, c in --factors) is timed query by query, pools taking turns
(which goes first rotating), through ``run_query`` with 5 words explained, one search thread;
the ratios are against c = 10 (max(100, 10k), the hybrid's pool at k <= 100; at k=1000 it
fuses 2,000 a side, c = 2), measured in the same run.
The index is the one ``bench_local_backend.py`` builds and caches under benchmarks/.cache/.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import _common  # benchmarks/ is on sys.path when a script runs
import numpy as np

_common.use_repository()

from bench_local_backend import COLLECTIONS, build_index, index_path  # noqa: E402

from d2s_search.backends.local import LocalBackend  # noqa: E402
from d2s_search.search import FUSIONS, SearchOptions, run_query  # noqa: E402

OLD_FACTOR = 10  # max(100, 10k): the hybrid's pool up to k=100, and at k=1000 before it fused k + max(k, 1000)


def top_ids(backend: LocalBackend, query, k: int, pool: int, fusion: str) -> list[str]:
    options = SearchOptions(mode="hybrid", k=k, window=pool, fusion=fusion, explain=0)
    return [h.id for h in run_query(backend, query, options).hits]


def measure(backend: LocalBackend, queries: list, n_docs: int, ks: list[int], factors: list[int],
            relevant: list[str] | None = None) -> dict:
    """``relevant``: each query's own document (the photo its caption describes), whose rank in
    the fused list gives MRR@10 for every pool and for the reference."""
    rows = {}
    for k in ks:
        for fusion in FUSIONS:
            reference = [top_ids(backend, q, k, n_docs, fusion) for q in queries]
            half = [top_ids(backend, q, k, n_docs // 2, fusion) for q in queries]
            recall = {c: [] for c in factors}
            seconds = {c: [] for c in factors}
            found = {c: [] for c in factors}
            for i, (q, ref) in enumerate(zip(queries, reference)):
                expected = set(ref)
                for c in factors[i % len(factors):] + factors[:i % len(factors)]:  # pools take turns, first in rotation
                    options = SearchOptions(mode="hybrid", k=k, window=c * k, fusion=fusion, explain=5)
                    t0 = time.perf_counter()
                    hits = run_query(backend, q, options).hits
                    seconds[c].append(time.perf_counter() - t0)
                    recall[c].append(len({h.id for h in hits} & expected) / len(expected))
                    if relevant is not None:
                        found[c].append([h.id for h in hits])
            old_p50 = float(np.median(seconds[OLD_FACTOR]))
            rows[f"{fusion} @{k}"] = {
                "half_collection_recall": round(float(np.mean([len(set(a) & set(b)) / len(b)
                                                               for a, b in zip(half, reference)])), 4),
                "pools": {c: {"pool": c * k, "recall_mean": round(float(np.mean(recall[c])), 4),
                              "recall_min": round(float(np.min(recall[c])), 4),
                              "p50_ms": round(float(np.median(seconds[c])) * 1000, 3),
                              "p50_vs_old": round(float(np.median(seconds[c])) / old_p50, 3),
                              **({"mrr_at_10": mrr_at_10(found[c], relevant)} if relevant is not None else {})}
                          for c in factors},
                **({"reference_mrr_at_10": mrr_at_10(reference, relevant)} if relevant is not None else {}),
            }
            print(f"{fusion} @{k}: " + ", ".join(f"c={c} {v['recall_mean']:.4f}/{v['recall_min']:.2f} "
                                                 f"{v['p50_ms']:.2f} ms" for c, v in rows[f'{fusion} @{k}']['pools'].items()),
                  flush=True)
    return rows


def mrr_at_10(rankings: list[list[str]], relevant: list[str]) -> float:
    """Mean over queries of 1 / the rank of the query's own document in its top 10 (0 if absent)."""
    return round(float(np.mean([1.0 / (ids[:10].index(want) + 1) if want in ids[:10] else 0.0
                                for ids, want in zip(rankings, relevant)])), 4)


def photo_queries(index, folder: Path, n: int) -> tuple[list, list[str]]:
    """Held-out captions (the last 400 photos', evenly spaced: every 10th for 200), encoded once
    by the index's bundle, and the id of each caption's photo."""
    from d2s_search.search import encode_text_query

    with open(_common.DATA / "flickr8k-800" / "captions.txt", newline="") as f:
        rows = [(r["image"], r["caption"]) for r in csv.DictReader(f)]
    photos = sorted({image for image, _ in rows})
    held = set(photos[len(photos) // 2:])
    pairs = [(image, c) for image, c in rows if image in held]
    pairs = pairs[:: max(1, len(pairs) // n)][:n]
    encoder = index._encoder()
    with sqlite3.connect(f"file:{folder / 'index.sqlite'}?mode=ro", uri=True) as db:
        ids = {Path(path).name: doc_id for doc_id, path in db.execute("SELECT id, path FROM docs")}
    return [encode_text_query(encoder, text) for _, text in pairs], [ids[image] for image, _ in pairs]


def render(summary: dict) -> str:
    factors = list(next(iter(summary["rows"].values()))["pools"])
    relevance = "reference_mrr_at_10" in next(iter(summary["rows"].values()))
    headers = ["fusion @k", "half-collection pool", *(["every document: MRR@10"] if relevance else []),
               *[f"c={c}: recall mean / min, p50 vs c={OLD_FACTOR}{', MRR@10' if relevance else ''}" for c in factors]]
    rows = [[name, f"{row['half_collection_recall']:.4f}",
             *([f"{row['reference_mrr_at_10']:.3f}"] if relevance else []),
             *[f"{p['recall_mean']:.4f} / {p['recall_min']:.2f}, {p['p50_vs_old']:.2f}x"
               + (f", {p['mrr_at_10']:.3f}" if relevance else "") for p in row["pools"].values()]]
            for name, row in summary["rows"].items()]
    return _common.table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--k", default="10,1000")
    parser.add_argument("--factors", default="1,2,3,5,10")
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--collection", choices=tuple(COLLECTIONS), default="synthetic",
                        help="the index bench_local_backend.py builds for it (--docs documents)")
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
                backend, (queries, relevant) = index._open_backend(), photo_queries(index, Path(tmp) / "index", args.queries)
                summary["rows"] = measure(backend, queries, backend.count(), ks, factors, relevant)
    else:
        path = index_path(args.cache, args.collection, args.docs)
        backend, _ = build_index(path, args.docs, collection=args.collection)
        backend.close()
        backend = LocalBackend(path, threads=1)
        backend.open(None, create=False)
        queries = COLLECTIONS[args.collection].queries(args.queries)
        for q in queries[:10]:  # page the index in before timing
            run_query(backend, q, SearchOptions(mode="hybrid", k=10))
        summary["rows"] = measure(backend, queries, args.docs, ks, factors)
    _common.finish(summary)
    print(render(summary))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
