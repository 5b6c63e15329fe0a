"""Search latency and memory of the local index at 123k and 1M documents, against brute force
and the reference engines, on a paper-shaped synthetic collection or (``--collection
real-shaped``) the offline bundle's own output tiled (``shaped_collection.py``).

    python benchmarks/bench_local_backend.py [--docs 123000] [--queries 300] [--json OUT]
    python benchmarks/bench_local_backend.py --collection real-shaped --docs 1000000 --queries 100 --peers ''
    python benchmarks/bench_local_backend.py --docs 1000000 --queries 100 --k 10 --threads 2
    python benchmarks/bench_local_backend.py --docs 1000000 --rebuild-structures   # the build again

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
Peers (``peers.py``: PISA, Seismic, faiss flat; each when installed) answer the same queries,
timed the same two ways. The index is built once through the real backend and cached under
benchmarks/.cache/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import _common  # benchmarks/ is on sys.path when a script runs
import numpy as np

_common.use_repository()
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import shaped_collection  # noqa: E402
from synthetic import dense_vectors, sample_vectors, zipf_probabilities  # noqa: E402

from d2s_search.backends.base import Document, IndexIdentity  # noqa: E402
from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402
from d2s_search.search import QueryVectors, SearchOptions, run_query  # noqa: E402

DIM = 256
TERMS = [f"t{i}" for i in range(30522)]


def identity(n_docs: int, seed: int) -> IndexIdentity:
    return IndexIdentity(fingerprint=f"synthetic-{n_docs}-{seed}", dense_dim=DIM, model="synthetic")


def build_index(path: Path, n_docs: int, seed: int = 0, build_threads: int = 1,
                collection: str = "synthetic") -> tuple[LocalBackend, dict]:
    ident = COLLECTIONS[collection].identity(n_docs, seed)
    backend = LocalBackend(path, threads=1)
    if backend.exists():
        backend.open(ident, create=False)
        if backend.count() == n_docs:
            return backend, {}
        backend.drop()
        backend = LocalBackend(path, threads=1)
    backend.open(ident)
    batches = COLLECTIONS[collection].documents(n_docs, seed)
    t0 = time.perf_counter()
    done = 0
    for docs in batches:
        backend.upsert(docs)
        done += len(docs)
        print(f"\rbuilding: {done}/{n_docs} docs ({time.perf_counter() - t0:.0f}s)", end="", file=sys.stderr)
    print(file=sys.stderr)
    ingest_s = time.perf_counter() - t0
    backend.close()
    built = _common.build_in_a_process(path, build_threads)  # its own process: its time and memory alone
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    return backend, {"ingest_seconds": round(ingest_s, 1), "cache_build_seconds": built["seconds"],
                     "build_peak_rss_mb": built["peak_rss_mb"], "build_threads": build_threads}


def synthetic_documents(n_docs: int, seed: int, batch: int = 5000) -> Iterator[list[Document]]:
    """The synthetic collection's documents, ``batch`` at a time."""
    probs = zipf_probabilities(seed=seed)
    for start in range(0, n_docs, batch):
        n = min(batch, n_docs - start)
        vecs = sample_vectors(n, 20, 200, probs, seed=seed + 1 + start)
        dense = dense_vectors(n, DIM, seed=seed + 2 + start)
        yield [
            Document(
                id=f"{start + i:064x}", path=f"/synthetic/{start + i}.jpg", size_bytes=0, width=0, height=0,
                sparse={TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())}, dense=dense[i],
            )
            for i, (ids, ws) in enumerate(vecs)
        ]


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


class Collection(NamedTuple):
    """What a benchmark needs of a collection: its index's identity, its documents in batches,
    its queries, and the name its index is cached under (``<cache_name>-<documents>``)."""

    identity: Callable[[int, int], IndexIdentity]
    documents: Callable[[int, int], Iterator[list[Document]]]
    queries: Callable[[int], list[QueryVectors]]
    cache_name: str


COLLECTIONS = {
    "synthetic": Collection(identity, synthetic_documents, benchmark_queries, "local"),
    "real-shaped": Collection(shaped_collection.identity, shaped_collection.documents, shaped_collection.queries,
                              "real-shaped"),
}


def index_path(cache: str | Path, collection: str, n_docs: int) -> Path:
    """Where the collection's index of ``n_docs`` documents is built and cached."""
    return Path(cache) / f"{COLLECTIONS[collection].cache_name}-{n_docs}"


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
    return {name: _common.percentiles(t) for name, t in times.items()}


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
    return {name: _common.percentiles(t) for name, t in times.items()}


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


def build_peers(names: list[str], state, terms: list[str], ids: list[str], dense_matrix: np.ndarray, workdir: Path) -> list:
    """The reference engines asked for and installed, over the index's own stored weights."""
    import peers

    def documents():
        for s in state.shards:
            data = kernels.decode_weights(s.arrays["csr_data"])
            indices, indptr = s.arrays["csr_indices"], s.arrays["csr_indptr"]
            for row in range(s.rows):
                lo, hi = int(indptr[row]), int(indptr[row + 1])
                yield s.string("ids", row), {terms[c]: float(w) for c, w in zip(indices[lo:hi].tolist(), data[lo:hi].tolist())}

    have, built = peers.available(), []
    for name in names:
        if not have.get(name):
            print(f"peer {name}: not installed (pip install -e '.[peers]'), skipped", file=sys.stderr)
            continue
        print(f"building peer {name} ...", file=sys.stderr)
        if name == "pisa":
            built.append(peers.pisa(documents(), workdir))
        elif name == "seismic":
            built.append(peers.seismic(documents()))
        elif name == "faiss-flat":
            built.append(peers.faiss_flat(ids, dense_matrix))
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--collection", choices=tuple(COLLECTIONS), default="synthetic",
                        help="synthetic (paper-shaped, random dense vectors) or real-shaped (the offline bundle's "
                             "output tiled: shaped_collection.py)")
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--rebuild-structures", action="store_true",
                        help="keep the documents, build the search structures anew (time and peak memory)")
    parser.add_argument("--k", default="10,1000", help="comma-separated k values (e.g. 10 for a quick 1M run)")
    parser.add_argument("--peers", default="pisa,seismic,faiss-flat", help="reference engines ('' for none)")
    parser.add_argument("--json", dest="json_out", help="also write the results to this file")
    parser.add_argument("--threads", type=int, default=1, help="shards searched at once (LocalBackend threads)")
    parser.add_argument("--build-threads", type=int, default=os.cpu_count() or 1,
                        help="faiss threads building the dense graphs (a fresh build; searches keep --threads)")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    summary = _common.provenance(threads=f"{args.threads} search thread(s)")

    path = index_path(args.cache, args.collection, args.docs)
    if args.rebuild and path.exists():
        shutil.rmtree(path)
    backend, build = build_index(path, args.docs, build_threads=args.build_threads, collection=args.collection)
    if args.rebuild_structures and not build:
        backend.close()
        shutil.rmtree(path / "cache", ignore_errors=True)
        built = _common.build_in_a_process(path, args.build_threads)
        build = {"cache_build_seconds": built["seconds"], "build_peak_rss_mb": built["peak_rss_mb"],
                 "build_threads": args.build_threads}
        backend = LocalBackend(path, threads=1)
        backend.open(None, create=False)
    backend.close()
    backend = LocalBackend(path, threads=args.threads)
    backend.open(None, create=False)
    t0 = time.perf_counter()
    state = backend._search_state()  # open the search structures (memory-mapped)
    load_s = time.perf_counter() - t0

    queries = COLLECTIONS[args.collection].queries(args.queries)
    assert all(q.full for q in queries)

    brute_sparse, brute_dense = brute_force(backend, state)
    ids = [s.string("ids", i) for s in state.shards for i in range(s.rows)]
    dense_matrix = np.vstack([s.dense_rows() for s in state.shards])
    peer_list = build_peers([p for p in args.peers.split(",") if p], state, backend._terms, ids, dense_matrix, path.parent)

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
        for peer in peer_list:
            plans[peer.name] = lambda q, k=k, peer=peer: peer.search(q.full, q.dense, k)
        references = {
            "brute-force sparse": lambda q, k=k: brute_sparse(q, k),
            "brute-force dense": lambda q, k=k: brute_dense(q, k),
        }
        for name, value in interleaved(plans, references, queries).items():
            results[f"{name} @{k}"] = value
        for name, value in steady({**plans, **references}, queries).items():
            steady_results[f"{name} @{k}"] = value
    # Correctness alongside speed: the exact plan returns the brute-force top-10.
    checked = queries[:100]
    exact = [[ids[r] for r in brute_sparse(q, 10)] for q in checked]
    exact_dense = [{ids[r] for r in brute_dense(q, 10)} for q in checked]
    agree = sum([h.id for h in backend.sparse_search(q.full, 10, explain=0)] == e for q, e in zip(checked, exact))
    recall = np.mean([
        len({h.id for h in run_query(backend, q, SearchOptions(mode="two-phase", k=10)).hits} & set(e)) / 10
        for q, e in zip(checked, exact)
    ])
    dense_recall = np.mean([  # the approximate dense plan (a graph above APPROXIMATE_DENSE_FROM) against exact
        len({h.id for h in backend.dense_search(q.dense, 10, explain=0)} & e) / 10 for q, e in zip(checked, exact_dense)
    ])
    peer_summary = {}
    for peer in peer_list:
        truth = exact if peer.kind == "sparse" else exact_dense
        peer_summary[peer.name] = {
            "kind": peer.kind, "settings": peer.settings, "build_seconds": round(peer.build_seconds, 1),
            "index_mb": round(peer.index_bytes / 2**20),
            "recall_at_10_vs_exact": round(float(np.mean([len(set(peer.search(q.full, q.dense, 10)) & set(t)) / 10
                                                          for q, t in zip(checked, truth)])), 3)}
        peer.close()
    postings = sum(int(shard.arrays["csc_indptr"][-1]) for shard in state.shards)
    posting_lengths = np.zeros(max(shard.n_cols for shard in state.shards), dtype=np.int64)
    for shard in state.shards:
        per_term = np.diff(shard.arrays["csc_indptr"])
        posting_lengths[: per_term.size] += per_term
    stored = sum(f.stat().st_size for f in state.state_dir.glob("*.npy"))
    parts: dict[str, int] = {}
    for f in state.state_dir.glob("shard-*.npy"):
        parts[DISK_PARTS.get(f.stem.split("-", 2)[2], "ids, paths, URLs")] = (
            parts.get(DISK_PARTS.get(f.stem.split("-", 2)[2], "ids, paths, URLs"), 0) + f.stat().st_size)
    sqlite_bytes = sum(f.stat().st_size for f in path.glob("index.sqlite*"))
    summary.update({
        "collection": args.collection,
        "docs": args.docs,
        "queries": len(queries),
        "shards": len(state.shards),
        "postings": postings,
        "mean_terms_per_doc": round(postings / max(1, state.size), 1),
        "longest_posting_list": int(posting_lengths.max()),
        "mean_query_terms": round(float(np.mean([len(q.full) for q in queries])), 1),
        "open_seconds_in_process": round(load_s, 3),
        **open_in_new_process(path, queries),
        "stored_matrices_mb": round(stored / 2**20),
        "cache_parts_mb": {name: round(size / 2**20, 1) for name, size in sorted(parts.items())},
        "sqlite_mb": round(sqlite_bytes / 2**20),
        "raw_postings_mb": round(postings * 8 / 2**20),  # int32 id + float32 weight per posting
        **build,
        "exact_top10_agreement": f"{agree}/{len(checked)}",
        "two_phase_recall_at_10_vs_exact": round(float(recall), 3),
        "dense_recall_at_10_vs_exact": round(float(dense_recall), 3),
        "dense_graphs": sum("hnsw" in s.arrays for s in state.shards),
        "peers": peer_summary,
        "latency": results,
        "latency_steady": steady_results,
    })
    _common.write_json(_common.finish(summary), args.json_out)


# What each cached array holds (shard-NNNNN-<name>.npy), for the on-disk table.
DISK_PARTS = {"csc_data": "postings by term", "csc_indices": "postings by term", "csc_indptr": "postings by term",
              "csr_data": "postings by document", "csr_indices": "postings by document",
              "csr_indptr": "postings by document", "dense_columns": "frequent terms as dense columns",
              "dense_terms": "frequent terms as dense columns", "dense": "dense vectors", "hnsw": "HNSW graphs"}

PLANS = ("sparse", "sparse, 5 words explained", "two-phase", "dense", "hybrid, 5 words explained")


def render(summary: dict) -> str:
    """The latency table (p50 ms, cold and back to back, and the speed-up over brute force), the
    peers' rows, then the memory and open-time line."""
    cold, warm = summary["latency"], summary["latency_steady"]
    ks = sorted({int(key.rsplit("@", 1)[1]) for key in cold})
    peers = summary.get("peers", {})
    rows = []
    for k in ks:
        for name in (*PLANS, *peers):
            key = f"{name} @{k}"
            if key not in cold:
                continue
            kind = peers[name]["kind"] if name in peers else ("dense" if name == "dense" else "sparse")
            ref_cold, ref_warm = cold[f"brute-force {kind} @{k}"]["p50_ms"], warm[f"brute-force {kind} @{k}"]["p50_ms"]
            c, w = cold[key]["p50_ms"], warm[key]["p50_ms"]
            if name in peers:
                note = f"recall@10 {peers[name]['recall_at_10_vs_exact']:.2f}"
            elif name == "two-phase":
                note = f"recall@10 {summary['two_phase_recall_at_10_vs_exact']:.2f}"
            elif name == "dense" and summary.get("dense_graphs"):
                note = f"HNSW, recall@10 {summary['dense_recall_at_10_vs_exact']:.2f}"
            elif name == "dense":
                note = "exact"
            elif name == "sparse":
                note = f"exact ({summary['exact_top10_agreement']} top 10 = brute force)"
            else:
                note = "exact" if "sparse" in name else ""
            rows.append([name, k, f"{c:.3f}", f"{ref_cold / c:.1f}x", f"{w:.3f}", f"{ref_warm / w:.1f}x", note])
        ref = [f"brute-force {kind} @{k}" for kind in ("sparse", "dense")]
        rows.append(["*brute force sparse / dense (reference)*", k, " / ".join(f"{cold[r]['p50_ms']:.2f}" for r in ref), "1x",
                     " / ".join(f"{warm[r]['p50_ms']:.2f}" for r in ref), "1x", "exact"])
    out = [_common.table(["plan", "k", "cold p50 ms", "vs brute force", "back to back p50 ms", "vs brute force", "answers"], rows)]
    if peers:
        out.append(_common.table(["reference engine", "settings", "build s", "index MB"],
                                 [[n, p["settings"], p["build_seconds"], p["index_mb"]] for n, p in peers.items()]))
    out.append(
        f"{summary['docs']:,} documents in {summary['shards']} shards, {summary['postings']:,} postings "
        f"({summary['mean_terms_per_doc']} terms a document), {summary['queries']} queries of "
        f"{summary['mean_query_terms']} terms. Open in a new process {summary['open_seconds_best_of_3']} s; "
        f"resident memory after 100 sparse queries {summary['rss_mb_after_100_queries']:,} MB, after 100 more dense "
        f"ones {summary['rss_mb_after_100_more_dense_queries_k100']:,} MB, for {summary['stored_matrices_mb']:,} MB "
        f"of search structures; SQLite {summary['sqlite_mb']:,} MB."
        + (f" Search structures built from SQLite in {summary['cache_build_seconds']} s (a fresh process, "
           f"{summary['build_threads']} faiss thread(s), peak resident memory {summary['build_peak_rss_mb']:,} MB) "
           + (f"after {summary['ingest_seconds']} s of upserts." if "ingest_seconds" in summary else "(the documents kept).")
           if "cache_build_seconds" in summary else ""))
    out.append(_common.caption(summary))
    if "cache_parts_mb" in summary:
        out.append("The index on disk:\n\n" + render_disk(summary))
    return "\n\n".join(out)


def render_disk(summary: dict) -> str:
    """The index on disk, part by part, against the raw postings (int32 id + float32 weight)."""
    raw, n = summary["raw_postings_mb"], summary["docs"]
    rows = [["SQLite (the source of truth: vectors, paths, metadata)", summary["sqlite_mb"]]]
    rows += [[f"search structures: {name}", mb] for name, mb in summary.get("cache_parts_mb", {}).items()]
    rows.append(["**all**", summary["sqlite_mb"] + summary["stored_matrices_mb"]])
    return (_common.table(["part", "MB", "bytes a document", "vs raw postings"],
                          [[name, f"{mb:,.0f}", f"{mb * 2**20 / n:,.0f}", f"{mb / raw:.2f}x"] for name, mb in rows])
            + f"\n\nRaw postings: {summary['postings']:,} x (4-byte id + 4-byte weight) = {raw:,} MB. "
            + _common.caption(summary))


if __name__ == "__main__":
    main()
