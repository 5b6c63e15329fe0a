"""Recall of the local index's approximate dense search (one HNSW graph per shard, used
above ``APPROXIMATE_DENSE_FROM`` documents) against exact search, on real and synthetic vectors.

    python benchmarks/bench_dense_recall.py [--synthetic 123000] [--queries 200]
        [--photos-index IDX --bundle BUNDLE] [--captions VECTORS.npy]

Real: the CLIP ViT-B/32 embeddings in ../shared/data/flickr8k-100-clip-b32/ (100 distinct
images; the 500 captions as queries); the flickr8k-800 photos of a local index with their
captions through the same bundle; ``--captions``: caption vectors of any model (e.g. the
Karpathy captions through the offline bundle), the last ``--queries`` rows as queries and the
rest as documents. Synthetic: random unit vectors (no structure: the worst case for any
approximate index). Everything goes through ``LocalBackend`` with the threshold lowered to 0,
next to the exact plan of the same backend, for several search widths (``graph.EF_SEARCH``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: E402
import numpy as np

_common.use_repository()
os.environ.setdefault("OMP_NUM_THREADS", "1")

from synthetic import dense_vectors  # noqa: E402

from d2s_search.backends import local as local_pkg  # noqa: E402
from d2s_search.backends.base import Document, IndexIdentity  # noqa: E402
from d2s_search.backends.local import backend as backend_mod  # noqa: E402
from d2s_search.backends.local import graph  # noqa: E402

DEFAULT_WIDTH = graph.EF_SEARCH

# ../shared/data beside the clone, or D2S_SHARED_DATA.
CLIP = Path(os.environ.get("D2S_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data") / "flickr8k-100-clip-b32"


def index_of(vectors: np.ndarray, folder: Path, approximate: bool) -> local_pkg.LocalBackend:
    backend_mod.APPROXIMATE_DENSE_FROM = 0 if approximate else 10**12
    backend_mod.GRAPH_K_SHARE = 1.0  # the graph for every k (small sets would otherwise be scanned)
    backend_mod.GRAPH_FROM_ROWS = 0  # and for shards of any size
    b = local_pkg.LocalBackend(folder / ("graph" if approximate else "exact"))
    b.open(IndexIdentity(f"dense-{len(vectors)}", vectors.shape[1], "recall"))
    for lo in range(0, len(vectors), 5000):
        b.upsert([Document(id=f"{i:064x}", path=f"/{i}", size_bytes=0, width=0, height=0, sparse={"x": 1.0},
                           dense=vectors[i]) for i in range(lo, min(lo + 5000, len(vectors)))])
    t0 = time.perf_counter()
    b._search_state()
    b.build_seconds = time.perf_counter() - t0
    return b


def measure(name: str, vectors: np.ndarray, queries: np.ndarray, ks=(10,), widths=(16, 32, 64, 128)) -> list[dict]:
    """Recall@k of the graph against the exact plan, per search width, with both p50 times."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        exact, approx = index_of(vectors, Path(tmp), False), index_of(vectors, Path(tmp), True)
        shards = approx._search_state().shards
        for k in ks:
            t_exact, want = [], []
            for q in queries:
                t0 = time.perf_counter()
                want.append({h.id for h in exact.dense_search(q, k, explain=0)})
                t_exact.append(time.perf_counter() - t0)
            for width in widths:
                graph.EF_SEARCH = width
                recalls, t_approx = [], []
                for q, wanted in zip(queries, want):
                    t0 = time.perf_counter()
                    got = {h.id for h in approx.dense_search(q, k, explain=0)}
                    t_approx.append(time.perf_counter() - t0)
                    recalls.append(len(wanted & got) / len(wanted))
                out.append({"vectors": name, "documents": len(vectors), "queries": len(queries), "k": k,
                            "graphs": sum("hnsw" in s.arrays for s in shards), "ef_search": max(width, k),
                            f"recall@{k}": round(float(np.mean(recalls)), 3),
                            "exact_p50_ms": round(float(np.median(t_exact)) * 1000, 3),
                            "graph_p50_ms": round(float(np.median(t_approx)) * 1000, 3),
                            "graph_build_s": round(approx.build_seconds, 1)})
                print(json.dumps(out[-1]), file=sys.stderr)
    graph.EF_SEARCH = DEFAULT_WIDTH
    return out


def existing_index_runs(path: Path, n_queries: int, widths=(64, 128, 256, 512)) -> list[dict]:
    """An index as it stands (e.g. bench_local_backend.py's, graphs built at its size), random
    unit queries like that benchmark's: the graphs' recall@10 and p50 per search width
    against an exact numpy scan of the same vectors."""
    backend = local_pkg.LocalBackend(path)
    backend.open(None, create=False)
    state = backend._search_state()
    matrix = np.vstack([s.dense_rows() for s in state.shards])
    rng = np.random.default_rng(99)
    queries = [dense_vectors(1, matrix.shape[1], seed=int(rng.integers(1 << 30)))[0] for _ in range(n_queries)]
    exact = [set(np.argsort(-(matrix @ q), kind="stable")[:10].tolist()) for q in queries]
    out = []
    for width in widths:
        graph.EF_SEARCH = width
        recalls, times = [], []
        for q, wanted in zip(queries, exact):
            t0 = time.perf_counter()
            rows, _ = backend._dense_top(state, q, 10)
            times.append(time.perf_counter() - t0)
            recalls.append(len(set(rows.tolist()) & wanted) / 10)
        out.append({"vectors": f"{path.name} (random unit vectors)", "documents": len(matrix), "queries": n_queries,
                    "k": 10, "graphs": sum("hnsw" in s.arrays for s in state.shards), "ef_search": width,
                    "recall@10": round(float(np.mean(recalls)), 3), "graph_p50_ms": round(float(np.median(times)) * 1000, 3)})
        print(json.dumps(out[-1]), file=sys.stderr)
    graph.EF_SEARCH = DEFAULT_WIDTH
    return out


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
    return measure(name, vectors, queries)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthetic", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--photos-index", help="a local index of the flickr8k-800 photos (dense vectors from SQLite)")
    parser.add_argument("--bundle", help="the bundle that filled --photos-index (encodes the caption queries)")
    parser.add_argument("--captions", help="an .npy of caption vectors: the last --queries rows query the others")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--local-index", help="an existing local index (e.g. benchmarks/.cache/local-123000): "
                        "its graphs against an exact scan, per search width")
    args = parser.parse_args()
    summary = _common.provenance()
    out = {"command": "python benchmarks/bench_dense_recall.py " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": os.getloadavg(), "runs": []}
    if CLIP.is_dir():
        images = np.load(CLIP / "image_embeddings.npy")[::5]  # 100 distinct images
        captions = np.load(CLIP / "text_embeddings.npy")
        out["runs"].extend(measure("CLIP ViT-B/32 flickr8k-100 (captions -> images)", images, captions, ks=(1, 10)))
    else:
        out["runs"].append({"vectors": "CLIP", "skipped": f"{CLIP} not found"})
    if args.photos_index and args.bundle:
        out["runs"].extend(photo_runs(Path(args.photos_index), Path(args.bundle), args.queries))
    if args.captions:
        vectors = np.load(args.captions).astype(np.float32)
        docs, queries = vectors[: -args.queries], vectors[-args.queries :]
        out["runs"].extend(measure(f"captions -> captions ({Path(args.captions).name})", docs, queries))
    if args.local_index:
        out["runs"].extend(existing_index_runs(Path(args.local_index), args.queries))
    if args.synthetic:
        vectors = dense_vectors(args.synthetic, 256, seed=1)
        queries = dense_vectors(args.queries, 256, seed=2)
        out["runs"].extend(measure("random unit vectors, 256-d", vectors, queries, widths=(64, 128, 256)))
    _common.write_json(_common.finish({**summary, **out}), args.json_out)


if __name__ == "__main__":
    main()
