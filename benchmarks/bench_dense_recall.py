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


def measure(name: str, vectors: np.ndarray, queries: np.ndarray, k: int, clusters: int | None = None) -> dict:
    """Recall of the approximate plan against the exact one; ``clusters`` fixes the cluster
    count (small real sets: the default rule would probe every cluster)."""
    backend_mod.DENSE_CLUSTERS = clusters
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
        floor = 8 if backend_mod.DENSE_CLUSTERS is None else 1
        return {"vectors": name, "documents": len(vectors), "queries": len(queries), "k": k, "clusters": clusters,
                "probed": min(clusters, max(floor, clusters // backend_mod.DENSE_PROBE_DIVISOR)),
                f"recall@{k}": round(float(np.mean(recalls)), 3),
                "exact_p50_ms": round(float(np.median(t_exact)) * 1000, 3),
                "approximate_p50_ms": round(float(np.median(t_approx)) * 1000, 3)}


def photo_runs(index: Path, bundle_path: Path, n_queries: int) -> list[dict]:
    """The flickr8k-800 photos as the ingest stored them; their captions through the same
    bundle's text encoder as queries."""
    import csv
    import sqlite3

    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder

    db = sqlite3.connect(index / "index.sqlite")
    vectors = np.stack([np.frombuffer(blob, dtype="<f4") for (blob,) in db.execute("SELECT dense FROM docs ORDER BY seq")])
    db.close()
    captions_file = CLIP.parent / "flickr8k-800" / "captions.txt"
    with open(captions_file, newline="") as f:
        captions = [row["caption"] for row in csv.DictReader(f)][::5][:n_queries]
    encoder = Encoder(Bundle.load(bundle_path), device="cpu")
    queries = np.vstack([encoder.encode_texts(captions[i : i + 32]).dense for i in range(0, len(captions), 32)])
    name = f"flickr8k-800 photos, {bundle_path.name} bundle (captions -> photos)"
    return [measure(name, vectors, queries, 10, clusters=c) for c in (16, 32)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthetic", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--photos-index", help="a local index of the flickr8k-800 photos (dense vectors from SQLite)")
    parser.add_argument("--bundle", help="the bundle that filled --photos-index (encodes the caption queries)")
    args = parser.parse_args()
    out = {"command": "python benchmarks/bench_dense_recall.py " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": os.getloadavg(), "runs": []}
    if CLIP.is_dir():
        images = np.load(CLIP / "image_embeddings.npy")[::5]  # 100 distinct images
        captions = np.load(CLIP / "text_embeddings.npy")
        for k in (1, 10):
            out["runs"].append(measure("CLIP ViT-B/32 flickr8k-100 (captions -> images)", images, captions, k, clusters=16))
    else:
        out["runs"].append({"vectors": "CLIP", "skipped": f"{CLIP} not found"})
    if args.photos_index and args.bundle:
        out["runs"].extend(photo_runs(Path(args.photos_index), Path(args.bundle), args.queries))
    if args.synthetic:
        vectors = dense_vectors(args.synthetic, 256, seed=1)
        queries = dense_vectors(args.queries, 256, seed=2)
        out["runs"].append(measure("random unit vectors, 256-d", vectors, queries, 10))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
