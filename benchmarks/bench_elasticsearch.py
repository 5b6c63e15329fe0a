"""Elasticsearch backend (official client) next to the OpenSearch backend (httpx), same server.

    python benchmarks/bench_elasticsearch.py --docs 3000 --queries 60        # osmem-server, both backends
    python benchmarks/bench_elasticsearch.py --url http://localhost:9201 --docs 50000
        # a real cluster: Elasticsearch backend only (D2S_ELASTICSEARCH_* credentials)

Without ``--url`` both backends talk to one osmem-server (an in-memory OpenSearch-compatible
*test* server, not Elasticsearch) through the same kind of local Python proxy (the
Elasticsearch one also rewrites the REST-compatibility media types, see
tests/elasticsearch/esproxy.py), so the ratio shows what the official client path costs
against the project's own httpx client, not anything about Elasticsearch. Data, queries and
timing are those of bench_opensearch.py (imported, not copied).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import _common  # noqa: E402

_common.use_repository()

from bench_opensearch import DIM, latency, make_docs, make_queries  # noqa: E402

from d2s_search.backends.base import IndexIdentity  # noqa: E402


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(backend, docs, queries, batch: int, k: int) -> dict:
    if backend.exists():
        backend.drop()
    backend.open(IndexIdentity(f"bench-{len(docs)}", DIM, "synthetic"))
    t0 = time.perf_counter()
    for i in range(0, len(docs), batch):
        backend.upsert(docs[i : i + batch])
    backend._refresh()
    ingest_s = time.perf_counter() - t0
    out = {
        "ingest_docs_per_second": round(len(docs) / ingest_s, 1),
        "sparse": latency(lambda qv: backend.sparse_search(qv[1], k), queries),
        "two_phase_w100": latency(lambda qv: backend.two_phase_search(qv[0], qv[1], k, 100), queries),
    }
    backend.drop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a real Elasticsearch (default: osmem-server, both backends)")
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()

    from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend
    from d2s_search.backends.opensearch.backend import OpenSearchBackend

    docs = make_docs(args.docs, args.seed)
    queries = make_queries(args.queries, args.seed + 100)
    report: dict = {**_common.provenance(), "docs": args.docs, "queries": args.queries, "k": args.k}
    if args.url:
        es = ElasticsearchBackend.from_env(url=args.url, index_name="d2s-bench", refresh=False, timeout=120.0)
        report["target"] = f"Elasticsearch {'.'.join(map(str, es.server_version()))} at {args.url}"
        try:
            report["elasticsearch"] = run(es, docs, queries, args.batch, args.k)
        finally:
            es.close()
        _common.write_json(_common.finish(report), args.json_out)
        return

    from osmem_server import OsmemServer

    _load("d2s_os_faultproxy", ROOT / "tests" / "opensearch" / "faultproxy.py")
    esproxy = _load("d2s_es_proxy", ROOT / "tests" / "elasticsearch" / "esproxy.py")
    from d2s_os_faultproxy import FaultProxy

    with OsmemServer.start(freeze=False, japanese=False) as server:
        report["target"] = "osmem-server (in-memory test server, NOT Elasticsearch or OpenSearch), behind local proxies"
        plain, compat = FaultProxy(server.url), esproxy.CompatProxy(server.url)
        try:
            os_backend = OpenSearchBackend(plain.url, index_name="bench-os", refresh=False, timeout=120.0)
            es_backend = ElasticsearchBackend(compat.url, index_name="bench-es", refresh=False, timeout=120.0)
            report["opensearch_httpx"] = run(os_backend, docs, queries, args.batch, args.k)
            report["elasticsearch_official_client"] = run(es_backend, docs, queries, args.batch, args.k)
            os_backend.close()
            es_backend.close()
        finally:
            plain.close()
            compat.close()
        ref, new = report["opensearch_httpx"], report["elasticsearch_official_client"]
        report["ratio_elasticsearch_over_opensearch"] = {
            "ingest_throughput": round(new["ingest_docs_per_second"] / ref["ingest_docs_per_second"], 3),
            "sparse_p50": round(new["sparse"]["p50_ms"] / ref["sparse"]["p50_ms"], 3),
            "two_phase_p50": round(new["two_phase_w100"]["p50_ms"] / ref["two_phase_w100"]["p50_ms"], 3),
        }
    _common.write_json(_common.finish(report), args.json_out)


if __name__ == "__main__":
    main()
