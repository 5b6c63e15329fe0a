"""``query --image URL``: a real local HTTP server serves a picture, a 404, a text page, bodies
over the cap, a redirect and a slow answer; the picture searches exactly as its file does, and
every failure is one line, exit 1, before any index or model is opened."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from d2s_search import remote_image
from d2s_search.images import QUERY_MAX_BYTES
from tests.helpers import jpeg_bytes, run_cli, run_cli_json

PICTURE = jpeg_bytes(3, size=(120, 90))


class Pictures(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        if path == "/dog.jpg":
            self._send(200, "image/jpeg", PICTURE)
        elif path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/dog.jpg")
            self.end_headers()
        elif path == "/notes.txt":
            self._send(200, "text/html; charset=utf-8", b"<html><body>a login page</body></html>")
        elif path == "/fake.jpg":
            self._send(200, "image/jpeg", b"not really a picture")
        elif path == "/huge-declared.jpg":  # says so up front: refused before the body is read
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(QUERY_MAX_BYTES + 1))
            self.end_headers()
            self.wfile.write(PICTURE)
        elif path == "/huge-streamed.jpg":  # no length: cut while read
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.end_headers()
            block = b"\0" * (1 << 20)
            try:
                for _ in range(QUERY_MAX_BYTES // len(block) + 4):
                    self.wfile.write(block)
            except OSError:
                pass  # the client stopped reading at the cap
        elif path == "/slow.jpg":
            time.sleep(3)
            self._send(200, "image/jpeg", PICTURE)
        else:
            self._send(404, "text/plain", b"no such picture")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_picture_by_url_searches_as_its_file(tmp_path, capsys, server, tiny_blip_bundle, image_folder):
    index = str(tmp_path / "idx")
    assert run_cli(["ingest", str(image_folder), "--bundle", str(tiny_blip_bundle), "--index", index], capsys)[0] == 0
    local = tmp_path / "dog.jpg"
    local.write_bytes(PICTURE)
    for mode in ("sparse", "dense"):
        by_file = run_cli_json(["query", "--image", str(local), "--index", index, "--mode", mode, "--json"], capsys)
        by_url = run_cli_json(["query", "--image", f"{server}/dog.jpg", "--index", index, "--mode", mode, "--json"],
                              capsys)
        moved = run_cli_json(["query", "--image", f"{server}/moved", "--index", index, "--mode", mode, "--json"],
                             capsys)
        assert by_file[0] == by_url[0] == moved[0] == 0
        ids = [r["id"] for r in by_file[1]["results"]]
        assert len(ids) == 10
        assert [r["id"] for r in by_url[1]["results"]] == [r["id"] for r in moved[1]["results"]] == ids
        assert [r["score"] for r in by_url[1]["results"]] == [r["score"] for r in by_file[1]["results"]]


@pytest.mark.parametrize(("path", "reason"), [
    ("/missing.jpg", "the server answered 404 Not Found"),
    ("/notes.txt", "not a picture (content type text/html)"),
    ("/fake.jpg", "not an image in a format we read"),
    ("/huge-declared.jpg", "20 MiB, over the 20 MiB limit for a query picture"),
    ("/huge-streamed.jpg", "over the 20 MiB limit for a query picture"),
])
def test_a_failing_fetch_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, server, path, reason):
    monkeypatch.chdir(tmp_path)  # no index here: the picture is checked first
    code, out, err = run_cli(["query", "--image", f"{server}{path}"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot use {server}{path} as a query: ") and reason in err, err
    assert err.count("\n") == 1
    assert not Path(tmp_path / "d2s-index").exists()


def test_the_url_credentials_never_show(tmp_path, monkeypatch, capsys, server):
    monkeypatch.chdir(tmp_path)
    url = server.replace("http://", "http://photos:s3cret-pass@") + "/missing.jpg"
    code, _, err = run_cli(["query", "--image", url], capsys)
    assert code == 1 and "s3cret-pass" not in err and f"{server}/missing.jpg" in err


def test_a_slow_server_times_out(tmp_path, monkeypatch, capsys, server):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(remote_image, "TIMEOUT_SECONDS", 0.5)  # the fault: a server slower than the timeout
    started = time.monotonic()
    code, _, err = run_cli(["query", "--image", f"{server}/slow.jpg"], capsys)
    assert code == 1 and "no answer within 0.5 s" in err
    assert time.monotonic() - started < 2.5


def test_nothing_listens(tmp_path, monkeypatch, capsys):
    import socket

    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run_cli(["query", "--image", f"http://127.0.0.1:{port}/a.jpg"], capsys)
    assert code == 1 and err.count("\n") == 1 and "ConnectError" in err


def test_a_failing_fetch_with_json_is_the_error_object(tmp_path, monkeypatch, capsys, server):
    monkeypatch.chdir(tmp_path)
    code, out = run_cli_json(["query", "--image", f"{server}/notes.txt", "--json"], capsys)
    assert code == 1
    assert out == {"error": {"type": "QueryImageError", "message":
                             f"cannot use {server}/notes.txt as a query: not a picture (content type text/html)"}}
