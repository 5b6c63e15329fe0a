"""`d2s-search query` believes only an answer the running serve proves is its own: for this
request, this index and these hits. Forged servers, proxies, unsafe or copied discovery
files and slow answers all end in a search in the query's own process, silently."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from d2s_search.serve import discovery
from tests.helpers import run_cli
from tests.serve import test_query_asks_serve as asks_serve
from tests.serve.conftest import make_app, make_index
from tests.serve.test_query_asks_serve import _query, _rewrite, _same_hits

running_serve = asks_serve.running_serve  # the same live `d2s-search serve` fixture

EVIL = "/forged/EVIL.jpg"


def _fake_answer(path: str = EVIL) -> dict:
    """An /api/search answer of the right shape whose only hit is not in any index."""
    return {
        "query": {"kind": "text", "text": "a dog"},
        "mode": "sparse",
        "k": 5,
        "encode_ms": 0.1,
        "search_ms": 0.1,
        "fusion": None,
        "query_terms": [{"term": "dog", "weight": 1.0, "own": True}],
        "results": [
            {
                "rank": 1,
                "id": "e" * 64,
                "score": 99.0,
                "path": path,
                "name": os.path.basename(path),
                "url": None,
                "matched": [{"term": "dog", "contribution": 99.0}],
                "parts": None,
                "thumbnail": "/x",
                "preview": "/y",
            }
        ],
    }


def _index_id(index: Path) -> str:
    from d2s_search.backends.local import LocalBackend

    backend = LocalBackend(index)
    backend.open(None, create=False)
    try:
        return backend.generation()[0]
    finally:
        backend.close()


class Recorder(http.server.BaseHTTPRequestHandler):
    """Hands every GET to the server's ``respond`` and keeps the raw request head."""

    def do_GET(self) -> None:  # the name http.server calls
        self.server.seen.append(self.requestline + "\r\n" + str(self.headers))
        self.server.respond(self)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def http_server(respond: Callable[[Recorder], None]) -> Iterator[http.server.ThreadingHTTPServer]:
    """A real HTTP server on 127.0.0.1 (a port the OS picks) in a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.daemon_threads = True
    server.seen, server.respond = [], respond
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _send(handler: Recorder, body: bytes, headers: dict[str, str], status: int = 200) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _forward(handler: Recorder, port: int) -> tuple[int, list[tuple[str, str]], bytes]:
    """Pass the request on to the real serve unchanged; its status, headers and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", handler.path, headers=dict(handler.headers.items()))
        response = conn.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        conn.close()


# what the proxy's own server sends again (or must recompute) for a new body
SET_BY_THE_PROXY = {"content-length", "connection", "date", "server", "transfer-encoding"}


def _end_to_end(headers: list[tuple[str, str]]) -> dict[str, str]:
    return {name: value for name, value in headers if name.lower() not in SET_BY_THE_PROXY}


def _no_answer_from_elsewhere(capsys, index, local: dict, name: str = "") -> None:
    """The query ran here: the local hits, nothing forged, no claim of a serve (JSON and text)."""
    code, out, err = run_cli(
        ["query", "a dog on the grass", "--index", index, "-k", "5", "--explain", "3", "--json"],
        capsys,
    )
    assert code == 0 and not err, (name, err)
    answer = json.loads(out)
    assert "answered_by" not in answer, name
    _same_hits(answer, local)
    code, out, err = run_cli(["query", "a dog on the grass", "--index", index, "-k", "5"], capsys)
    assert code == 0 and "answered by" not in out + err and "EVIL" not in out, name


def test_a_server_answering_the_old_constant_confirmation_is_not_believed(
    running_serve, serve_index, capsys
):
    """The discovery file is right in every field and names the live serve's pid, but
    another program listens at its port: it answers every check a constant can answer."""
    path = discovery.discovery_path(serve_index)
    token = json.loads(path.read_bytes())["token"]
    local = _query(capsys, serve_index, "--no-serve")
    index_id = _index_id(serve_index)

    def impostor(handler: Recorder) -> None:
        body = json.dumps(_fake_answer()).encode()
        _send(
            handler,
            body,
            {
                "Content-Type": "application/json",
                "X-D2S-Serve-Token-Ok": "1",
                "X-D2S-Serve-Index": index_id,
                "X-D2S-Serve-Proof": "0" * 64,
            },
        )

    with http_server(impostor) as server:
        _rewrite(path, port=server.server_address[1])
        _no_answer_from_elsewhere(capsys, serve_index, local)
        assert server.seen, "the query never asked the impostor"
        # what the query sent could not help anyone answer the next time either
        assert not any(token in request for request in server.seen)


def test_a_proxy_can_neither_swap_the_hits_nor_replay_an_answer(running_serve, serve_index, capsys):
    _, url = running_serve
    serve_port = int(url.rsplit(":", 1)[1])
    path = discovery.discovery_path(serve_index)
    local = _query(capsys, serve_index, "--no-serve")
    recorded: list[tuple[int, list, bytes]] = []
    mode = {"now": "faithful"}

    def proxy(handler: Recorder) -> None:
        if mode["now"] == "replay":
            status, headers, body = recorded[0]
        else:
            status, headers, body = _forward(handler, serve_port)
            recorded.append((status, headers, body))
        if mode["now"] == "swap":
            answer = json.loads(body)
            answer["results"][0]["path"] = EVIL  # the serve's own proof headers are kept
            body = json.dumps(answer).encode()
        _send(handler, body, _end_to_end(headers), status)

    with http_server(proxy) as server:
        _rewrite(path, port=server.server_address[1])
        # passed on unchanged, the serve's answer stands: the proof is end to end
        assert (
            _query(capsys, serve_index)["answered_by"]
            == f"http://127.0.0.1:{server.server_address[1]}"
        )
        mode["now"] = "swap"
        _no_answer_from_elsewhere(capsys, serve_index, local, "swapped hits")
        mode["now"] = "replay"  # the first, genuine answer, given again to a new query
        _no_answer_from_elsewhere(capsys, serve_index, local, "replayed answer")
    _rewrite(path, port=serve_port)
    assert _query(capsys, serve_index)["answered_by"] == url


def test_discovery_files_others_could_write_or_read_are_refused(
    running_serve, serve_index, capsys, tmp_path
):
    path = discovery.discovery_path(serve_index)
    folder = path.parent
    saved = path.read_bytes()
    port = json.loads(saved)["port"]
    local = _query(capsys, serve_index, "--no-serve")
    assert _query(capsys, serve_index)["answered_by"]  # the real file, as the serve wrote it
    elsewhere = tmp_path / "elsewhere.json"

    def symlinked() -> None:
        elsewhere.write_bytes(saved)
        elsewhere.chmod(0o600)
        path.unlink()
        path.symlink_to(elsewhere)

    def entry_with(extra: str) -> bytes:
        return saved.rstrip()[:-1] + extra.encode() + b"}"

    cases = {
        "group-writable file": lambda: path.chmod(0o620),
        "other-writable file": lambda: path.chmod(0o602),
        "group-readable file (the token is a secret)": lambda: path.chmod(0o640),
        "group-writable folder": lambda: folder.chmod(0o770),
        "other-writable folder": lambda: folder.chmod(0o703),
        "a symlink to a private file": symlinked,
        "oversize (valid JSON padded past 4 KB)": lambda: path.write_bytes(saved + b" " * 5000),
        "a key given twice": lambda: path.write_bytes(entry_with(f', "port": {port}')),
        "an unexpected key": lambda: path.write_bytes(entry_with(', "note": "x"')),
        "a pid too large for the system": lambda: _rewrite(path, pid=2**70),
        "a port that is true": lambda: _rewrite(path, port=True),
    }
    for name, spoil in cases.items():
        spoil()
        try:
            _no_answer_from_elsewhere(capsys, serve_index, local, name)
        finally:
            folder.chmod(0o700)
            path.unlink()
            path.write_bytes(saved)
            path.chmod(0o600)
    assert _query(capsys, serve_index)["answered_by"]  # restored, it is believed again


@pytest.fixture(scope="module")
def other_index(tmp_path_factory, tiny_blip_bundle, image_folder) -> Path:
    """Another index filled with the same bundle (a few of the same photos): same
    fingerprint, its own random id, other hits."""
    pictures = sorted(image_folder.rglob("*.jpg"))[:6]
    return make_index(tmp_path_factory.mktemp("other") / "index", tiny_blip_bundle, pictures)


def test_a_serve_does_not_answer_for_an_index_it_does_not_serve(
    running_serve, serve_index, other_index, capsys
):
    """The serve's discovery file, copied under another index's name with that index's path:
    the index ids differ. Even when the copy also claims the other index's id, and a proxy
    relabels the serve's answers with it, the serve's proof names the index it really serves."""
    _, url = running_serve
    other_id = _index_id(other_index)

    def relabel(handler: Recorder) -> None:
        status, headers, body = _forward(handler, int(url.rsplit(":", 1)[1]))
        kept = [(name, value) for name, value in headers if name.lower() != "x-d2s-serve-index"]
        relabelled = _end_to_end(kept) | {discovery.INDEX_HEADER: other_id}
        _send(handler, body, relabelled, status)

    source = json.loads(discovery.discovery_path(serve_index).read_bytes())
    copy = discovery.discovery_path(other_index)
    local = _query(capsys, other_index, "--no-serve")
    assert [r["path"] for r in local["results"]] != [
        r["path"] for r in _query(capsys, serve_index)["results"]
    ]
    copy.write_text(json.dumps(source | {"index": discovery.index_key(other_index)}))
    copy.chmod(0o600)
    try:
        _no_answer_from_elsewhere(capsys, other_index, local, "the serve's own index id")
        _rewrite(copy, index_id=other_id)
        _no_answer_from_elsewhere(capsys, other_index, local, "the other index's id claimed")
        with http_server(relabel) as proxy:
            _rewrite(copy, port=proxy.server_address[1])
            _no_answer_from_elsewhere(capsys, other_index, local, "relabelled by a proxy")
            assert proxy.seen, "the query never asked the proxy"
    finally:
        copy.unlink()
    assert _query(capsys, serve_index)["answered_by"]


def test_a_slow_answer_is_given_up_and_the_query_runs_here(
    running_serve, serve_index, capsys, monkeypatch
):
    """Headers that pass every check, then a body trickled out: the query hangs up at its
    deadline instead of waiting for the last byte."""
    path = discovery.discovery_path(serve_index)
    local = _query(capsys, serve_index, "--no-serve")
    index_id = _index_id(serve_index)
    finished: list[bool] = []

    def trickle(handler: Recorder) -> None:
        body = json.dumps(_fake_answer()).encode()
        chunks = [
            body[i : i + len(body) // 30 + 1] for i in range(0, len(body), len(body) // 30 + 1)
        ]
        handler.send_response(200)
        for name, value in {
            "Content-Type": "application/json",
            "X-D2S-Serve-Token-Ok": "1",
            "X-D2S-Serve-Index": index_id,
            "X-D2S-Serve-Proof": "0" * 64,
            "Content-Length": str(len(body)),
        }.items():
            handler.send_header(name, value)
        handler.end_headers()
        try:
            for chunk in chunks:  # 30 pieces 0.1 s apart: 3 s in all, never 0.5 s without a byte
                handler.wfile.write(chunk)
                handler.wfile.flush()
                time.sleep(0.1)
        except OSError:
            finished.append(False)  # the query hung up
            return
        finished.append(True)

    monkeypatch.setattr(discovery, "TIMEOUT_S", 0.5)
    with http_server(trickle) as server:
        _rewrite(path, port=server.server_address[1])
        code, out, err = run_cli(
            [
                "query",
                "a dog on the grass",
                "--index",
                serve_index,
                "-k",
                "5",
                "--explain",
                "3",
                "--json",
            ],
            capsys,
        )
        assert code == 0 and not err, err
        answer = json.loads(out)
        assert "answered_by" not in answer
        _same_hits(answer, local)
        deadline = time.monotonic() + 30
        while not finished and time.monotonic() < deadline:
            time.sleep(0.05)
    assert finished == [False]


@pytest.fixture(scope="module")
def announced_client(tiny_blip_bundle, serve_index, thumbnail_dir):
    """The app as `d2s-search serve` runs it on a local index: with a token and the index id."""
    from fastapi.testclient import TestClient

    app = make_app(tiny_blip_bundle, serve_index, thumbnail_dir, allowed_hosts=["localhost"])
    app.state.serve_token, app.state.serve_index_id = "ab" * 32, _index_id(serve_index)
    with TestClient(app, base_url="http://localhost") as client:
        yield client, app.state.serve_token, app.state.serve_index_id


def test_the_serve_proves_its_answer_for_the_nonce_index_words_and_hits(announced_client):
    client, token, index_id = announced_client
    target = "/api/search?q=a+dog&k=3&explain=2"
    nonce = discovery.new_nonce()
    response = client.get(target, headers={discovery.CHALLENGE_HEADER: nonce})
    assert response.status_code == 200 and response.json()["results"]
    assert response.headers[discovery.INDEX_HEADER] == index_id
    proof = response.headers[discovery.PROOF_HEADER]
    body = response.content

    def made(**change) -> str:
        parts = {
            "token": token,
            "nonce": nonce,
            "index_id": index_id,
            "target": target.encode(),
            "body": body,
        } | change
        return discovery.answer_proof(**parts)

    assert proof == made()
    assert token not in response.text and token not in str(response.headers)
    for change in (
        {"nonce": discovery.new_nonce()},
        {"index_id": "0" * 32},
        {"target": b"/api/search?q=a+cat&k=3&explain=2"},
        {"body": body.replace(b'"rank":1', b'"rank":2')},
        {"token": "cd" * 32},
    ):
        assert made(**change) != proof, change
    # The search page asks without a nonce: a plain answer. A nonce that is not one: no proof.
    for headers in (
        {},
        {discovery.CHALLENGE_HEADER: "not hex at all"},
        {discovery.CHALLENGE_HEADER: "ab"},
    ):
        plain = client.get(target, headers=headers)
        assert plain.status_code == 200 and discovery.PROOF_HEADER not in plain.headers, headers


def test_the_serve_keeps_its_discovery_folder_private(tmp_path, monkeypatch):
    """A folder made group-writable (a umask of 002, a careless chmod) is taken back to 0700
    when a serve announces itself, so readers, who refuse such a folder, can trust it again;
    a folder that is a symlink is not written into."""
    monkeypatch.setenv("D2S_CONFIG_DIR", str(tmp_path / "config"))
    index = tmp_path / "index"
    folder = discovery.discovery_path(index).parent
    folder.mkdir(parents=True)
    folder.chmod(0o775)
    written = discovery.announce(index, "127.0.0.1", 8123, "ab" * 16, "cd" * 16, "ef" * 32)
    assert written is not None and written.parent == folder
    assert folder.stat().st_mode & 0o777 == 0o700 and written.stat().st_mode & 0o777 == 0o600
    assert discovery.find(index, "ab" * 16, "cd" * 16)["port"] == 8123  # this process is alive
    assert discovery.find(index, "ab" * 16, "00" * 16) is None  # another index's id
    written.unlink()
    folder.rmdir()
    real = tmp_path / "somewhere"
    real.mkdir(mode=0o700)
    folder.symlink_to(real)
    assert discovery.announce(index, "127.0.0.1", 8123, "ab" * 16, "cd" * 16, "ef" * 32) is None
    assert list(real.iterdir()) == []
