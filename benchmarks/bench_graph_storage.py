"""What an HNSW graph should keep of its shard's vectors: float32 (faiss ``IndexHNSWFlat``), or
a scalar-quantised copy (``IndexHNSWSQ``: fp16, 8 or 4 bits) whose candidates are rescored
with the float vectors, as :mod:`d2s_search.backends.local.graph` does.

    OMP_NUM_THREADS=1 python benchmarks/bench_graph_storage.py [--queries 120]

Builds every variant over the first shard (65,536 vectors) of the cached synthetic 123k
index of ``bench_local_backend.py`` (built there first), then times one query at a time,
"cold" right after a 256 MB array is rewritten (as the interleaved benchmark's brute-force
reference leaves the caches) and "warm" the same query again at once, with the variants
alternated query by query. Recall@10 against the exact top 10 of the shard. Random vectors
are the worst case for any graph: compare the variants' recall with each other, not with
the real embeddings' (``bench_dense_recall.py``).
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
from d2s_search.backends.local.kernels import top_rows_any_sign  # noqa: E402


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
    import faiss

    params = faiss.SearchParametersHNSW()
    params.efSearch = max(ef, k)
    wanted = max(ef, k) if rescore else k
    _, found = index.search(query[None], wanted, params=params)
    rows = np.sort(found[0][found[0] >= 0])
    if not rescore:
        return found[0][found[0] >= 0]
    return rows[top_rows_any_sign(vectors[rows] @ query, k)]


def main() -> None:
    import faiss

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=120)
    args = ap.parse_args()
    faiss.omp_set_num_threads(1)
    backend, _ = build_index(ROOT / "benchmarks" / ".cache" / "local-123000", 123000)
    vectors = np.ascontiguousarray(backend._search_state().shards[0].dense_rows(), dtype=np.float32)
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
