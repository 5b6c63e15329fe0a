"""The dense graphs' parameters chosen on a real-shaped collection (:mod:`real_shaped`: real
embeddings tiled with small perturbations): recall@10 and recall@1000 against exact search,
and the time of a query, per graph (M, efConstruction), per search width (the candidates
rescored, ``--ef`` of ``d2s-search query``), one graph per shard against one over every shard,
and a shard's graph against a scan of its vectors by shard size.

    python benchmarks/bench_graph_params.py [--model offline-mini|clip] [--docs 123000]
        [--split validation|test] [--queries 500] [--builds 16x40,32x40,32x80] [--build-threads 1]
        [--one-graph | --one-graph-only] [--json OUT]

The graphs are the index's own (``graph.build``: faiss HNSW over 8-bit copies, candidates
rescored with the float vectors by ``graph.search``), one per 65,536 rows as the index cuts
shards, merged as the index merges them; exact search is every vector scored, per shard
(the index's exact plan). Parameters are chosen on the validation queries and reported on
the test queries (the two halves of the held-out captions). One thread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import _common  # noqa: E402
import numpy as np

_common.use_repository()
os.environ.setdefault("OMP_NUM_THREADS", "1")

import real_shaped  # noqa: E402

from d2s_search.backends.local import graph, kernels  # noqa: E402
from d2s_search.backends.local.cache import SHARD_ROWS  # noqa: E402


def faiss_threads_one() -> None:
    import faiss

    faiss.omp_set_num_threads(1)


BUILD_THREADS = 1  # --build-threads: faiss threads while graphs are built (searches keep one)


def build_graphs(docs: np.ndarray, m: int, ef_construction: int, shard_rows: int = SHARD_ROWS) -> tuple[list, float]:
    """One graph per shard of ``shard_rows`` rows (the index's own build); seconds taken."""
    import faiss

    old = graph.M, graph.EF_CONSTRUCTION
    graph.M, graph.EF_CONSTRUCTION = m, ef_construction
    faiss.omp_set_num_threads(BUILD_THREADS)
    t0 = time.perf_counter()
    try:
        out = []
        for lo in range(0, len(docs), shard_rows):
            vectors = docs[lo : lo + shard_rows]
            blob = graph.build([vectors])
            where = graph.layout(blob, len(vectors), docs.shape[1])
            out.append((lo, vectors, blob, graph.OpenedGraph(blob, where, len(vectors), docs.shape[1])))
    finally:
        graph.M, graph.EF_CONSTRUCTION = old
        faiss.omp_set_num_threads(1)
    return out, time.perf_counter() - t0


def exact_top(docs: np.ndarray, query: np.ndarray, k: int, shard_rows: int = SHARD_ROWS) -> tuple[np.ndarray, float]:
    """The exact plan: every vector scored shard by shard, merged; (rows, seconds)."""
    t0 = time.perf_counter()
    parts = []
    for lo in range(0, len(docs), shard_rows):
        scores = docs[lo : lo + shard_rows] @ query
        rows = kernels.top_rows_any_sign(scores, k)
        parts.append((rows + lo, scores[rows]))
    rows, _ = kernels.merge_top(parts, k)
    return rows, time.perf_counter() - t0


def graph_top(shards: list, query: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    parts = []
    for lo, vectors, _, index in shards:
        rows, scores = graph.search(index, vectors, query, k, ef)
        parts.append((rows + lo, scores))
    rows, _ = kernels.merge_top(parts, k)
    return rows, time.perf_counter() - t0


def truth(docs: np.ndarray, queries: np.ndarray, k: int) -> tuple[list[set], float]:
    out, times = [], []
    for q in queries:
        rows, seconds = exact_top(docs, q, k)
        out.append(set(rows.tolist()))
        times.append(seconds)
    return out, float(np.median(times))


def sweep(shards: list, queries: np.ndarray, wanted: list[set], k: int, widths: list[int]) -> list[dict]:
    out = []
    for ef in widths:
        recalls, times = [], []
        for q, want in zip(queries, wanted):
            rows, seconds = graph_top(shards, q, k, ef)
            recalls.append(len(want & set(rows.tolist())) / len(want))
            times.append(seconds)
        out.append({"k": k, "ef": max(ef, k), f"recall@{k}": round(float(np.mean(recalls)), 4),
                    "min_recall": round(float(np.min(recalls)), 2), "p50_ms": round(float(np.median(times)) * 1e3, 3)})
        print(json.dumps(out[-1]), file=sys.stderr)
    return out


def shard_size_runs(docs: np.ndarray, queries: np.ndarray, m: int, ef_construction: int, ef: int) -> list[dict]:
    """One shard of n rows: its graph's top 10 against a scan of its vectors (p50 ms)."""
    out = []
    for n in (2_000, 8_000, 16_000, 32_000, 65_536):
        part = docs[:n]
        shards, _ = build_graphs(part, m, ef_construction)
        t_graph, t_scan, recalls = [], [], []
        for q in queries[:200]:
            want, seconds = exact_top(part, q, 10)
            t_scan.append(seconds)
            rows, seconds = graph_top(shards, q, 10, ef)
            t_graph.append(seconds)
            recalls.append(len(set(want.tolist()) & set(rows.tolist())) / 10)
        out.append({"shard_rows": n, "scan_p50_ms": round(float(np.median(t_scan)) * 1e3, 3),
                    "graph_p50_ms": round(float(np.median(t_graph)) * 1e3, 3), "recall@10": round(float(np.mean(recalls)), 4)})
        print(json.dumps(out[-1]), file=sys.stderr)
    return out


def through_index(docs: np.ndarray, queries: np.ndarray, wanted: list[set], wanted1000: list[set]) -> dict:
    """The collection stored in a local index with the defaults (graphs from 100,000 documents
    on, one spanning the full shards): the recall@10 its ``index stats`` reports (sampled when
    the graphs were built) next to the held-out queries' recall through ``dense_search``, what
    building the search structures took (seconds, the process's peak resident memory, faiss on
    --build-threads), and the p50 of ``dense_search`` (hits with ids and paths, one thread,
    queries back to back) at k=10 and, with --k1000, k=1000 with its recall@1000."""
    import tempfile
    from pathlib import Path

    from d2s_search.backends.base import Document, IndexIdentity
    from d2s_search.backends.local import LocalBackend

    with tempfile.TemporaryDirectory(dir=_common.CACHE) as tmp:
        backend = LocalBackend(Path(tmp) / "idx")
        backend.open(IndexIdentity("real-shaped", docs.shape[1], "real-shaped"))
        for lo in range(0, len(docs), 5000):
            backend.upsert([Document(id=f"{i:064x}", path=f"/{i}", size_bytes=0, width=0, height=0, sparse={"x": 1.0},
                                     dense=docs[i]) for i in range(lo, min(lo + 5000, len(docs)))])
        backend.close()
        built = _common.build_in_a_process(Path(tmp) / "idx", BUILD_THREADS)
        backend = LocalBackend(Path(tmp) / "idx")
        backend.open(None, create=False)
        state = backend._search_state()
        t0 = time.perf_counter()
        for first, span in state.dense_units():
            members = state.shards[first : first + span]
            graph.sampled_recall(members[0].dense_graph(), backend._unit_vectors(members), graph.EF_SEARCH)
        sampling = time.perf_counter() - t0
        stats = backend.stats()
        out = {"dense_search": stats["dense_search"], "stats_recall@10": stats["dense_recall_at_10"],
               "graphs": [span for _, span in state.dense_units()], "structures_s": built["seconds"],
               "peak_rss_mb": built["peak_rss_mb"], "sampling_s": round(sampling, 2)}
        for k, want in ((10, wanted), (1000, wanted1000)):
            if not want:
                continue
            backend.dense_search(queries[0], k, explain=0)  # the first search pays for checking the graphs
            recalls, times = [], []
            for q, w in zip(queries, want):
                t0 = time.perf_counter()
                hits = backend.dense_search(q, k, explain=0)
                times.append(time.perf_counter() - t0)
                recalls.append(len({int(h.id, 16) for h in hits} & w) / len(w))
            out[f"queries_recall@{k}"] = round(float(np.mean(recalls)), 4)
            out[f"p50_ms_k{k}"] = round(float(np.median(times)) * 1e3, 3)
        backend.close()
    print(json.dumps(out), file=sys.stderr)
    return out


def nn_summary(vectors: np.ndarray) -> dict:
    d = real_shaped.nn_distances(vectors)
    return {f"p{p}": round(float(np.percentile(d, p)), 3) for p in (10, 50, 90)}


def render(summary: dict) -> str:
    """Recall and p50 per graph and width (time as a share of the exact scan's, same run),
    then a shard's graph against its scan by shard size."""
    c, exact = summary["collection"], summary["exact_p50_ms"]
    head = (f"{c['model']} real-shaped: {c['documents']:,} documents ({c['sources']:,} real vectors tiled, noise "
            f"{c['noise']}), {c['queries']} {c['split']} queries; nearest-neighbour distance p10/p50/p90 "
            f"{'/'.join(str(v) for v in c['nn_distance_documents'].values())} (real: "
            f"{'/'.join(str(v) for v in c['nn_distance_sources'].values())}); exact p50 {exact['k10']} ms (k=10)"
            + (f", {exact['k1000']} ms (k=1000)" if exact["k1000"] else ""))
    rows = []
    for run in summary["runs"]:
        for k in ("k10", "k1000"):
            for r in run.get(k, []):
                rows.append((run["graphs"], run["M"], run["efConstruction"], run["build_s"], r["k"], r["ef"],
                             r[f"recall@{r['k']}"], r["p50_ms"], _common.ratio(r["p50_ms"], exact[k])))
    out = [head] + (["", _common.table(("graphs", "M", "efConstruction", "build s", "k", "candidates", "recall@k",
                                         "p50 ms", "p50 / exact"), rows)] if rows else [])
    if summary.get("shard_sizes"):
        out += ["", _common.table(("shard rows", "scan p50 ms", "graph p50 ms", "graph / scan", "graph recall@10"),
                                  [(r["shard_rows"], r["scan_p50_ms"], r["graph_p50_ms"],
                                    _common.ratio(r["graph_p50_ms"], r["scan_p50_ms"]), r["recall@10"])
                                   for r in summary["shard_sizes"]])]
    if summary.get("through_index"):
        t = summary["through_index"]
        k1000 = (f"; k=1000 {t['p50_ms_k1000']} ms p50 ({_common.ratio(t['p50_ms_k1000'], exact['k1000'])} the exact "
                 f"scan), recall@1000 {t['queries_recall@1000']}" if "p50_ms_k1000" in t else "")
        out += ["", f"Through a local index with the defaults (graphs spanning {t.get('graphs')} shards): `index stats` "
                f"dense_recall_at_10 {t['stats_recall@10']} (stored vectors as queries, sampled at the build: "
                f"{t['sampling_s']} s), the held-out queries' recall@10 {t['queries_recall@10']}; dense_search k=10 "
                f"{t.get('p50_ms_k10')} ms p50 ({_common.ratio(t.get('p50_ms_k10'), exact['k10'])} the exact scan){k1000}; "
                f"search structures built in {t['structures_s']} s, peak resident memory {t.get('peak_rss_mb')} MB."]
    return "\n".join(out + ["", _common.caption(summary)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("offline-mini", "clip"), default="offline-mini")
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--split", choices=("validation", "test"), default="validation")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--builds", default="16x40,32x40,32x80", help="MxefConstruction, comma separated")
    parser.add_argument("--widths", default="16,32,48,64,96,128,256")
    parser.add_argument("--k1000", action="store_true", help="recall@1000 at k=1000 too (against a scan)")
    parser.add_argument("--one-graph", action="store_true", help="one graph over every shard, as well")
    parser.add_argument("--one-graph-only", action="store_true", help="one graph over every shard, no per-shard graphs")
    parser.add_argument("--shard-sizes", action="store_true", help="a shard's graph against its scan by shard size")
    parser.add_argument("--through-index", action="store_true",
                        help="the collection in a local index with the defaults: index stats' recall against the queries'")
    parser.add_argument("--build-threads", type=int, default=1, help="faiss threads while building (searches: 1)")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    global BUILD_THREADS
    BUILD_THREADS = args.build_threads
    faiss_threads_one()
    summary = _common.provenance()
    out: dict = {"runs": []}
    sources, validation, test = (real_shaped.offline_mini_sources if args.model == "offline-mini"
                                 else real_shaped.clip_sources)()
    docs = real_shaped.tile(sources, args.docs, real_shaped.NOISE[args.model])
    queries = real_shaped._unit(validation if args.split == "validation" else test)[: args.queries]
    out["collection"] = {"model": args.model, "sources": len(sources), "documents": len(docs), "dim": docs.shape[1],
                         "noise": real_shaped.NOISE[args.model], "queries": len(queries), "split": args.split,
                         "nn_distance_sources": nn_summary(real_shaped._unit(sources)),
                         "nn_distance_documents": nn_summary(docs)}
    print(json.dumps(out["collection"]), file=sys.stderr)
    wanted10, exact10 = truth(docs, queries, 10)
    wanted1000, exact1000 = truth(docs, queries[:100], 1000) if args.k1000 else ([], 0.0)
    out["exact_p50_ms"] = {"k10": round(exact10 * 1e3, 3), "k1000": round(exact1000 * 1e3, 3)}
    widths = [int(w) for w in args.widths.split(",")]
    for spec in filter(None, args.builds.split(",")):  # --builds '': only --through-index
        m, ef_construction = (int(x) for x in spec.split("x"))
        if args.one_graph_only:
            one, seconds = build_graphs(docs, m, ef_construction, shard_rows=len(docs))
            out["runs"].append({"M": m, "efConstruction": ef_construction, "graphs": 1, "build_s": round(seconds, 1),
                                "k10": sweep(one, queries, wanted10, 10, widths)})
            print(json.dumps(out["runs"][-1]), file=sys.stderr)
            continue
        shards, seconds = build_graphs(docs, m, ef_construction)
        run = {"M": m, "efConstruction": ef_construction, "graphs": len(shards), "build_s": round(seconds, 1),
               "graph_bytes": int(sum(blob.nbytes for _, _, blob, _ in shards)), "k10": sweep(shards, queries, wanted10, 10, widths)}
        if args.k1000:
            run["k1000"] = sweep(shards, queries[:100], wanted1000, 1000, [1000, 1500, 2000])
        print(json.dumps({k: v for k, v in run.items() if not k.startswith("k")}), file=sys.stderr)
        out["runs"].append(run)
        if args.one_graph:
            one, seconds = build_graphs(docs, m, ef_construction, shard_rows=len(docs))
            out["runs"].append({"M": m, "efConstruction": ef_construction, "graphs": 1, "build_s": round(seconds, 1),
                                "k10": sweep(one, queries, wanted10, 10, widths)})
    if args.through_index:
        out["through_index"] = through_index(docs, queries, wanted10, wanted1000)
    if args.shard_sizes:
        m, ef_construction = (int(x) for x in (args.builds or "32x80").split(",")[0].split("x"))
        out["shard_sizes"] = shard_size_runs(docs, queries, m, ef_construction, graph.EF_SEARCH)
    _common.write_json(_common.finish({**summary, **out}), args.json_out)


if __name__ == "__main__":
    main()
