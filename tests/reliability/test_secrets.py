"""Secrets never reach output: URL credentials, and credentials a server reflects back.

The reflecting proxy is a real local HTTP server that copies every request header into its
error body (as misconfigured proxies and some WAF pages do), so the client sends real
``Authorization`` headers and gets them back.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from d2s_search.redact import scrub, strip_url_credentials
from tests.helpers import run_cli

PASSWORD = "hunter2-Pa55"
API_KEY = "c2VjcmV0LWFwaS1rZXktMTIzNDU2"
BASIC = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()


def _serve(handler) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def reflecting_handler(status: int, style: str):
    class Reflect(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            headers = "\n".join(f"{k}: {v}" for k, v in self.headers.items())
            if style == "json":
                body = json.dumps({"error": {"root_cause": [{"type": "proxy_error", "reason": f"bad request; got {headers}"}]},
                                   "status": status}).encode()
                kind = "application/json"
            else:
                body = f"<html><body><h1>{status} Bad request</h1><pre>{headers}</pre></body></html>".encode()
                kind = "text/html"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

        def log_message(self, *args) -> None:
            pass

    return Reflect


@pytest.fixture
def reflecting(request) -> Iterator[str]:
    status, style = request.param
    yield from _serve(reflecting_handler(status, style))


def assert_clean(text: str) -> None:
    for secret in (PASSWORD, API_KEY, BASIC):
        assert secret not in text, text


@pytest.mark.parametrize("reflecting", [(400, "json"), (400, "html"), (403, "json"), (404, "html")], indirect=True)
def test_reflected_basic_auth_is_scrubbed(reflecting, capsys):
    code, out, err = run_cli(["index", "stats", "--url", f"http://admin:{PASSWORD}@{reflecting}"], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert_clean(out + err)


@pytest.mark.parametrize("reflecting", [(400, "json"), (400, "html")], indirect=True)
def test_reflected_api_key_is_scrubbed(reflecting, capsys, monkeypatch):
    monkeypatch.setenv("D2S_OPENSEARCH_API_KEY", API_KEY)
    code, out, err = run_cli(["index", "stats", "--url", f"http://{reflecting}", "--json"], capsys)
    # with --json the error is one JSON object on stdout, scrubbed all the same
    assert code == 1 and err == "" and set(json.loads(out)["error"]) == {"type", "message"}
    assert "***" in json.loads(out)["error"]["message"]
    assert_clean(out + err)


@pytest.mark.parametrize("reflecting", [(200, "html")], indirect=True)
def test_html_200_is_a_clear_error_and_delete_does_not_claim_success(reflecting, capsys):
    url = f"http://admin:{PASSWORD}@{reflecting}"
    code, out, err = run_cli(["index", "delete", "--yes", "--url", url], capsys)
    assert code == 1 and "deleted" not in out
    assert "not JSON" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert_clean(out + err)
    code, out, err = run_cli(["index", "stats", "--url", url], capsys)
    assert code == 1 and "not JSON" in err and "AttributeError" not in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_index_delete_never_prints_url_credentials(osmem_url, capsys, monkeypatch):
    from d2s_search.backends.base import IndexIdentity
    from d2s_search.backends.opensearch.backend import OpenSearchBackend

    store = OpenSearchBackend(osmem_url, index_name="secret-test")
    store.open(IndexIdentity(fingerprint="f" * 32, dense_dim=8), create=True)
    store.close()
    url = osmem_url.replace("http://", f"http://admin:{PASSWORD}@")
    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))  # the prompt is asked only at a terminal
    code, out, err = run_cli(["index", "delete", "--url", url, "--index-name", "secret-test", "--json"], capsys)
    assert code == 0, err
    assert "delete the index at http://127.0.0.1" in err  # the prompt, without credentials
    assert json.loads(out)["deleted"].startswith("http://127.0.0.1") and json.loads(out)["indices"] == ["secret-test-000001"]
    assert_clean(out + err)
    code, out, err = run_cli(["index", "delete", "--yes", "--url", url, "--index-name", "secret-test"], capsys)
    assert code == 1 and "no index to delete at http://127.0.0.1" in err
    assert_clean(out + err)


def test_tls_hint_names_the_real_setting(tmp_path, capsys):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", "k.pem", "-out", "c.pem"], cwd=tmp_path, check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")

    class TLSServer(ThreadingHTTPServer):
        def get_request(self):
            sock, addr = super().get_request()
            return context.wrap_socket(sock, server_side=True), addr

    server = TLSServer(("127.0.0.1", 0), reflecting_handler(200, "json"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, _, err = run_cli(["index", "stats", "--url", f"https://admin:{PASSWORD}@127.0.0.1:{server.server_address[1]}"],
                               capsys)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1 and "D2S_OPENSEARCH_CA_FILE" in err and "--ca-file" not in err
    assert_clean(err)


def test_scrub_and_strip_cover_the_usual_shapes():
    assert strip_url_credentials(f"https://admin:{PASSWORD}@search.example:9200/d2s") == "https://search.example:9200/d2s"
    assert strip_url_credentials("http://[::1]:9200/") == "http://[::1]:9200/"
    for text in (f"Authorization: Basic {BASIC}", f'"authorization": "ApiKey {API_KEY}"', f"password={PASSWORD}&x=1",
                 f"api_key: {API_KEY}", f"see https://admin:{PASSWORD}@host/", f"token={API_KEY}"):
        assert_clean(scrub(text))
        assert "***" in scrub(text)
    for prose in ("no_shard_available: all shards failed", "Basic settings for a basic search", "bearer of news"):
        assert scrub(prose) == prose


class _IgnoresDeletes(BaseHTTPRequestHandler):
    """Acknowledges DELETE with 200 and deletes nothing (a caching or read-only proxy)."""

    def _json(self, status: int, body: dict | None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_HEAD(self) -> None:
        self._json(200, None)

    def do_GET(self) -> None:
        meta = {"fingerprint": "f" * 32, "dense_dim": 8, "model": "m", "d2s_mapping_version": 1}
        self._json(200, {"kept-000001": {"mappings": {"_meta": meta}}})

    def do_DELETE(self) -> None:
        self._json(200, {"acknowledged": True})

    def log_message(self, *args) -> None:
        pass


def test_delete_that_changes_nothing_is_not_reported_as_success(capsys):
    for address in _serve(_IgnoresDeletes):
        code, out, err = run_cli(["index", "delete", "--yes", "--url", f"http://admin:{PASSWORD}@{address}",
                                  "--index-name", "kept", "--json"], capsys)
        assert code == 1 and err == ""  # with --json the error is a JSON object on stdout
        assert json.loads(out)["error"]["message"] == f"nothing was deleted at http://{address}/kept: the index is still there"


def test_debug_traceback_is_scrubbed_like_messages(capsys):
    from d2s_search.cli import _print_traceback

    try:
        try:
            raise ValueError(f"proxy said: Authorization: Basic {BASIC}\x1b]0;owned\x07")
        except ValueError as cause:
            raise RuntimeError(f"bulk failed ({PASSWORD})") from cause
    except RuntimeError:
        _print_traceback()
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: proxy said: Authorization: ***" in err
    assert_clean(err)
    assert "\x1b" not in err and "\x07" not in err and "\\x1b]0;owned\\x07" in err
