"""Local-backend query latency on a paper-shaped synthetic collection.

    python benchmarks/bench_local_backend.py [--docs 123000] [--queries 300] [--threads 1]

Measures p50/p99 latency at k=10 and k=1000 for sparse (exact), two-phase and dense
search through ``LocalBackend`` (one thread), each next to a brute-force reference
measured in the same run: exhaustive doc-at-a-time scoring of every document (scipy CSR
mat-vec) + full sort for sparse, a numpy mat-mul over all vectors + full sort for dense.
The index is built once and cached under benchmarks/.cache/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.synthetic import dense_vectors, sample_vectors, zipf_probabilities  # noqa: E402
from d2s_search.backends.base import Document, IndexIdentity  # noqa: E402
from d2s_search.backends.local import LocalBackend  # noqa: E402

DIM = 256


def build_index(path: Path, n_docs: int, seed: int = 0) -> tuple[LocalBackend, list[str]]:
    identity = IndexIdentity(fingerprint=f"synthetic-{n_docs}-{seed}", dense_dim=DIM, model="synthetic")
    terms = [f"t{i}" for i in range(30522)]
    backend = LocalBackend(path, threads=1)
    if backend.exists():
        backend.open(identity, create=False)
        if backend.count() == n_docs:
            return backend, terms
        backend.drop()
        backend = LocalBackend(path, threads=1)
    backend.open(identity)
    probs = zipf_probabilities(seed=seed)
    t0 = time.perf_counter()
    batch = 5000
    for start in range(0, n_docs, batch):
        n = min(batch, n_docs - start)
        vecs = sample_vectors(n, 20, 200, probs, seed=seed + 1 + start)
        dense = dense_vectors(n, DIM, seed=seed + 2 + start)
        docs = [
            Document(
                id=f"{start + i:064x}", path=f"/synthetic/{start + i}.jpg", size_bytes=0, width=0, height=0,
                sparse={terms[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())}, dense=dense[i],
            )
            for i, (ids, ws) in enumerate(vecs)
        ]
        backend.upsert(docs)
        print(f"\rbuilding: {start + n}/{n_docs} docs ({time.perf_counter() - t0:.0f}s)", end="", file=sys.stderr)
    print(file=sys.stderr)
    return backend, terms


def percentiles(samples: list[float]) -> dict:
    arr = np.asarray(samples) * 1000
    return {"p50_ms": round(float(np.percentile(arr, 50)), 3), "p99_ms": round(float(np.percentile(arr, 99)), 3)}


def timed(fn, queries) -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        fn(q)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cache", default=str(Path(__file__).parent / ".cache"))
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--json", dest="json_out", help="also write the results to this file")
    args = parser.parse_args()

    path = Path(args.cache) / f"local-{args.docs}"
    if args.rebuild and path.exists():
        shutil.rmtree(path)
    backend, terms = build_index(path, args.docs)
    t0 = time.perf_counter()
    state = backend._search_state()  # load (or build) the search structures once
    load_s = time.perf_counter() - t0

    probs = zipf_probabilities(seed=0)
    rng = np.random.default_rng(99)
    raw = sample_vectors(args.queries, 10, 40, probs, seed=12345)
    queries = []
    for ids, ws in raw:
        full = {terms[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())}
        # The query's own words: about a third of its terms, as a BLIP query of ~10 tokens.
        own_n = max(3, len(ids) // 3)
        own_ids = rng.choice(ids, size=min(own_n, len(ids)), replace=False)
        own = {terms[t]: full[terms[t]] for t in own_ids.tolist()}
        queries.append((full, own, dense_vectors(1, DIM, seed=int(rng.integers(1 << 30)))[0]))

    csr = state.csr
    term_col = {t: backend._term_ids[t] for t in terms if t in backend._term_ids}
    dense_matrix = state.dense

    def brute_sparse(q, k):
        qvec = np.zeros(csr.shape[1], dtype=np.float32)
        for t, w in q[0].items():
            if t in term_col:
                qvec[term_col[t]] = w
        scores = csr @ qvec  # every document, doc-at-a-time
        return np.argsort(-scores, kind="stable")[:k]

    def brute_dense(q, k):
        scores = dense_matrix @ q[2]
        return np.argsort(-scores, kind="stable")[:k]

    results = {}
    for k in (10, 1000):
        plans = {
            "sparse": lambda q, k=k: backend.sparse_search(q[0], k, explain=0),
            "two-phase": lambda q, k=k: backend.two_phase_search(q[1], q[0], k, max(100, 10 * k), explain=0),
            "dense": lambda q, k=k: backend.dense_search(q[2], k, explain=0),
            "brute-force sparse": lambda q, k=k: brute_sparse(q, k),
            "brute-force dense": lambda q, k=k: brute_dense(q, k),
        }
        for name, fn in plans.items():
            timed(fn, queries[:10])  # warm-up
            results[f"{name} @{k}"] = percentiles(timed(fn, queries))
    # Correctness alongside speed: the exact plan returns the brute-force top-10.
    agree = sum(
        [h.id for h in backend.sparse_search(q[0], 10, explain=0)]
        == [state.ids[r].decode() for r in brute_sparse(q, 10)]
        for q in queries[:50]
    )
    postings = np.diff(state.csc.indptr)
    summary = {
        "command": "python benchmarks/bench_local_backend.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one search thread",
        "docs": args.docs,
        "postings": int(state.csr.nnz),
        "mean_terms_per_doc": round(state.csr.nnz / max(1, state.size), 1),
        "longest_posting_list": int(postings.max()),
        "mean_query_terms": round(float(np.mean([len(q[0]) for q in queries])), 1),
        "load_seconds": round(load_s, 2),
        "exact_top10_agreement": f"{agree}/50",
        "latency": results,
    }
    for key in ("sparse", "two-phase"):
        for k in (10, 1000):
            ref = results[f"brute-force sparse @{k}"]["p50_ms"]
            summary.setdefault("speedup_vs_brute_force_p50", {})[f"{key} @{k}"] = round(ref / results[f"{key} @{k}"]["p50_ms"], 1)
    for k in (10, 1000):
        ref = results[f"brute-force dense @{k}"]["p50_ms"]
        summary["speedup_vs_brute_force_p50"][f"dense @{k}"] = round(ref / results[f"dense @{k}"]["p50_ms"], 1)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)


if __name__ == "__main__":
    main()
