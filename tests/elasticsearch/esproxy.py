"""A local HTTP proxy that lets the official Elasticsearch client talk to osmem-server.

osmem-server (an in-memory OpenSearch-compatible server) speaks the same ``_bulk`` /
``rank_features`` / ``rank_feature`` / ``rescore`` API as Elasticsearch, and already answers with
``X-Elastic-Product: Elasticsearch`` (so the client's product check passes). What it lacks is
Elasticsearch's REST-compatibility media types: the client sends
``application/vnd.elasticsearch+json; compatible-with=N`` and osmem answers 406. This proxy
rewrites those request headers to plain ``application/json`` / ``application/x-ndjson``; and as
osmem has no ``dense_vector`` type (OpenSearch calls it ``knn_vector``), an index-creation body's
``dense_vector`` field is handed on as a ``knn_vector`` of the same dimension, so the index can
exist at all (only the sparse path is searched through osmem; the dense ``knn`` option is checked
against the specification and the real-server suite). Points in time are opened and closed under
OpenSearch's paths (``POST /{index}/_search/point_in_time`` answering ``pit_id``, ``DELETE
/_search/point_in_time`` with ``{"pit_id": [...]}``: opensearch-project/opensearch-api-specification,
model/_global/create_pit and delete_pit) and answered in Elasticsearch's shapes
(``OpenPointInTimeResponse`` ``{id, _shards}``, ``ClosePointInTimeResponse`` ``{succeeded,
num_freed}``: elastic/elasticsearch-specification at 9d9b9a5, output/typescript/types.ts); the
search over a point in time (``pit``, ``_shard_doc``, ``search_after``) is the same in both. It also adds
``X-Elastic-Product: Elasticsearch`` to every forwarded answer (in case a server omits it), and
keeps every fault rule of the OpenSearch tests' ``FaultProxy`` (busy bulk items, dropped
connections, injected statuses). Every request body is recorded for the spec checks.

``sparse_vector`` (with ``pretend_version``): the field is handed to osmem as the
``rank_features`` it is built on (one Lucene ``FeatureField`` per token), and the
``sparse_vector`` query becomes the linear feature clauses Elasticsearch builds, pruned as
Elasticsearch prunes them. From elastic/elasticsearch (the 8.19/9.1 line, as stored in the
index of public sources):

* ``server/src/main/java/org/elasticsearch/index/mapper/vectors/SparseVectorFieldMapper.java``:
  ``index_options`` (``prune``, ``pruning_config``) is a parameter from index version
  ``SPARSE_VECTOR_PRUNING_INDEX_OPTIONS_SUPPORT`` (9.1.0) and its 8.x backport (8.19.0); an
  index created there defaults to ``{prune: true}`` (``indexVersionSupportsDefaultPruningConfig``:
  "default pruning for 9.1.0+ or 8.19.0+"); other versions refuse the parameter as unknown.
  ``finalizeSparseVectorQuery``: the query's ``prune`` wins; without it, the field's.
* ``server/src/main/java/org/elasticsearch/inference/WeightedTokensUtils.java``
  (``queryBuilderWithPrunedTokens``, ``shouldKeepToken``): a token is kept when its document
  frequency ratio is under ``tokens_freq_ratio_threshold`` x the field's average ratio (sum of
  document frequencies / documents / distinct tokens), or its weight is over
  ``tokens_weight_threshold`` x the query's best weight; a token no document has is dropped.
* ``.../index/mapper/vectors/TokenPruningConfig.java``: thresholds 5 and 0.4 by default.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from d2s_os_faultproxy import FaultProxy  # loaded by conftest.py under this name

_COMPAT = re.compile(r"application/vnd\.elasticsearch\+([a-z-]+)(;\s*compatible-with=\d+)?")


@dataclass
class Sent:
    method: str
    path: str
    content_type: str
    accept: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def ndjson(self) -> list[Any]:
        return [json.loads(line) for line in self.body.decode("utf-8").splitlines() if line.strip()]


DEFAULT_FREQ_RATIO = 5.0  # TokenPruningConfig.DEFAULT_TOKENS_FREQ_RATIO_THRESHOLD
DEFAULT_WEIGHT_RATIO = 0.4  # TokenPruningConfig.DEFAULT_TOKENS_WEIGHT_THRESHOLD


def prunes_by_default(version: tuple[int, ...]) -> bool:
    """Index versions whose sparse_vector fields take index_options and prune by default."""
    return (8, 19) <= version[:2] < (9, 0) or version[:2] >= (9, 1)


class CompatProxy(FaultProxy):
    def __init__(self, upstream: str, ssl_context=None, pretend_version: str | None = None,
                 pretend_flavor: str | None = None) -> None:
        self.sent: list[Sent] = []
        # index or alias -> {sparse_vector field: prune setting of its index_options (None: none)}
        self.sparse_vector_fields: dict[str, dict[str, bool | None]] = {}
        # index -> {sparse_vector or dense_vector field: its mapping as given}, to answer GET _mapping with it
        self.sparse_vector_mappings: dict[str, dict[str, dict]] = {}
        # Tests of version-dependent behaviour only: answer GET / as this Elasticsearch version.
        self.pretend_version = pretend_version
        self.pretend_flavor = pretend_flavor
        super().__init__(upstream, ssl_context)

    def handle(self, h) -> None:
        # Peek at the headers the client sent (the body is read by FaultProxy.handle).
        self._ctype = h.headers.get("Content-Type") or ""
        self._accept = h.headers.get("Accept") or ""
        super().handle(h)

    def _forward(self, method: str, path: str, body: bytes, ctype: str | None) -> tuple[int, dict, bytes]:
        self.sent.append(Sent(method, path, ctype or "", getattr(self, "_accept", ""), body))
        plain = _COMPAT.sub(r"application/\1", ctype) if ctype else None
        if method == "PUT" and re.fullmatch(r"/[a-z0-9][^/_?]*", path) and body:
            body = _dense_as_knn_vector(body)
            doc = json.loads(body)
            refused = self._sparse_vector_as_rank_features(path.lstrip("/"), doc)
            if refused is not None:
                return 400, {"Content-Type": "application/json", "X-Elastic-Product": "Elasticsearch"}, refused
            body = json.dumps(doc).encode()
        added = re.fullmatch(r"/([a-z0-9][^/_?]*)/_mapping", path)
        if method == "PUT" and added and body and b'"dense_vector"' in body:  # a field added to an index
            doc = json.loads(body)
            for field, spec in (doc.get("properties") or {}).items():
                if spec.get("type") == "dense_vector":
                    self.sparse_vector_mappings.setdefault(added.group(1), {})[field] = dict(spec)
                    doc["properties"][field] = {"type": "knn_vector", "dimension": spec["dims"]}
            body = json.dumps(doc).encode()
        if method == "POST" and path.split("?")[0].endswith("/_search") and b'"sparse_vector"' in body:
            index = path.split("?")[0].removesuffix("/_search").strip("/")
            body = json.dumps(self._rewrite_sparse_vector(index, json.loads(body))).encode()
        pit = _point_in_time(method, path, body)
        if pit is not None:
            return self._point_in_time(*pit, plain)
        status, headers, content = super()._forward(method, path, body, plain)
        headers["X-Elastic-Product"] = "Elasticsearch"
        if method == "GET" and path.split("?")[0].endswith("/_mapping") and status == 200:
            content = self._mapping_as_given(content)
        if self.pretend_version and method == "GET" and path == "/" and status == 200:
            root = json.loads(content)
            root["version"] = {**root["version"], "number": self.pretend_version, "distribution": "elasticsearch"}
            if self.pretend_flavor:
                root["version"]["build_flavor"] = self.pretend_flavor
            content = json.dumps(root).encode()
        return status, headers, content

    def _point_in_time(self, method: str, path: str, body: bytes, ctype: str | None) -> tuple[int, dict, bytes]:
        status, headers, content = super()._forward(method, path, body, ctype or "application/json")
        headers["X-Elastic-Product"] = "Elasticsearch"
        if status != 200:
            return status, headers, content
        answer = json.loads(content)
        if method == "POST":
            answer = {"id": answer["pit_id"], "_shards": answer.get("_shards", {})}
        else:
            freed = [p for p in answer.get("pits", []) if p.get("successful")]
            answer = {"succeeded": len(freed) == len(answer.get("pits", [])), "num_freed": len(freed)}
        return status, headers, json.dumps(answer).encode()

    # -- sparse_vector as Elasticsearch does it (see the module docstring) ---------------------

    def _version(self) -> tuple[int, ...] | None:
        if not self.pretend_version:
            return None
        return tuple(int(p) for p in re.findall(r"\d+", self.pretend_version)[:3])

    def _sparse_vector_as_rank_features(self, name: str, doc: dict) -> bytes | None:
        """Remember the index's sparse_vector fields and make them rank_features in ``doc``; the
        error body when the version refuses their index_options."""
        props = (doc.get("mappings") or {}).get("properties") or {}
        fields: dict[str, bool | None] = {}
        for field, spec in props.items():
            if spec.get("type") != "sparse_vector":
                continue
            version = self._version()
            if "index_options" in spec and (version is None or not prunes_by_default(version)):
                reason = f"unknown parameter [index_options] on mapper [{field}] of type [sparse_vector]"
                error = {"root_cause": [{"type": "mapper_parsing_exception", "reason": reason}],
                         "type": "mapper_parsing_exception", "reason": f"Failed to parse mapping: {reason}"}
                return json.dumps({"error": error, "status": 400}).encode()
            prune = (spec.get("index_options") or {}).get("prune")
            if prune is None and version is not None and prunes_by_default(version):
                prune = True
            fields[field] = prune
            self.sparse_vector_mappings.setdefault(name, {})[field] = dict(spec)
            props[field] = {"type": "rank_features"}
        if fields:
            for target in [name, *((doc.get("aliases") or {}).keys())]:
                self.sparse_vector_fields[target] = fields
        return None

    def _mapping_as_given(self, content: bytes) -> bytes:
        """GET _mapping shows the sparse_vector fields (and index_options given, which differ from
        the default: SparseVectorFieldMapper serializes only those)."""
        answer = json.loads(content)
        for index, body in answer.items():
            props = (body.get("mappings") or {}).get("properties") or {}
            props.update(self.sparse_vector_mappings.get(index, {}))
        return json.dumps(answer).encode()

    def _rewrite_sparse_vector(self, index: str, node):
        if isinstance(node, list):
            return [self._rewrite_sparse_vector(index, x) for x in node]
        if not isinstance(node, dict):
            return node
        if set(node) == {"sparse_vector"}:
            spec = node["sparse_vector"]
            field = spec["field"]
            prune = spec.get("prune")
            if prune is None:
                prune = self.sparse_vector_fields.get(index, {}).get(field)
            tokens = dict(spec["query_vector"])
            if prune:
                tokens = self._kept_tokens(index, field, tokens, spec.get("pruning_config") or {})
            if not tokens:
                return {"match_none": {}}
            should = [{"rank_feature": {"field": f"{field}.{t}", "linear": {}, "boost": w}} for t, w in tokens.items()]
            return {"bool": {"should": should, "minimum_should_match": 1}}
        return {k: self._rewrite_sparse_vector(index, v) for k, v in node.items()}

    def _kept_tokens(self, index: str, field: str, tokens: dict[str, float], config: dict) -> dict[str, float]:
        """WeightedTokensUtils.queryBuilderWithPrunedTokens over the index's stored tokens."""
        status, _, content = super()._forward(
            "POST", f"/{index}/_search",
            json.dumps({"size": 10_000, "_source": [field], "query": {"match_all": {}}}).encode(), "application/json")
        docs = [h["_source"].get(field) or {} for h in json.loads(content)["hits"]["hits"]] if status == 200 else []
        docs = [d for d in docs if d]
        doc_freq: dict[str, int] = {}
        for d in docs:
            for token in d:
                doc_freq[token] = doc_freq.get(token, 0) + 1
        if not docs or not doc_freq:
            return {}
        average = sum(doc_freq.values()) / len(docs) / len(doc_freq)
        best = max(tokens.values())
        freq_ratio = float(config.get("tokens_freq_ratio_threshold", DEFAULT_FREQ_RATIO))
        weight_ratio = float(config.get("tokens_weight_threshold", DEFAULT_WEIGHT_RATIO))
        kept = {}
        for token, weight in tokens.items():
            df = doc_freq.get(token, 0)
            if df and (df / len(docs) < freq_ratio * average or weight > weight_ratio * best):
                kept[token] = weight
        return kept

    def bodies(self, method: str, path_part: str) -> list[Sent]:
        return [s for s in self.sent if s.method == method.upper() and path_part in s.path]


def _dense_as_knn_vector(body: bytes) -> bytes:
    doc = json.loads(body)
    props = (doc.get("mappings") or {}).get("properties") or {}
    for name, field in props.items():
        if field.get("type") == "dense_vector":
            props[name] = {"type": "knn_vector", "dimension": field["dims"]}
            doc.setdefault("settings", {}).setdefault("index", {})["knn"] = True
    return json.dumps(doc).encode()


def _point_in_time(method: str, path: str, body: bytes) -> tuple[str, str, bytes] | None:
    """Elasticsearch's open / close point in time as the OpenSearch request (None: another request)."""
    route, _, query = path.partition("?")
    m = re.fullmatch(r"/([^/_][^/]*)/_pit", route)
    if method == "POST" and m:
        return "POST", f"/{m.group(1)}/_search/point_in_time" + (f"?{query}" if query else ""), b""
    if method == "DELETE" and route == "/_pit":
        return "DELETE", "/_search/point_in_time", json.dumps({"pit_id": [json.loads(body)["id"]]}).encode()
    return None
