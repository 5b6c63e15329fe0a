"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an OpenSearch-compatible server.

Rules are consumed in order by the first request they match (method and a path substring):

    proxy.add("POST", "/_bulk", "status", code=429)        # answer 429, do not forward
    proxy.add("POST", "/_bulk", "drop_before")             # close the socket, request lost
    proxy.add("POST", "/_bulk", "drop_after")              # forward, then close: applied, answer lost
    proxy.add("POST", "/_bulk", "delay", seconds=1.5)      # forward, answer late (client timeout)
    proxy.add("POST", "/_bulk", "busy_items", every=2)     # forward only some items; the others 429
    proxy.add("POST", "/_bulk", "reject_items", ids={...}) # those items fail for good (400)
    proxy.add("POST", "/_bulk", "page", code=200)          # a proxy's HTML page, not forwarded

``proxy.log`` records (method, path, action, bulk item count, body) for every request seen.
``stub(method, path, body) -> (status, payload) | None`` answers what the upstream lacks
(osmem has no kNN or search pipelines) without forwarding; ``plugins.PluginStandIn`` is one.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


@dataclass
class Rule:
    method: str
    path: str
    action: str
    options: dict[str, Any] = field(default_factory=dict)
    times: int = 1


@dataclass
class Seen:
    method: str
    path: str
    action: str
    items: int | None = None
    ids: list[str] = field(default_factory=list)
    auth: str | None = None
    body: bytes = b""
    content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class FaultProxy:
    def __init__(self, upstream: str, ssl_context=None, stub=None) -> None:
        self.upstream = upstream.rstrip("/")
        self.stub = stub
        self.rules: list[Rule] = []
        self.log: list[Seen] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=30.0)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _handle(self) -> None:
                proxy.handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if ssl_context is not None:  # serve HTTPS (TLS tests)
            self.server.socket = ssl_context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def add(self, method: str, path: str, action: str, times: int = 1, **options: Any) -> None:
        with self._lock:
            self.rules.append(Rule(method.upper(), path, action, options, times))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._client.close()

    def seen(self, method: str, path: str) -> list[Seen]:
        return [s for s in self.log if s.method == method.upper() and path in s.path]

    # -- request handling -------------------------------------------------------------------

    def _rule_for(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.method == method and rule.path in path:
                    rule.times -= 1
                    if rule.times <= 0:
                        self.rules.remove(rule)
                    return rule
        return None

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        method, path = h.command, h.path
        rule = self._rule_for(method, path)
        action = rule.action if rule else "forward"
        lines = body.decode("utf-8").splitlines() if path.split("?")[0].endswith("/_bulk") else None
        ids = [meta.get("_id") for meta in _bulk_actions(lines)] if lines else []
        self.log.append(Seen(method, path, action, len(ids) if lines is not None else None, ids,
                             h.headers.get("Authorization"), body, h.headers.get("Content-Type", ""),
                             {k.lower(): v for k, v in h.headers.items()}))
        stubbed = self.stub(method, path, body) if self.stub and action == "forward" else None
        if stubbed is not None:  # bytes are sent as they are (b"": an empty body)
            payload = stubbed[1] if isinstance(stubbed[1], bytes) else json.dumps(stubbed[1]).encode()
            return self._send(h, stubbed[0], payload, {})
        if action == "status":
            code = rule.options["code"]
            payload = {"error": {"type": "test_fault", "reason": f"injected {code}"}, "status": code}
            headers = {"Retry-After": str(rule.options["retry_after"])} if "retry_after" in rule.options else {}
            return self._send(h, code, json.dumps(payload).encode(), headers)
        if action == "drop_before":
            return self._drop(h)
        if action == "page":
            return self._page(h, rule)
        if action in ("busy_items", "reject_items"):
            return self._bulk_items(h, path, lines or [], rule)
        status, headers, content = self._forward(method, path, body, h.headers.get("Content-Type"))
        if action == "drop_after":
            return self._drop(h)
        if action == "delay":
            time.sleep(rule.options["seconds"])
        self._send(h, status, content, headers)

    def _forward(self, method: str, path: str, body: bytes, ctype: str | None) -> tuple[int, dict, bytes]:
        headers = {"Content-Type": ctype} if ctype else {}
        resp = self._client.request(method, self.upstream + path, content=body or None, headers=headers)
        return resp.status_code, {"Content-Type": resp.headers.get("Content-Type", "application/json")}, resp.content

    def _bulk_items(self, h: BaseHTTPRequestHandler, path: str, lines: list[str], rule: Rule) -> None:
        pairs = [lines[i : i + 2] for i in range(0, len(lines), 2)]
        faulty: list[int] = []
        for n, (action_line, _) in enumerate(pairs):
            doc_id = json.loads(action_line).popitem()[1].get("_id")
            if rule.action == "busy_items" and n % rule.options.get("every", 2) == 0 or rule.action == "reject_items" and doc_id in rule.options["ids"]:
                faulty.append(n)
        kept = [p for n, p in enumerate(pairs) if n not in faulty]
        upstream_items: list[dict] = []
        if kept:
            payload = "\n".join(x for p in kept for x in p) + "\n"
            status, _, content = self._forward("POST", path, payload.encode(), "application/x-ndjson")
            upstream_items = json.loads(content)["items"]
        items, up = [], iter(upstream_items)
        for n, (action_line, _) in enumerate(pairs):
            if n not in faulty:
                items.append(next(up))
                continue
            op, meta = json.loads(action_line).popitem()
            if rule.action == "busy_items":
                error = {"type": "es_rejected_execution_exception", "reason": "injected: queue full"}
                status = 429
            else:
                error = {"type": "mapper_parsing_exception", "reason": "injected: failed to parse"}
                status = 400
            items.append({op: {"_index": meta.get("_index"), "_id": meta.get("_id"), "status": status, "error": error}})
        out = {"took": 1, "errors": bool(faulty) or any("error" in next(iter(i.values())) for i in items), "items": items}
        self._send(h, 200, json.dumps(out).encode(), {"Content-Type": "application/json"})

    @staticmethod
    def _page(h: BaseHTTPRequestHandler, rule: Rule) -> None:
        """An HTML page (``code``, ``content_type``) as a login wall or a misconfigured proxy
        answers: it reflects the request's Authorization header, as such pages sometimes do."""
        auth = h.headers.get("Authorization") or "(none)"
        page = (f"<html><head><title>Sign in</title></head><body><h1>Please sign in</h1>"
                f"<p>Request headers: Authorization: {auth}</p></body></html>").encode()
        kind = rule.options.get("content_type", "text/html; charset=utf-8")
        FaultProxy._send(h, rule.options.get("code", 200), page, {"Content-Type": kind})

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, content: bytes, headers: dict) -> None:
        h.send_response(status)
        for k, v in headers.items():
            if k.lower() != "content-type":
                h.send_header(k, v)
        h.send_header("Content-Type", headers.get("Content-Type", "application/json"))
        h.send_header("Content-Length", str(len(content)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(content)

    @staticmethod
    def _drop(h: BaseHTTPRequestHandler) -> None:
        h.close_connection = True
        with contextlib.suppress(OSError):
            h.connection.shutdown(2)


def _bulk_actions(lines: list[str]) -> list[dict]:
    """The metadata of each action of a ``_bulk`` body (a delete has no source line)."""
    out, i = [], 0
    while i < len(lines):
        ((op, meta),) = json.loads(lines[i]).items()
        out.append(meta)
        i += 1 if op == "delete" else 2
    return out
