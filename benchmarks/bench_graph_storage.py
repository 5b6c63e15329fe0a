"""What an HNSW graph should keep of its shard's vectors: float32 (faiss ``IndexHNSWFlat``), or
a scalar-quantised copy (``IndexHNSWSQ``: fp16, 8 or 4 bits) whose candidates are rescored
with the float vectors, as :mod:`d2s_search.backends.local.graph` does.

    OMP_NUM_THREADS=1 python benchmarks/bench_graph_storage.py [--queries 120]
    OMP_NUM_THREADS=1 python benchmarks/bench_graph_storage.py --real CAPTIONS.parquet   # recall on real vectors
    OMP_NUM_THREADS=1 python benchmarks/bench_graph_storage.py --graph-params            # M and efConstruction

Builds every variant over the first shard (65,536 vectors) of the cached synthetic 123k
index of ``bench_local_backend.py`` (built there first), then times one query at a time,
"cold" right after a 256 MB array is rewritten (as the interleaved benchmark's brute-force
reference leaves the caches) and "warm" the same query again at once, with the variants
alternated query by query. Recall@10 against the exact top 10 of the shard. Random vectors
are the worst case for any graph: compare the variants' recall with each other, not with
the real embeddings' (``bench_dense_recall.py``).

``--real``: recall@10 of float32, fp16 and 8-bit graphs (M 32, efConstruction 40, candidates
rescored as above) at 16 / 32 / 64 candidates against exact search, on real vectors: the caption
vectors of a ``text_embs.parquet`` (``d2s-search embed`` / the caption benchmark's data; the last
200 query the rest), the same captions against the first caption of each image
(``img_embs.parquet`` beside it: 500 queries), and the CLIP ViT-B/32 vectors of
``../shared/data/flickr8k-100-clip-b32`` (100 images, 500 captions). ``--graph-params``: M and
efConstruction (fp16 copies) on the synthetic shard, cold, at 64 / 100 / 200 candidates.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_local_backend import DIM, build_index  # noqa: E402
from benchmarks.synthetic import dense_vectors  # noqa: E402
from d2s_search.backends.local import graph  # noqa: E402


def variants(vectors: np.ndarray) -> dict[str, object]:
    import faiss

    def sq(qtype, m: int = graph.M):
        return lambda d: faiss.IndexHNSWSQ(d, qtype, m, faiss.METRIC_INNER_PRODUCT)

    makers = {
        "float32": lambda d: faiss.IndexHNSWFlat(d, graph.M, faiss.METRIC_INNER_PRODUCT),
        "fp16": sq(faiss.ScalarQuantizer.QT_fp16),
        "8-bit (shipped)": sq(faiss.ScalarQuantizer.QT_8bit),
        "4-bit": sq(faiss.ScalarQuantizer.QT_4bit),
        "8-bit, M 16": sq(faiss.ScalarQuantizer.QT_8bit, 16),
    }
    out = {}
    for name, make in makers.items():
        t = time.perf_counter()
        index = make(vectors.shape[1])
        index.hnsw.efConstruction = graph.EF_CONSTRUCTION
        index.train(vectors)
        index.add(vectors)
        print(f"built {name:16s} in {time.perf_counter() - t:5.1f} s", flush=True)
        out[name] = index
    return out


def search(index, vectors: np.ndarray, query: np.ndarray, k: int, ef: int, rescore: bool) -> np.ndarray:
    """Rows of the top k: rescored as the backend does (:func:`graph.search`), or the graph's own."""
    if rescore:
        return graph.search(index, vectors, query, k, ef)[0]
    import faiss

    params = faiss.SearchParametersHNSW()
    params.efSearch = max(ef, k)
    _, found = index.search(query[None], k, params=params)
    return found[0][found[0] >= 0]


def real_recall(parquet: Path) -> None:
    """Recall@10 of each storage on real vectors (see the module's docstring)."""
    import faiss

    from d2s_search.train.data import _read_parquet_embs

    _, captions = _read_parquet_embs(parquet)
    _, firsts = _read_parquet_embs(parquet.with_name("img_embs.parquet"))
    clip = Path(os.environ.get("D2S_SHARED_DATA") or ROOT.parent / "shared" / "data") / "flickr8k-100-clip-b32"
    sets = {
        "captions -> captions": (captions[:-200], captions[-200:]),
        "captions -> first captions": (firsts, captions[-500:]),
        "CLIP, captions -> images": (np.load(clip / "image_embeddings.npy")[::5], np.load(clip / "text_embeddings.npy")),
    }
    storages = {"float32": None, "fp16": faiss.ScalarQuantizer.QT_fp16, "8-bit (shipped)": faiss.ScalarQuantizer.QT_8bit}
    for name, (docs, queries) in sets.items():
        docs = np.ascontiguousarray(docs, dtype=np.float32)
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        exact = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
        for storage, qtype in storages.items():
            if qtype is None:
                index = faiss.IndexHNSWFlat(docs.shape[1], graph.M, faiss.METRIC_INNER_PRODUCT)
            else:
                index = faiss.IndexHNSWSQ(docs.shape[1], qtype, graph.M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = graph.EF_CONSTRUCTION
            index.train(docs)
            index.add(docs)
            recalls = []
            for ef in (16, 32, 64):
                found = [search(index, docs, q, 10, ef, True) for q in queries]
                recalls.append(np.mean([len(set(f.tolist()) & set(e.tolist())) / 10 for f, e in zip(found, exact)]))
            print(f"{name:28s} {len(docs):6d} documents  {storage:16s} recall@10 at 16 / 32 / 64: "
                  + " / ".join(f"{r:.4f}" for r in recalls))


def graph_params(vectors: np.ndarray, queries: list[np.ndarray]) -> None:
    """M and efConstruction, fp16 copies, cold (see the module's docstring)."""
    import faiss

    indexes = {}
    for m, construction in ((32, 40), (16, 100), (24, 80), (32, 80)):
        t = time.perf_counter()
        index = faiss.IndexHNSWSQ(vectors.shape[1], faiss.ScalarQuantizer.QT_fp16, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = construction
        index.train(vectors)
        index.add(vectors)
        print(f"built M {m}, efConstruction {construction} in {time.perf_counter() - t:5.1f} s", flush=True)
        indexes[(m, construction)] = index
    evict = np.zeros(64 << 20, np.float32)
    for ef in (64, 100, 200):
        cold = {key: [] for key in indexes}
        recall = {key: [] for key in indexes}
        for q in queries:
            exact = set(np.argsort(-(vectors @ q))[:10].tolist())
            for key, index in indexes.items():
                evict += 1.0
                t = time.perf_counter()
                rows = search(index, vectors, q, 10, ef, True)
                cold[key].append(time.perf_counter() - t)
                recall[key].append(len(set(rows.tolist()) & exact) / 10)
        for (m, construction), times in cold.items():
            print(f"ef {ef:3d}  M {m:2d}, efConstruction {construction:3d}: cold p50 {np.median(times) * 1e3:.3f} ms  "
                  f"recall@10 {np.mean(recall[(m, construction)]):.3f}")


def main() -> None:
    import faiss

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=120)
    ap.add_argument("--real", type=Path, help="a text_embs.parquet of caption vectors: recall on real vectors only")
    ap.add_argument("--graph-params", action="store_true", help="M and efConstruction instead of the storages")
    args = ap.parse_args()
    faiss.omp_set_num_threads(1)
    if args.real:
        real_recall(args.real)
        return
    backend, _ = build_index(ROOT / "benchmarks" / ".cache" / "local-123000", 123000)
    vectors = np.ascontiguousarray(backend._search_state().shards[0].dense_rows(), dtype=np.float32)
    if args.graph_params:
        graph_params(vectors, [dense_vectors(1, DIM, seed=3000 + i)[0].astype(np.float32) for i in range(args.queries)])
        return
    indexes = variants(vectors)
    queries = [dense_vectors(1, DIM, seed=1000 + i)[0].astype(np.float32) for i in range(args.queries)]
    evict = np.zeros(64 << 20, np.float32)
    for k, ef in ((10, graph.EF_SEARCH), (100, 100)):
        cold = {n: [] for n in indexes}
        warm = {n: [] for n in indexes}
        recall = {n: [] for n in indexes}
        for q in queries:
            exact = set(np.argsort(-(vectors @ q))[:10].tolist())
            for name, index in indexes.items():
                rescore = name != "float32"
                evict += 1.0
                t = time.perf_counter()
                rows = search(index, vectors, q, k, ef, rescore)
                cold[name].append(time.perf_counter() - t)
                t = time.perf_counter()
                search(index, vectors, q, k, ef, rescore)
                warm[name].append(time.perf_counter() - t)
                recall[name].append(len(set(rows[:10].tolist()) & exact) / 10)
        base = np.median(cold["float32"])
        for name in indexes:
            print(f"k={k:<3d} ef={max(ef, k):<3d} {name:16s} cold p50 {np.median(cold[name]) * 1e3:.3f} ms "
                  f"({np.median(cold[name]) / base:.2f}x)  warm p50 {np.median(warm[name]) * 1e3:.3f} ms  "
                  f"recall@10 {np.mean(recall[name]):.3f}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
