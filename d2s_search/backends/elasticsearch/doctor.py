"""``d2s-search doctor --backend elasticsearch``: what the Elasticsearch cluster can do for
d2s-search, one check a line (the checks and their statuses as for OpenSearch).

A plan is listed as working only when this server's version (and license) has what it needs
(versions: :mod:`d2s_search.backends.elasticsearch.queries`):

    sparse, two-phase                   rank_features + rank_feature, rescore (every 8.x)
    sparse_vector                       the field 8.11+, its query 8.15+ (sent with prune: false)
    dense                               dense_vector HNSW with the top-level knn option (8.4+)
    dense max_inner_product / int8      8.11+ / 8.12+
    hybrid (rrf retriever)              8.14+ with an Enterprise or trial license
    hybrid (fused here)                 dense and sparse: min-max or RRF in this process
"""

from __future__ import annotations

from typing import Any

from d2s_search.backends.elasticsearch import queries as q
from d2s_search.backends.opensearch.doctor import FAIL, OK, SKIP, WARN, Check, Report
from d2s_search.errors import BackendUnavailableError, D2SError

KNN_OPTION = (8, 4)


def diagnose(backend: Any, identity: Any = None) -> Report:
    """Run every check against ``backend`` (an ElasticsearchBackend); ``identity`` is the bundle's."""
    report = Report()
    add = report.checks.append
    version = backend.server_version()  # raises BackendUnavailableError when unreachable
    shown = ".".join(map(str, version))
    add(Check("reachable", OK, f"{backend.url} answered"))
    add(
        Check(
            "version",
            OK if version >= (8, 15) else WARN,
            f"Elasticsearch {'Serverless (current code)' if backend.serverless else shown}",
            {"version": shown},
        )
    )
    add(_plans(backend, version))
    add(_bodies(backend, version))
    add(_index(backend, version, identity))
    return report


def _plans(backend: Any, version: tuple[int, int]) -> Check:
    since = backend.supports
    rrf = backend.rrf_available()
    plans = {
        "sparse": True,
        "two-phase": True,
        "sparse_vector": since("sparse_vector") and since("sparse_vector_query"),
        "dense": version >= KNN_OPTION,
        "dense max_inner_product": since("max_inner_product"),
        "dense int8_hnsw": since("int8_hnsw"),
        "hybrid (rrf retriever)": rrf,
        "hybrid (fused here)": version >= KNN_OPTION,
    }
    working = [p for p, ok in plans.items() if ok]
    not_working = [p for p, ok in plans.items() if not ok]
    detail = f"work: {', '.join(working)}" + (
        f"; not: {', '.join(not_working)}" if not_working else ""
    )
    if since("rrf_retriever") and not rrf:
        detail += " (the rrf retriever needs an Enterprise or trial license: hybrid is fused here)"
    return Check("plans", OK if plans["dense"] else WARN, detail, {"plans": plans})


def _bodies(backend: Any, version: tuple[int, int]) -> Check:
    prunes = backend.serverless or q.takes_sparse_index_options(version)
    sparse_vector = (
        "sparse_vector query with prune: false; new sparse_vector fields map index_options "
        "{prune: false} (fields of 8.19+/9.1+ prune by default)"
        if prunes
        else "sparse_vector query with prune: false (fields here do not prune by default)"
    )
    return Check(
        "request bodies",
        OK,
        f"{sparse_vector}; one refresh before the next read and at the end of an ingest",
        {"sparse_index_options": prunes},
    )


def _index(backend: Any, version: tuple[int, int], identity: Any) -> Check:
    name = backend.index_name
    try:
        stored = backend._stored_identity()
    except BackendUnavailableError:
        raise
    except D2SError as exc:
        return Check("index", FAIL, str(exc))
    if stored is None:
        return Check(
            "index",
            WARN,
            f"no index {name!r} yet (`d2s-search index create --backend elasticsearch` "
            "or ingest makes it)",
        )
    mapping = next(iter(backend._mapping().values())).get("mappings", {})
    sparse = mapping.get("properties", {}).get(q.SPARSE_FIELD, {})
    count = backend._size_stats()["documents"]
    data = {
        "index": name,
        "fingerprint": stored.fingerprint,
        "documents": count,
        "sparse_field": sparse.get("type"),
    }
    detail = f"{name}: {'?' if count is None else count} documents, sparse {sparse.get('type')}"
    if identity is not None and stored.fingerprint and stored.fingerprint != identity.fingerprint:
        return Check(
            "index",
            FAIL,
            f"{detail}; filled with bundle {stored.fingerprint[:12]}, the local bundle is "
            f"{identity.fingerprint[:12]} (use that bundle or `index reindex`)",
            data,
        )
    if sparse.get("type") == "sparse_vector":
        prune = (sparse.get("index_options") or {}).get("prune")
        data["prune"] = prune
        if prune is None and (backend.serverless or q.takes_sparse_index_options(version)):
            # Elasticsearch shows index_options only when they differ from the default
            return Check(
                "index",
                WARN,
                f"{detail}; its sparse_vector field may prune query tokens by default: "
                "d2s-search's queries say prune: false, other clients' drop frequent tokens "
                "(`index reindex --backend elasticsearch` maps index_options {prune: false})",
                data,
            )
        detail += f", index_options prune {str(prune).lower()}" if prune is not None else ""
    return Check("index", OK, detail, data)


__all__ = ["FAIL", "OK", "SKIP", "WARN", "Check", "Report", "diagnose"]
