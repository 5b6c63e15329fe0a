"""A local stand-in for Kibana's saved-objects import and spaces APIs, on 127.0.0.1.

Behaviour read from elastic/kibana (main-line 8.x/9.x source, paths as in the repository):

- src/core/packages/http/server-internal/src/lifecycle_handlers.ts (xsrf pre-handler): a write
  (POST/PUT/DELETE...) without ``kbn-xsrf`` (or ``kbn-version``) gets 400
  ``{"statusCode":400,"error":"Bad Request","message":"Request must contain a kbn-xsrf header."}``.
- src/core/packages/saved-objects/server-internal/src/routes/import.ts: ``POST /api/saved_objects/
  _import`` (under ``/s/<space>`` for a space), multipart field ``file``; query ``overwrite``,
  ``createNewCopies``, ``compatibilityMode`` (overwrite with createNewCopies is refused: "cannot
  use [overwrite] with [createNewCopies]"); a file name not ending in ``.ndjson`` is refused with
  400 "Invalid file extension <ext>"; the answer is ``{success, successCount, errors,
  successResults}``.
- src/core/packages/saved-objects/import-export-server-internal/src/import/ (import_saved_objects,
  collect_saved_objects, validate_references, check_conflicts): unknown types are
  ``unsupported_type`` errors, references to objects neither in the file nor stored are
  ``missing_references`` errors, an existing object without ``overwrite`` is a ``conflict``;
  objects without errors are still created; ``success`` is "no errors"; each success result
  lists ``type``, ``id``, ``meta.title`` and ``overwrite: true`` when it replaced an object.
- x-pack/platform/plugins/shared/spaces (routes/api/external/get.ts): ``GET /api/spaces/space/<id>``
  answers the space or 404.
- Authentication (security plugin): without valid Basic or ApiKey credentials, 401.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# Types a stock Kibana imports (a subset: what d2s-search and its tests use).
IMPORTABLE = {"index-pattern", "search", "visualization", "dashboard", "lens", "tag", "config"}
_PATH = re.compile(r"^(?:/s/(?P<space>[a-z0-9_-]+))?(?P<rest>/.*)$")


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    filename: str | None = None
    objects: list[dict[str, Any]] = field(default_factory=list)


class FakeKibana:
    def __init__(self, *, users: dict[str, str] | None = None, api_keys: set[str] | None = None,
                 spaces: set[str] | None = None, not_ready: int = 0) -> None:
        self.users = users or {}
        self.api_keys = api_keys or set()
        self.spaces = {"default"} | (spaces or set())
        self.not_ready = not_ready  # answer this many requests with 503 first (Kibana starting)
        self.stored: dict[str, dict[tuple[str, str], dict[str, Any]]] = {s: {} for s in self.spaces}
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                fake.handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- handling ---------------------------------------------------------------------------

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        url = urlsplit(h.path)
        seen = Seen(h.command, h.path, {k.lower(): v for k, v in h.headers.items()})
        self.seen.append(seen)
        with self._lock:
            if self.not_ready > 0:
                self.not_ready -= 1
                return _send(h, 503, {"statusCode": 503, "error": "Service Unavailable",
                                      "message": "Kibana server is not ready yet"})
        if not self._authenticated(h):
            return _send(h, 401, {"statusCode": 401, "error": "Unauthorized",
                                  "message": "[security_exception]: unable to authenticate user"})
        if h.command not in ("GET", "HEAD", "OPTIONS") and not (h.headers.get("kbn-xsrf") or h.headers.get("kbn-version")):
            return _send(h, 400, {"statusCode": 400, "error": "Bad Request",
                                  "message": "Request must contain a kbn-xsrf header."})
        m = _PATH.match(url.path)
        space, rest = (m.group("space") or "default"), m.group("rest")
        spaced = re.fullmatch(r"/api/spaces/space/([a-z0-9_-]+)", rest)
        if h.command == "GET" and spaced:
            sid = spaced.group(1)
            if sid not in self.spaces:
                return _send(h, 404, {"statusCode": 404, "error": "Not Found", "message": "Not Found"})
            return _send(h, 200, {"id": sid, "name": sid, "disabledFeatures": []})
        if h.command == "POST" and rest == "/api/saved_objects/_import":
            return self._import(h, space, parse_qs(url.query), body, seen)
        return _send(h, 404, {"statusCode": 404, "error": "Not Found", "message": "Not Found"})

    def _authenticated(self, h: BaseHTTPRequestHandler) -> bool:
        if not self.users and not self.api_keys:
            return True
        auth = h.headers.get("Authorization") or ""
        scheme, _, value = auth.partition(" ")
        if scheme == "ApiKey":
            return value in self.api_keys
        if scheme == "Basic":
            try:
                user, _, password = base64.b64decode(value).decode().partition(":")
            except ValueError:
                return False
            return self.users.get(user) == password
        return False

    def _import(self, h: BaseHTTPRequestHandler, space: str, query: dict[str, list[str]], body: bytes,
                seen: Seen) -> None:
        def flag(name: str) -> bool:
            return (query.get(name) or ["false"])[0] == "true"

        overwrite, copies = flag("overwrite"), flag("createNewCopies")
        if overwrite and copies:
            return _bad(h, "[request query]: cannot use [overwrite] with [createNewCopies]")
        ctype = h.headers.get("Content-Type") or ""
        if not ctype.startswith("multipart/form-data"):
            return _send(h, 415, {"statusCode": 415, "error": "Unsupported Media Type",
                                  "message": "Unsupported Media Type"})
        msg = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body)
        part = next((p for p in msg.iter_parts() if p.get_param("name", header="content-disposition") == "file"), None)
        if part is None:
            return _bad(h, "[request body.file]: expected value of type [Stream] but got [undefined]")
        filename = part.get_filename() or ""
        seen.filename = filename
        ext = ("." + filename.rsplit(".", 1)[-1].lower()) if "." in filename else ""
        if ext != ".ndjson":
            return _bad(h, f"Invalid file extension {ext}")
        objects = []
        for line in part.get_payload(decode=True).decode("utf-8").splitlines():
            if line.strip():
                try:
                    objects.append(json.loads(line))
                except ValueError:
                    return _bad(h, "Unexpected token in JSON")
        seen.objects = objects
        if space not in self.spaces:  # no such space: nothing can be stored there
            return _send(h, 404, {"statusCode": 404, "error": "Not Found", "message": "Not Found"})
        store = self.stored[space]
        in_file = {(o.get("type"), o.get("id")) for o in objects}
        errors, results = [], []
        for o in objects:
            key = (o.get("type"), o.get("id"))
            meta = {"title": (o.get("attributes") or {}).get("title", "")}
            base = {"id": o.get("id"), "type": o.get("type"), "meta": meta}
            if o.get("type") not in IMPORTABLE:
                errors.append({**base, "error": {"type": "unsupported_type"}})
                continue
            missing = [{"type": r["type"], "id": r["id"]} for r in o.get("references") or []
                       if (r.get("type"), r.get("id")) not in in_file and (r.get("type"), r.get("id")) not in store]
            if missing:
                errors.append({**base, "error": {"type": "missing_references", "references": missing}})
                continue
            existed = key in store
            if existed and not overwrite:
                errors.append({**base, "error": {"type": "conflict"}})
                continue
            store[key] = o
            results.append({**base, **({"overwrite": True} if existed else {})})
        _send(h, 200, {"success": not errors, "successCount": len(results), "errors": errors,
                       "successResults": results, "warnings": []})


def _bad(h: BaseHTTPRequestHandler, message: str) -> None:
    _send(h, 400, {"statusCode": 400, "error": "Bad Request", "message": message})


def _send(h: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
    content = json.dumps(payload).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json; charset=utf-8")
    h.send_header("Content-Length", str(len(content)))
    h.end_headers()
    h.wfile.write(content)
