"""Local-backend query latency on a paper-shaped synthetic collection.

    python benchmarks/bench_local_backend.py [--docs 123000] [--queries 300]

Measures p50/p99 latency at k=10 and k=1000 of the full search call (hits with ids, paths,
URLs; with and without 5 explained words) for sparse (exact), two-phase, dense and hybrid
through ``LocalBackend`` (one search thread unless --threads says more), twice: "latency" interleaves query by query, every plan
right after a brute-force reference on the same query (so each plan runs after a pass over the
whole collection has evicted the CPU caches: a cold start per query), "latency_steady" lets each plan answer
50 different queries back to back, as a running server does (the first 10 of each block not
timed), plans and references taking turns block by block. The references, measured in the same run: exhaustive doc-at-a-time scoring of every document
(scipy CSR mat-vec) + full sort for sparse, a numpy mat-vec over all vectors + full sort
for dense. Also: build time, open time (a new process, warm page cache), resident memory
against the size of the stored matrices, and two-phase recall against exact.
The index is built once through the real backend and cached under benchmarks/.cache/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from benchmarks.synthetic import dense_vectors, sample_vectors, zipf_probabilities  # noqa: E402
from d2s_search.backends.base import Document, IndexIdentity  # noqa: E402
from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402
from d2s_search.search import QueryVectors, SearchOptions, run_query  # noqa: E402

DIM = 256
TERMS = [f"t{i}" for i in range(30522)]


def identity(n_docs: int, seed: int) -> IndexIdentity:
    return IndexIdentity(fingerprint=f"synthetic-{n_docs}-{seed}", dense_dim=DIM, model="synthetic")


def build_index(path: Path, n_docs: int, seed: int = 0) -> tuple[LocalBackend, dict]:
    backend = LocalBackend(path, threads=1)
    if backend.exists():
        backend.open(identity(n_docs, seed), create=False)
        if backend.count() == n_docs:
            return backend, {}
        backend.drop()
        backend = LocalBackend(path, threads=1)
    backend.open(identity(n_docs, seed))
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
                sparse={TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())}, dense=dense[i],
            )
            for i, (ids, ws) in enumerate(vecs)
        ]
        backend.upsert(docs)
        print(f"\rbuilding: {start + n}/{n_docs} docs ({time.perf_counter() - t0:.0f}s)", end="", file=sys.stderr)
    print(file=sys.stderr)
    ingest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    backend._search_state()
    return backend, {"ingest_seconds": round(ingest_s, 1), "cache_build_seconds": round(time.perf_counter() - t0, 1),
                     "build_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def benchmark_queries(n: int) -> list[QueryVectors]:
    """The benchmark's n queries (fixed seeds): 10-40 Zipf-drawn terms, a dense vector each."""
    rng = np.random.default_rng(99)
    queries = []
    for ids, ws in sample_vectors(n, 10, 40, zipf_probabilities(seed=0), seed=12345):
        full = {TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())}
        # The query's own words: about a third of its terms, as a BLIP query of ~10 tokens.
        own_n = max(3, len(ids) // 3)
        own_ids = rng.choice(ids, size=min(own_n, len(ids)), replace=False)
        own = {TERMS[t]: full[TERMS[t]] for t in own_ids.tolist()}
        queries.append(QueryVectors(full=full, own=own, dense=dense_vectors(1, DIM, seed=int(rng.integers(1 << 30)))[0]))
    return queries


def percentiles(samples: list[float]) -> dict:
    arr = np.asarray(samples) * 1000
    return {"p50_ms": round(float(np.percentile(arr, 50)), 3), "p99_ms": round(float(np.percentile(arr, 99)), 3)}


def interleaved(plans: dict, references: dict, queries: list, warm: int = 10) -> dict:
    """Query by query, every plan right after a brute-force reference on the same query (the
    references taking turns): each plan starts cold, its postings evicted by a pass over the
    whole collection, never warmed by another plan that just read the same postings. The plans'
    order rotates per query, so load changes on the shared machine hit plan and reference alike."""
    names, refs = list(plans), list(references)
    for q in queries[:warm]:
        for name in names:
            plans[name](q)
    times: dict[str, list[float]] = {name: [] for name in names + refs}
    turn = 0
    for i, q in enumerate(queries):
        for name in names[i % len(names):] + names[: i % len(names)]:
            ref = refs[turn % len(refs)]
            turn += 1
            for label, run in ((ref, references[ref]), (name, plans[name])):
                t0 = time.perf_counter()
                run(q)
                times[label].append(time.perf_counter() - t0)
    return {name: percentiles(t) for name, t in times.items()}


def steady(plans: dict, queries: list, block: int = 50, settle: int = 10) -> dict:
    """Back to back, as a running server answers: each plan takes ``block`` different queries in
    a row, plans take turns block by block (the order rotating), so load changes still hit plan
    and reference alike. The first ``settle`` queries of a block, which follow another plan's
    block (a brute-force pass evicts the CPU caches), are not timed."""
    names = list(plans)
    times: dict[str, list[float]] = {name: [] for name in names}
    for b, start in enumerate(range(0, len(queries), block)):
        chunk = queries[start : start + block]
        for name in names[b % len(names):] + names[: b % len(names)]:
            for i, q in enumerate(chunk):
                t0 = time.perf_counter()
                plans[name](q)
                if i >= settle:
                    times[name].append(time.perf_counter() - t0)
    return {name: percentiles(t) for name, t in times.items()}


OPEN_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from d2s_search.backends.local import LocalBackend
imported = time.perf_counter()
b = LocalBackend(sys.argv[1]); b.open(None, create=False); state = b._search_state()
opened = time.perf_counter()
payload = json.loads(open(sys.argv[2]).read())
queries = payload["sparse"]
def rss():
    status = open('/proc/self/status').read()
    return int(status.split('VmRSS:')[1].split()[0]) // 1024
for q in queries:
    b.sparse_search(q, 10, explain=5)
sparse_rss = rss()
import numpy as np
for v in payload["dense"]:
    b.dense_search(np.asarray(v, dtype=np.float32), 100, explain=0)
status = open('/proc/self/status').read()
peak = int(status.split('VmHWM:')[1].split()[0]) // 1024  # ru_maxrss would count the forking parent
print(json.dumps({"import_s": imported - t0, "open_s": opened - imported, "rss_mb_after_queries": sparse_rss,
                  "rss_mb_after_dense_queries": rss(), "peak_rss_mb": peak}))
"""


def open_in_new_process(path: Path, queries: list) -> dict:
    """Open time and memory of a fresh process (the page cache is warm: the files were just read)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as payload:
        json.dump({"sparse": [q.full for q in queries[:100]], "dense": [q.dense.tolist() for q in queries[:100]]}, payload)
        payload.flush()
        runs = [json.loads(subprocess.run([sys.executable, "-c", OPEN_SCRIPT, str(path), payload.name], env=env,
                                          check=True, capture_output=True, text=True).stdout) for _ in range(3)]
    best = min(runs, key=lambda r: r["open_s"])
    return {"open_seconds_best_of_3": round(best["open_s"], 3), "import_seconds": round(best["import_s"], 3),
            "rss_mb_after_100_queries": best["rss_mb_after_queries"],
            "rss_mb_after_100_more_dense_queries_k100": best["rss_mb_after_dense_queries"], "peak_rss_mb": best["peak_rss_mb"]}


def brute_force(backend: LocalBackend, state) -> tuple:
    """(brute_sparse(q, k), brute_dense(q, k)): the references, over one contiguous copy of
    everything (built here, outside the timings): exhaustive doc-at-a-time scoring of every
    document (scipy CSR mat-vec) and a numpy mat-vec over all vectors, each with a full sort."""
    import scipy.sparse as sp

    csr = sp.vstack([sp.csr_matrix((kernels.decode_weights(s.arrays["csr_data"]), s.arrays["csr_indices"], s.arrays["csr_indptr"]),
                                   shape=(s.rows, s.n_cols)) for s in state.shards], format="csr")
    n_cols = csr.shape[1]
    dense_matrix = np.vstack([s.dense_rows() for s in state.shards])
    term_col = backend._term_ids

    def brute_sparse(q: QueryVectors, k: int):
        qvec = np.zeros(n_cols, dtype=np.float32)
        for t, w in q.full.items():
            if t in term_col and term_col[t] < n_cols:
                qvec[term_col[t]] = w
        scores = csr @ qvec  # every document, doc-at-a-time
        return np.argsort(-scores, kind="stable")[:k]

    def brute_dense(q: QueryVectors, k: int):
        scores = dense_matrix @ q.dense
        return np.argsort(-scores, kind="stable")[:k]

    return brute_sparse, brute_dense


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cache", default=str(Path(__file__).parent / ".cache"))
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--k", default="10,1000", help="comma-separated k values (e.g. 10 for a quick 1M run)")
    parser.add_argument("--json", dest="json_out", help="also write the results to this file")
    parser.add_argument("--threads", type=int, default=1, help="shards searched at once (LocalBackend threads)")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]

    path = Path(args.cache) / f"local-{args.docs}"
    if args.rebuild and path.exists():
        shutil.rmtree(path)
    backend, build = build_index(path, args.docs)
    backend.close()
    backend = LocalBackend(path, threads=args.threads)
    backend.open(None, create=False)
    t0 = time.perf_counter()
    state = backend._search_state()  # open the search structures (memory-mapped)
    load_s = time.perf_counter() - t0

    queries = benchmark_queries(args.queries)
    assert all(q.full for q in queries)

    brute_sparse, brute_dense = brute_force(backend, state)

    def plan(mode: str, k: int, explain: int):
        options = SearchOptions(mode=mode, k=k, explain=explain)
        return lambda q: run_query(backend, q, options)

    results, steady_results = {}, {}
    for k in ks:
        plans = {
            "sparse": plan("sparse", k, 0),
            "sparse, 5 words explained": plan("sparse", k, 5),
            "two-phase": plan("two-phase", k, 0),
            "dense": plan("dense", k, 0),
            "hybrid, 5 words explained": plan("hybrid", k, 5),
        }
        references = {
            "brute-force sparse": lambda q, k=k: brute_sparse(q, k),
            "brute-force dense": lambda q, k=k: brute_dense(q, k),
        }
        for name, value in interleaved(plans, references, queries).items():
            results[f"{name} @{k}"] = value
        for name, value in steady({**plans, **references}, queries).items():
            steady_results[f"{name} @{k}"] = value
    # Correctness alongside speed: the exact plan returns the brute-force top-10.
    ids = [s.string("ids", i) for s in state.shards for i in range(s.rows)]
    agree = sum(
        [h.id for h in backend.sparse_search(q.full, 10, explain=0)] == [ids[r] for r in brute_sparse(q, 10)]
        for q in queries[:100]
    )
    recall = np.mean([
        len({h.id for h in run_query(backend, q, SearchOptions(mode="two-phase", k=10)).hits}
            & {h.id for h in backend.sparse_search(q.full, 10, explain=0)}) / 10
        for q in queries[:100]
    ])
    dense_recall = np.mean([  # the approximate dense plan (a graph above APPROXIMATE_DENSE_FROM) against exact
        len({h.id for h in backend.dense_search(q.dense, 10, explain=0)} & {ids[r] for r in brute_dense(q, 10)}) / 10
        for q in queries[:100]
    ])
    postings = sum(int(shard.arrays["csc_indptr"][-1]) for shard in state.shards)
    posting_lengths = np.zeros(max(shard.n_cols for shard in state.shards), dtype=np.int64)
    for shard in state.shards:
        per_term = np.diff(shard.arrays["csc_indptr"])
        posting_lengths[: per_term.size] += per_term
    stored = sum(f.stat().st_size for f in state.state_dir.glob("*.npy"))
    summary = {
        "command": "python benchmarks/bench_local_backend.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} search thread(s)",
        "docs": args.docs,
        "shards": len(state.shards),
        "postings": postings,
        "mean_terms_per_doc": round(postings / max(1, state.size), 1),
        "longest_posting_list": int(posting_lengths.max()),
        "mean_query_terms": round(float(np.mean([len(q.full) for q in queries])), 1),
        "empty_queries": sum(not q.full for q in queries),
        "open_seconds_in_process": round(load_s, 3),
        **open_in_new_process(path, queries),
        "stored_matrices_mb": round(stored / 2**20),
        **build,
        "exact_top10_agreement": f"{agree}/{len(queries[:100])}",
        "two_phase_recall_at_10_vs_exact": round(float(recall), 3),
        "dense_recall_at_10_vs_exact": round(float(dense_recall), 3),
        "dense_graphs": sum("hnsw" in s.arrays for s in state.shards),
        "latency": results,
        "latency_steady": steady_results,
    }
    for key, timed in (("speedup_vs_brute_force_p50", results), ("speedup_vs_brute_force_p50_steady", steady_results)):
        ratios = summary.setdefault(key, {})
        for k in ks:
            for name in ("sparse", "sparse, 5 words explained", "two-phase", "hybrid, 5 words explained", "dense"):
                reference = "dense" if name == "dense" else "sparse"
                ratios[f"{name} @{k}"] = round(timed[f"brute-force {reference} @{k}"]["p50_ms"] / timed[f"{name} @{k}"]["p50_ms"], 1)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)


if __name__ == "__main__":
    main()
