"""The OpenSearch connection on every opensearch-py release ``pyproject.toml`` allows.

CI runs this file twice: in the main environment (newest opensearch-py) and in a small one
holding only the runtime dependencies and the lowest allowed opensearch-py (``.ci/run``), so it
needs nothing beyond them: the cluster is a stand-in on ``http.server`` answering the few
requests made here in OpenSearch's shapes.

Before 2.8.0 ``Transport._resolve_request_args`` took ``(method, params, body)``; from 2.8.0
``(method, params, body, ignore, timeout)`` (opensearch-project/opensearch-py,
``opensearchpy/transport.py`` at v2.7.1 and v2.8.0). The connection must work on both sides.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from opensearchpy import Transport

from d2s_search.backends.base import Document
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.backends.opensearch.client import OpenSearchHTTP

ROOT = Path(__file__).resolve().parents[2]


class StandIn:
    """Answers GET /, HEAD /<index>, POST /_bulk and POST /<index>/_search; records each request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []
        self.stored: dict[str, dict] = {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def handle_one(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.seen.append((self.command, self.path, body))
                status, answer = stand_in.answer(self.command, self.path.split("?")[0], body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, method: str, path: str, body: bytes):
        if method == "GET" and path == "/":
            return 200, {
                "cluster_name": "stand-in",
                "version": {"distribution": "opensearch", "number": "2.19.1"},
            }
        if method == "HEAD":
            return (200 if path.strip("/") in ("d2s", "d2s-000001") else 404), {}
        if method == "POST" and path == "/_bulk":
            lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
            items = []
            for action, source in zip(lines[0::2], lines[1::2]):
                meta = action["index"]
                self.stored[meta["_id"]] = source
                items.append(
                    {
                        "index": {
                            "_index": "d2s-000001",
                            "_id": meta["_id"],
                            "status": 201,
                            "result": "created",
                        }
                    }
                )
            return 200, {"took": 1, "errors": False, "items": items}
        if method == "POST" and re.fullmatch(r"/[^/_][^/]*/_search", path):
            hits = [{"_id": i, "_score": 1.0, "_source": s} for i, s in sorted(self.stored.items())]
            return 200, {"hits": {"hits": hits}}
        return 400, {
            "error": {
                "type": "illegal_argument_exception",
                "reason": f"no handler for {method} {path}",
            }
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    s = StandIn()
    yield s
    s.close()


def _docs(n: int) -> list[Document]:
    rng = np.random.default_rng(5)
    return [
        Document(
            id=f"{i:064x}",
            path=f"p/{i}.jpg",
            size_bytes=10,
            width=4,
            height=3,
            sparse={"dog": 1.0 + i, "car": 0.5},
            dense=rng.normal(size=8).astype(np.float32),
        )
        for i in range(n)
    ]


def test_client_calls_go_through_the_retry_policy(stand_in):
    http = OpenSearchHTTP(stand_in.url, retries=0)
    try:
        assert http.client.info()["cluster_name"] == "stand-in"
        assert http.client.indices.exists(index="d2s") is True
        assert http.client.indices.exists(index="other") is False
        hits = http.client.search(index="d2s", body={"query": {"match_all": {}}}, request_timeout=5)
        assert hits["hits"]["hits"] == []
    finally:
        http.close()
    sent = [(m, p.split("?")[0]) for m, p, _ in stand_in.seen]
    assert sent == [("GET", "/"), ("HEAD", "/d2s"), ("HEAD", "/other"), ("POST", "/d2s/_search")]
    # request_timeout is a client option, never a query parameter sent to the cluster
    assert "timeout" not in stand_in.seen[-1][1]
    assert json.loads(stand_in.seen[-1][2]) == {"query": {"match_all": {}}}


def test_bulk_writes_through_the_installed_helpers(stand_in):
    store = OpenSearchBackend(stand_in.url, index_name="d2s", retries=0, sleep=lambda s: None)
    try:
        docs = _docs(3)
        store.upsert(docs)
    finally:
        store.http.close()
    assert sorted(stand_in.stored) == sorted(d.id for d in docs)
    assert stand_in.stored[docs[1].id]["sparse"] == {"dog": 2.0, "car": 0.5}


def test_the_private_argument_resolver_is_not_used(stand_in, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(
            "Transport._resolve_request_args changes its signature between releases"
        )

    monkeypatch.setattr(Transport, "_resolve_request_args", refuse)
    http = OpenSearchHTTP(stand_in.url, retries=0)
    try:
        assert http.client.info()["version"]["number"] == "2.19.1"
    finally:
        http.close()


def _lowest_allowed() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (pin,) = re.findall(r'"opensearch-py>=([0-9.]+)[^"]*"', text)
    return pin


def test_ci_checks_the_lowest_allowed_release():
    """``.ci/run`` installs the lowest opensearch-py pyproject allows in a second environment,
    runs this file there, and still ends with the README's test command."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lowest = _lowest_allowed()
    assert f"opensearch-py=={lowest}" in ci
    assert '-e ".[opensearch]"' in ci  # the client is the `opensearch` extra, not in the plain install
    assert "tests/opensearch_client" in ci
    lines = [line for line in ci.splitlines() if line.strip()]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert lines[-1].strip() in readme
    assert lines[-1].strip().endswith("python -m pytest -q")
