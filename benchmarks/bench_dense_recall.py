"""Recall of the local index's approximate dense search (the inverted file used above
``APPROXIMATE_DENSE_FROM`` documents) against exact search, on real and synthetic vectors.

    python benchmarks/bench_dense_recall.py [--synthetic 123000] [--queries 200]

Real: the CLIP ViT-B/32 embeddings in ../shared/data/flickr8k-100-clip-b32/ (100 distinct
images; the 500 captions as queries). Synthetic: random unit vectors (no cluster structure:
the worst case for any inverted file). Both go through ``LocalBackend`` with the threshold
lowered to 0, next to the exact plan of the same backend in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.synthetic import dense_vectors  # noqa: E402
from d2s_search.backends import local as local_pkg  # noqa: E402
from d2s_search.backends.base import Document, IndexIdentity  # noqa: E402
from d2s_search.backends.local import backend as backend_mod  # noqa: E402

# ../shared/data beside the clone, or D2S_SHARED_DATA.
CLIP = Path(os.environ.get("D2S_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data") / "flickr8k-100-clip-b32"


def index_of(vectors: np.ndarray, folder: Path, approximate: bool) -> local_pkg.LocalBackend:
    backend_mod.APPROXIMATE_DENSE_FROM = 0 if approximate else 10**12
    b = local_pkg.LocalBackend(folder / ("ivf" if approximate else "exact"))
    b.open(IndexIdentity(f"dense-{len(vectors)}", vectors.shape[1], "recall"))
    for lo in range(0, len(vectors), 5000):
        b.upsert([Document(id=f"{i:064x}", path=f"/{i}", size_bytes=0, width=0, height=0, sparse={"x": 1.0},
                           dense=vectors[i]) for i in range(lo, min(lo + 5000, len(vectors)))])
    b._search_state()
    return b


def measure(name: str, vectors: np.ndarray, queries: np.ndarray, k: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        exact, approx = index_of(vectors, Path(tmp), False), index_of(vectors, Path(tmp), True)
        recalls, t_exact, t_approx = [], [], []
        for q in queries:
            t0 = time.perf_counter()
            want = {h.id for h in exact.dense_search(q, k, explain=0)}
            t1 = time.perf_counter()
            got = {h.id for h in approx.dense_search(q, k, explain=0)}
            t2 = time.perf_counter()
            t_exact.append(t1 - t0)
            t_approx.append(t2 - t1)
            recalls.append(len(want & got) / len(want))
        clusters = len(approx._search_state().centroids)
        return {"vectors": name, "documents": len(vectors), "queries": len(queries), "k": k, "clusters": clusters,
                "probed": min(clusters, max(8, clusters // backend_mod.DENSE_PROBE_DIVISOR)),
                f"recall@{k}": round(float(np.mean(recalls)), 3),
                "exact_p50_ms": round(float(np.median(t_exact)) * 1000, 3),
                "approximate_p50_ms": round(float(np.median(t_approx)) * 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthetic", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    out = {"command": "python benchmarks/bench_dense_recall.py " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": os.getloadavg(), "runs": []}
    if CLIP.is_dir():
        images = np.load(CLIP / "image_embeddings.npy")[::5]  # 100 distinct images
        captions = np.load(CLIP / "text_embeddings.npy")
        for k in (1, 10):
            out["runs"].append(measure("CLIP ViT-B/32 flickr8k-100 (captions -> images)", images, captions, k))
    else:
        out["runs"].append({"vectors": "CLIP", "skipped": f"{CLIP} not found"})
    if args.synthetic:
        vectors = dense_vectors(args.synthetic, 256, seed=1)
        queries = dense_vectors(args.queries, 256, seed=2)
        out["runs"].append(measure("random unit vectors, 256-d", vectors, queries, 10))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
