"""OpenSearch backend: bulk-ingest throughput and query latency against any URL.

    python benchmarks/bench_opensearch.py                      # starts osmem-server (a test server)
    python benchmarks/bench_opensearch.py --url https://localhost:9200 --docs 50000
        # credentials from D2S_OPENSEARCH_USER / _PASSWORD / _API_KEY / _CA_FILE

Synthetic, paper-shaped documents (benchmarks/synthetic.py: 20-200 terms, Zipf-like over a
30,522-word vocabulary, 256-d dense vectors). Ingest goes through ``OpenSearchBackend.upsert``
in batches (``_bulk`` chunks, one refresh at the end); queries run one at a time through the
backend (HTTP round trip included): sparse (rank_feature bool), two-phase (rescore window
100) and, when the server supports them, dense kNN and hybrid. Writes into a throw-away
index that is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import _common  # noqa: E402
import numpy as np

_common.use_repository()

from synthetic import dense_vectors, sample_vectors, zipf_probabilities  # noqa: E402

from d2s_search.backends.base import Document, IndexIdentity  # noqa: E402
from d2s_search.backends.opensearch.backend import OpenSearchBackend  # noqa: E402
from d2s_search.errors import D2SError  # noqa: E402

DIM = 256


def make_docs(n: int, seed: int) -> list[Document]:
    probs = zipf_probabilities(seed=seed)
    sparse = sample_vectors(n, 20, 200, probs, seed + 1)
    dense = dense_vectors(n, DIM, seed + 2)
    now = time.time()
    return [
        Document(id=f"{i:064x}", path=f"bench/{i:07d}.jpg", size_bytes=50_000, width=640, height=480,
                 sparse={f"t{t}": float(w) for t, w in zip(terms, weights, strict=True)},
                 dense=dense[i], ingested_at=now)
        for i, (terms, weights) in enumerate(sparse)
    ]


def make_queries(n: int, seed: int) -> list[tuple[dict[str, float], dict[str, float], np.ndarray]]:
    probs = zipf_probabilities(seed=seed)  # same term law as the documents
    vecs = sample_vectors(n, 10, 40, probs, seed + 10)
    dense = dense_vectors(n, DIM, seed + 11)
    out = []
    for (terms, weights), d in zip(vecs, dense, strict=True):
        full = {f"t{t}": float(w) for t, w in zip(terms, weights, strict=True)}
        first = dict(list(full.items())[: max(1, len(full) // 3)])  # "the query's own words"
        out.append((first, full, d))
    return out


def latency(fn, queries) -> dict[str, float] | dict[str, str]:
    try:
        fn(queries[0])  # warm-up, and a probe for unsupported query types
    except D2SError as exc:
        return {"skipped": str(exc)[:160]}
    times = []
    for qv in queries:
        t0 = time.perf_counter()
        fn(qv)
        times.append((time.perf_counter() - t0) * 1000)
    t = np.asarray(times)
    return {"p50_ms": round(float(np.percentile(t, 50)), 2), "p95_ms": round(float(np.percentile(t, 95)), 2),
            "p99_ms": round(float(np.percentile(t, 99)), 2), "mean_ms": round(float(t.mean()), 2), "n": len(t)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("D2S_OPENSEARCH_URL"), help="default: start osmem-server")
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256, help="documents per upsert call")
    ap.add_argument("--chunk", type=int, default=500, help="documents per _bulk request")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--index-name", default="d2s-bench")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()

    server = None
    if not args.url:
        from osmem_server import OsmemServer

        server = OsmemServer.start(freeze=False, japanese=False)
        args.url = server.url
    target = "osmem-server (in-memory test server, NOT OpenSearch)" if server else "the given URL"
    creds = {k: os.environ[v] for k, v in (("user", "D2S_OPENSEARCH_USER"), ("password", "D2S_OPENSEARCH_PASSWORD"),
             ("api_key", "D2S_OPENSEARCH_API_KEY"), ("ca_file", "D2S_OPENSEARCH_CA_FILE")) if os.environ.get(v)}
    backend = OpenSearchBackend(args.url, index_name=args.index_name, chunk_docs=args.chunk, refresh=False,
                                timeout=120.0, **creds)
    try:
        info = backend.http.request("GET", "/").body
        version = info.get("version", {}).get("number", "?") if isinstance(info, dict) else "?"
        if backend.exists():
            backend.drop()
        backend.open(IndexIdentity(f"bench-{args.docs}-{args.seed}", DIM, "synthetic"))
        docs = make_docs(args.docs, args.seed)
        terms = sum(len(d.sparse) for d in docs)
        t0 = time.perf_counter()
        for i in range(0, len(docs), args.batch):
            backend.upsert(docs[i : i + args.batch])
        backend._refresh()
        ingest_s = time.perf_counter() - t0
        queries = make_queries(args.queries, args.seed + 100)
        k = args.k
        results = {
            "sparse": latency(lambda qv: backend.sparse_search(qv[1], k), queries),
            "two_phase_w100": latency(lambda qv: backend.two_phase_search(qv[0], qv[1], k, 100), queries),
            "dense_knn": latency(lambda qv: backend.dense_search(qv[2], k), queries),
            "hybrid_minmax": latency(lambda qv: backend.hybrid_search(qv[1], qv[2], k), queries),
        }
        report = {
            "target": target,
            "server_version": version,
            "docs": args.docs,
            "mean_terms_per_doc": round(terms / args.docs, 1),
            "ingest_seconds": round(ingest_s, 2),
            "ingest_docs_per_second": round(args.docs / ingest_s, 1),
            "bulk_chunk": args.chunk,
            "k": k,
            "queries": results,
            **_common.provenance(),
        }
        _common.write_json(_common.finish(report), args.json_out)
    finally:
        try:
            backend.drop()
        finally:
            backend.close()
            if server:
                server.close()


if __name__ == "__main__":
    main()
