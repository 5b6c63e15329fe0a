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


class CompatProxy(FaultProxy):
    def __init__(self, upstream: str, ssl_context=None, pretend_version: str | None = None,
                 pretend_flavor: str | None = None) -> None:
        self.sent: list[Sent] = []
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
        pit = _point_in_time(method, path, body)
        if pit is not None:
            return self._point_in_time(*pit, plain)
        status, headers, content = super()._forward(method, path, body, plain)
        headers["X-Elastic-Product"] = "Elasticsearch"
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
