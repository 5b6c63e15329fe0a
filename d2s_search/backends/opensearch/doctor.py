"""``d2s-search doctor``: what the configured cluster can do for d2s-search, one check a line.

Every check reads the cluster (nothing is written) and ends ``ok``, ``warn``, ``fail`` or
``skip`` (could not be read, e.g. a user without ``cluster:monitor/*`` or Serverless, which
has no ``GET /``, ``_cat`` or ``_nodes``). The plans each need (component names as
``_cat/plugins`` lists them; versions from the plugin sources, see cluster.py):

    sparse, two-phase          core (rank_features, rescore)
    dense                      opensearch-knn
    dense (lucene engine)      opensearch-knn >= 2.13 (inner product on Lucene HNSW)
    hybrid (min-max)           opensearch-neural-search + opensearch-knn, OpenSearch >= 2.10
    hybrid (RRF)               the same, OpenSearch >= 2.19; not on Serverless
    neural_sparse (tokens)     opensearch-neural-search >= 2.14 (query_tokens)
    server-side model          opensearch-neural-search + opensearch-ml; not on Serverless
    sparse_vector / SEISMIC    opensearch-neural-search >= 3.3; not on Serverless; its dense
                               vectors in <name>-dense (opensearch-knn), hybrid fused here

On Serverless (no ``GET /`` or ``_cat/plugins``) the plans are the ones AWS documents for a
vector search collection (serverless.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.cluster import (
    DISTRIBUTION_SERVERLESS,
    HYBRID_QUERY,
    ClusterInfo,
    version_text,
)
from d2s_search.backends.opensearch.seismic import dense_index
from d2s_search.errors import BackendUnavailableError, D2SError

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
KNN, NEURAL, ML, SECURITY = "opensearch-knn", "opensearch-neural-search", "opensearch-ml", "opensearch-security"
ML_SETTINGS = (
    "plugins.ml_commons.only_run_on_ml_node",
    "plugins.ml_commons.allow_registering_model_via_local_file",
    "plugins.ml_commons.allow_registering_model_via_url",
    "plugins.ml_commons.native_memory_threshold",
    "plugins.ml_commons.jvm_heap_memory_threshold",
    "plugins.ml_commons.disk_free_space_threshold",
)
MIN_ML_HEAP = 2 * 1024**3  # below this, loading an ONNX model trips the heap breaker easily


@dataclass
class Check:
    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "status": self.status, "detail": self.detail, **({"data": self.data} if self.data else {})}


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)

    def get(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"ok": not self.failed, "checks": [c.to_json() for c in self.checks]}


def diagnose(backend: Any, identity: Any = None) -> Report:
    """Run every check against ``backend`` (an OpenSearchBackend); ``identity`` is the bundle's."""
    report = Report()
    add = report.checks.append
    root = backend.http.request("GET", "/", raise_auth=False)
    info: ClusterInfo = backend.cluster()
    if root.ok:
        add(Check("reachable", OK, f"{backend.url} answered as cluster {info.cluster_name or '?'}"))
    elif info.distribution == DISTRIBUTION_SERVERLESS:
        add(Check("reachable", OK, f"{backend.url} (Serverless has no GET /: {root.status})"))
    else:
        add(Check("reachable", FAIL if root.status in (401,) else WARN, f"GET / answered {root.status}: {root.error_reason()}"))
    version = info.version
    if version is None:
        note = " (Elasticsearch-compatibility mode reports 7.10.2)" if info.extra.get("compatibility_mode") else ""
        add(Check("version", WARN, f"unknown{note}; request bodies for the newest release are used"))
    else:
        add(Check("version", OK if version >= HYBRID_QUERY else WARN, f"OpenSearch {version_text(version)}",
                  {"version": version_text(version)}))
    add(Check("distribution", OK, info.distribution))

    plugins = _plugins(backend)
    if plugins is None:
        add(Check("plugins", SKIP, "cannot list plugins (_cat/plugins not allowed or not offered)"))
        present = {KNN, NEURAL, ML} if info.distribution == DISTRIBUTION_SERVERLESS else set()
    else:
        present = plugins
        wanted = (KNN, NEURAL, ML, SECURITY)
        shown = ", ".join(f"{name.removeprefix('opensearch-')} {'yes' if name in present else 'no'}" for name in wanted)
        missing = [n for n in (KNN, NEURAL) if n not in present]
        add(Check("plugins", WARN if missing else OK, shown, {"present": sorted(present)}))
    add(_plans(info, present, plugins is not None))
    if info.distribution == DISTRIBUTION_SERVERLESS:
        add(Check("serverless", OK, "the collection assigns document ids: each document's content hash is its "
                  "content_id field (re-ingest finds it); no _refresh, no scroll (search_after), no reindex"))
    add(_bodies(info))
    add(_clauses(backend))
    add(_ml(backend, present if plugins is not None else None))
    add(_index(backend, identity))
    return report


def _plugins(backend: Any) -> set[str] | None:
    reply = backend.http.request("GET", "/_cat/plugins", params={"format": "json"}, raise_auth=False)
    if not reply.ok or not isinstance(reply.body, list):
        return None
    return {str(row.get("component", "")) for row in reply.body if isinstance(row, Mapping)}


def _plans(info: ClusterInfo, present: set[str], known: bool) -> Check:
    d = info.dialect
    has = present.__contains__
    managed = info.distribution != DISTRIBUTION_SERVERLESS  # what Serverless does not offer
    plans = {
        "sparse": True, "two-phase": True,
        "dense": has(KNN),
        "dense (lucene engine)": has(KNN) and d.lucene_inner_product,
        "hybrid min-max": has(KNN) and has(NEURAL) and d.hybrid,
        "hybrid rrf": has(KNN) and has(NEURAL) and d.rrf and managed,
        "neural_sparse": has(NEURAL) and d.neural_sparse_tokens,
        "server-side model": has(NEURAL) and has(ML) and managed,
        "sparse_vector (SEISMIC)": has(NEURAL) and d.sparse_vector and managed,
    }
    working = [p for p, ok in plans.items() if ok]
    not_working = [p for p, ok in plans.items() if not ok]
    detail = f"work: {', '.join(working)}" + (f"; not: {', '.join(not_working)}" if not_working else "")
    if plans["sparse_vector (SEISMIC)"]:
        detail += ("; SEISMIC keeps only sparse vectors (k-NN and neural-search cannot share an index): dense in "
                   "<index>-dense, hybrid fused here" + ("" if has(KNN) else ", which needs opensearch-knn"))
    if not known:
        detail += " (plugins unknown: assumed from the distribution)"
    return Check("plans", OK if plans["hybrid min-max"] else WARN, detail, {"plans": plans})


def _bodies(info: ClusterInfo) -> Check:
    d = info.dialect
    hybrid = "hybrid: pagination_depth" if d.pagination_depth else "hybrid: from 0, size = window, page cut here"
    if not d.rrf:
        rrf = "rrf: not available before 2.19"
    elif d.rrf_rank_constant_top_level:
        rrf = "rrf: combination.rank_constant"
    else:
        rrf = "rrf: combination.parameters.rank_constant"
    return Check("request bodies", OK, f"{hybrid}; {rrf} (for {version_text(info.version)})",
                 {"pagination_depth": d.pagination_depth, "rrf_rank_constant_top_level": d.rrf_rank_constant_top_level})


def _clauses(backend: Any) -> Check:
    reply = backend.http.request("GET", "/_cluster/settings",
                                 params={"include_defaults": "true", "flat_settings": "true"}, raise_auth=False)
    limit = backend.max_clauses()
    budget = q.clause_budget(limit)
    if reply.status in (401, 403):
        return Check("max_clause_count", WARN, f"cannot read cluster settings ({reply.status}); assuming {limit} "
                     f"(queries keep {budget} terms)", {"max_clause_count": limit})
    return Check("max_clause_count", OK, f"{limit} (queries keep their {budget} strongest terms)",
                 {"max_clause_count": limit})


def _ml(backend: Any, present: set[str] | None) -> Check:
    if present is not None and ML not in present:
        return Check("ml-commons", SKIP, "no ml-commons plugin: query --server-side uses the search template")
    reply = backend.http.request("GET", "/_cluster/settings",
                                 params={"include_defaults": "true", "flat_settings": "true"}, raise_auth=False)
    if not reply.ok or not isinstance(reply.body, dict):
        return Check("ml-commons", SKIP, f"cannot read cluster settings ({reply.status})")
    values: dict[str, Any] = {}
    for key in ML_SETTINGS:
        for scope in ("transient", "persistent", "defaults"):
            if key in reply.body.get(scope, {}):
                values[key] = reply.body[scope][key]
                break
    short = {k.removeprefix("plugins.ml_commons."): v for k, v in values.items()}
    problems = []
    if str(values.get(ML_SETTINGS[0], "")).lower() == "true":
        problems.append("only_run_on_ml_node=true (no ML node? --configure-cluster sets it false)")
    if str(values.get(ML_SETTINGS[1], "")).lower() == "false":
        problems.append("uploads not allowed (--configure-cluster allows them)")
    heap = _heap(backend)
    if heap:
        short["heap_max"] = f"{heap['heap_max'] / 1024**3:.1f} GiB"
        short["heap_used_percent"] = heap["heap_used_percent"]
        threshold = int(values.get(ML_SETTINGS[4], 85) or 85)
        if heap["heap_max"] < MIN_ML_HEAP:
            problems.append(f"heap {short['heap_max']} < 2 GiB: set OPENSEARCH_HEAP=2g or more")
        if threshold < 100 and heap["heap_used_percent"] > threshold:
            problems.append(f"heap use {heap['heap_used_percent']}% is over jvm_heap_memory_threshold ({threshold}%)")
    free = _disk_free(backend)
    if free is not None:
        short["disk_free"] = f"{free / 1024**3:.1f} GiB"
        needed = byte_size(values.get(ML_SETTINGS[5])) or 5 * 1024**3  # DiskCircuitBreaker default: 5 GB
        if free < needed:
            problems.append(f"{short['disk_free']} free on a node's disk, under disk_free_space_threshold "
                            f"({needed / 1024**3:g} GiB): ml-commons refuses register, deploy and predict")
    detail = ", ".join(f"{k}={v}" for k, v in short.items()) or "settings not reported"
    if problems:
        detail += "; " + "; ".join(problems)
    return Check("ml-commons", WARN if problems else OK, detail, {"settings": short})


def _heap(backend: Any) -> dict[str, int] | None:
    reply = backend.http.request("GET", "/_nodes/stats/jvm", raise_auth=False)
    if not reply.ok or not isinstance(reply.body, dict):
        return None
    nodes = list((reply.body.get("nodes") or {}).values())
    mems = [n.get("jvm", {}).get("mem", {}) for n in nodes]
    mems = [m for m in mems if "heap_max_in_bytes" in m]
    if not mems:
        return None
    smallest = min(mems, key=lambda m: m["heap_max_in_bytes"])
    return {"heap_max": int(smallest["heap_max_in_bytes"]),
            "heap_used_percent": max(int(m.get("heap_used_percent", 0)) for m in mems)}


def _disk_free(backend: Any) -> int | None:
    """The smallest free space a node reports for its data paths (what DiskCircuitBreaker reads)."""
    reply = backend.http.request("GET", "/_nodes/stats/fs", raise_auth=False)
    if not reply.ok or not isinstance(reply.body, dict):
        return None
    free = [n.get("fs", {}).get("total", {}).get("available_in_bytes") for n in (reply.body.get("nodes") or {}).values()]
    free = [int(f) for f in free if isinstance(f, int)]
    return min(free) if free else None


_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4, "pb": 1024**5}


def byte_size(text: Any) -> int | None:
    """An OpenSearch byte-size setting ("5gb", "512mb", "1024") in bytes; None if unreadable."""
    value = str(text or "").strip().lower()
    unit = next((u for u in sorted(_UNITS, key=len, reverse=True) if value.endswith(u)), "b")
    try:
        return int(float(value.removesuffix(unit) if value.endswith(unit) else value) * _UNITS[unit])
    except ValueError:
        return None


def _index(backend: Any, identity: Any) -> Check:
    try:
        stored = backend._stored_identity()
    except BackendUnavailableError:
        raise
    except D2SError as exc:
        return Check("index", FAIL, str(exc))
    name = backend.index_name
    if stored is None:
        return Check("index", WARN, f"no index {name!r} yet (`d2s-search index create` or ingest makes it)")
    mapping = backend._mapping()
    props = next(iter(mapping.values())).get("mappings", {}).get("properties", {})
    sparse_type = props.get(q.SPARSE_FIELD, {}).get("type")
    dense, where = props.get(q.DENSE_FIELD, {}), ""
    if not dense and sparse_type == "sparse_vector":  # SEISMIC: the vectors are in the sibling
        where = f" in {dense_index(name)}"
        dense = _sibling_dense_field(backend, dense_index(name))
    count = backend._size_stats()["documents"]  # None where counting is not offered (Serverless)
    data = {"index": name, "fingerprint": stored.fingerprint, "documents": count, "sparse_field": sparse_type,
            "dense_dim": dense.get("dimension")}
    detail = (f"{name}: {'?' if count is None else count} documents, sparse {sparse_type}, "
              f"dense {dense.get('type')}[{dense.get('dimension')}]{where}")
    if sparse_type not in ("rank_features", "sparse_vector"):
        return Check("index", FAIL, f"{detail}; `{q.SPARSE_FIELD}` is not rank_features/sparse_vector", data)
    if identity is None:
        return Check("index", OK, f"{detail}, bundle {stored.fingerprint[:12] or '?'} (no local bundle to compare)", data)
    if stored.fingerprint and stored.fingerprint != identity.fingerprint:
        return Check("index", FAIL, f"{detail}; filled with bundle {stored.fingerprint[:12]}, the local bundle is "
                     f"{identity.fingerprint[:12]} (use that bundle or `index reindex`)", data)
    if identity.dense_dim and dense.get("dimension") and dense["dimension"] != identity.dense_dim:
        return Check("index", FAIL, f"{detail}; the bundle makes {identity.dense_dim}-d vectors", data)
    return Check("index", OK, f"{detail}, bundle {identity.fingerprint[:12]} matches", data)


def _sibling_dense_field(backend: Any, sibling: str) -> dict[str, Any]:
    """The dense field's mapping in a SEISMIC index's sibling ({} when it is missing)."""
    status, body = backend._call("GET", f"/{sibling}/_mapping")
    if status != 200 or not isinstance(body, dict) or not body:
        return {}
    return next(iter(body.values())).get("mappings", {}).get("properties", {}).get(q.DENSE_FIELD, {})
