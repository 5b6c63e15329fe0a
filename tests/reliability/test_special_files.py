"""Only regular files are opened: a FIFO, socket or folder named like a picture is reported
with its reason and never hangs anything (ingest, query --image, thumbnails, serve-images).

Before: a FIFO named ``.jpg`` hung ingest forever, and an indexed file replaced by a FIFO
hung the web server once its thread pool was used up by blocked thumbnail requests.
Every blocking step runs under a deadline here, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from d2s_search.errors import ImageRejected
from d2s_search.images import NEEDS_AVIF, NEEDS_HEIF, avif_available, heif_available, read_bytes
from tests.helpers import clean_env, write_image

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


def within(seconds: float, fn, *args):
    """fn(*args) on a thread; fails the test (instead of hanging it) after ``seconds``."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} blocked for over {seconds}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def cli(args: list, tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "d2s_search.cli", *map(str, args)], env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)


def stored_names(index: Path) -> list[str]:
    with sqlite3.connect(index / "index.sqlite") as db:
        return sorted(Path(r[0]).name for r in db.execute("SELECT path FROM docs"))


def test_read_bytes_refuses_special_files_at_once(tmp_path):
    os.mkfifo(tmp_path / "pipe.jpg")
    with pytest.raises(ImageRejected, match="not a regular file: a named pipe"):
        within(10, read_bytes, tmp_path / "pipe.jpg")
    (tmp_path / "folder.jpg").mkdir()
    with pytest.raises(ImageRejected, match="not a regular file: a folder"):
        within(10, read_bytes, tmp_path / "folder.jpg")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock.jpg"))
        with pytest.raises(ImageRejected, match="not a regular file: a socket"):
            within(10, read_bytes, tmp_path / "sock.jpg")
    finally:
        sock.close()
    with pytest.raises(ImageRejected, match="not a regular file: a character device"):
        within(10, read_bytes, Path("/dev/zero"))


def test_ingest_reports_fifos_and_unsupported_formats_and_stores_the_rest(tmp_path, tiny_blip_bundle):
    index = tmp_path / "idx"
    write_image(tmp_path / "before" / "kept.jpg", 500)
    assert cli(["ingest", tmp_path / "before", "--bundle", tiny_blip_bundle, "--index", index], tmp_path).returncode == 0
    folder = tmp_path / "photos"
    for i in range(3):
        write_image(folder / f"good{i}.jpg", 501 + i)
    write_image(folder / "copy.jpg", 501)  # same bytes as good0: one document
    os.mkfifo(folder / "pipe.jpg")
    os.symlink(folder / "pipe.jpg", folder / "link-to-pipe.png")
    (folder / "phone.heic").write_bytes(b"\x00\x00\x00\x18ftypheic")
    (folder / "new.avif").write_bytes(b"\x00\x00\x00\x1cftypavif")
    (folder / "web.JXL").write_bytes(b"\xff\x0a")
    (folder / "notes.txt").write_text("not a picture and not reported")
    direct_fifo = tmp_path / "direct.jpg"
    os.mkfifo(direct_fifo)
    run = cli(["ingest", folder, direct_fifo, tmp_path / "before" / "kept.jpg", folder / "phone.heic", "--bundle", tiny_blip_bundle, "--index", index, "--json"], tmp_path, timeout=120)
    assert run.returncode == 3, run.stderr  # partial: some files skipped, the rest stored
    report = json.loads(run.stdout)
    reasons = {Path(r["path"]).name: r["reason"] for r in report["rejected"]}
    assert reasons == {
        "pipe.jpg": "not a regular file: a named pipe (FIFO)",
        "link-to-pipe.png": "not a regular file: a named pipe (FIFO)",
        "direct.jpg": "not a regular file: a named pipe (FIFO)",
        # headers only: read as pictures where the decoders are installed, else refused naming the fix
        "phone.heic": "corrupt or truncated image: not a readable HEIF picture" if heif_available()
        else f"format not supported (heic): {NEEDS_HEIF}",
        "new.avif": "corrupt or truncated image: not a readable AVIF picture" if avif_available()
        else f"format not supported (avif): {NEEDS_AVIF}",
        "web.JXL": "format not supported (jxl)",
    }
    # phone.heic given directly is reported once more when refused by its name, once when decoded
    assert len(report["rejected"]) == (6 if heif_available() else 7)
    assert report["stored"] == 3 and report["duplicates"] == 1 and report["already_stored"] == 1
    assert len(stored_names(index)) == 4  # the earlier image plus the three distinct good ones
    text = cli(["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index], tmp_path, timeout=120)
    assert text.returncode == 3 and "Traceback" not in text.stderr
    lines = [line for line in text.stderr.splitlines() if line.startswith("rejected ")]
    assert len(lines) == 5 and any(line.endswith("pipe.jpg: not a regular file: a named pipe (FIFO)") for line in lines)


def test_query_by_a_fifo_is_one_line_error(tmp_path, tiny_blip_bundle):
    index = tmp_path / "idx"
    write_image(tmp_path / "photos" / "a.jpg", 510)
    assert cli(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], tmp_path).returncode == 0
    os.mkfifo(tmp_path / "query.jpg")
    run = cli(["query", "--image", tmp_path / "query.jpg", "--bundle", tiny_blip_bundle, "--index", index], tmp_path, timeout=120)
    assert run.returncode == 1  # a query picture that cannot be read fails, like a missing one
    assert run.stderr.strip().splitlines() == [f"error: cannot use {tmp_path / 'query.jpg'} as a query: "
                                               "not a regular file: a named pipe (FIFO)"]


def test_serve_survives_an_indexed_file_replaced_by_a_fifo(tmp_path, tiny_blip_bundle):
    from tests.serve.conftest import make_app, make_index
    from tests.serve.live import start_server

    folder = tmp_path / "photos"
    for i in range(3):
        write_image(folder / f"p{i}.jpg", 520 + i)
    index = make_index(tmp_path / "idx", tiny_blip_bundle, folder)
    live = start_server(make_app(tiny_blip_bundle, index, tmp_path / "thumbs"))
    try:
        with httpx.Client(base_url=live.url, timeout=20) as client:
            hits = client.get("/api/search", params={"q": "a photo", "k": 3}).json()["results"]
            victim = next(h for h in hits if h["path"].endswith("p0.jpg"))
            os.unlink(folder / "p0.jpg")
            os.mkfifo(folder / "p0.jpg")

            def hammer() -> list[int]:
                # More requests than the server's thread pool (40): each used to block one thread forever.
                return [client.get(f"/api/documents/{victim['id']}/{kind}").status_code
                        for _ in range(30) for kind in ("thumbnail", "preview")]

            statuses = within(120, hammer)
            assert set(statuses) == {404}
            answer = client.get(f"/api/documents/{victim['id']}/thumbnail").json()
            assert "not a regular file" in answer["detail"]
            assert len(client.get("/api/search", params={"q": "a photo", "k": 3}).json()["results"]) == 3
            other = next(h for h in hits if not h["path"].endswith("p0.jpg"))
            assert client.get(f"/api/documents/{other['id']}/thumbnail").status_code == 200
    finally:
        live.stop()


def test_serve_images_refuses_a_fifo_at_once(tmp_path):
    from d2s_search.serve.image_server import ImageServer

    write_image(tmp_path / "a.jpg", 530)
    os.mkfifo(tmp_path / "pipe.jpg")
    server = ImageServer(tmp_path, port=0)
    server.start_background()
    try:
        statuses = within(60, lambda: [httpx.get(f"{server.url}pipe.jpg", timeout=10).status_code for _ in range(60)])
        assert set(statuses) == {404}
        assert httpx.get(f"{server.url}a.jpg").status_code == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_fifo_swapped_in_after_the_check_is_refused_at_once(tmp_path, monkeypatch):
    """The race: the path was a regular file when stat'ed, a FIFO when opened. A real file
    system cannot show this on cue, so the first check is made to pass (fault injection)."""
    from d2s_search import regular_files

    os.mkfifo(tmp_path / "swapped.jpg")
    real_check = regular_files.check_regular
    calls = []

    def first_check_passes(st):
        calls.append(st)
        if len(calls) > 1:  # the fstat of the opened descriptor
            real_check(st)

    monkeypatch.setattr(regular_files, "check_regular", first_check_passes)
    with pytest.raises(regular_files.NotRegularFile, match="named pipe"):
        within(10, regular_files.open_regular, tmp_path / "swapped.jpg")
    assert len(calls) == 2
