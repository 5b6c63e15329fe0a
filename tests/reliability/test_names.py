"""File names that are not valid UTF-8: stored losslessly, shown escaped, never a crash.

Before: one name like ``bad\\xff\\xfename.jpg`` raised ``UnicodeEncodeError`` in both
backends, rolled its batch back, and every re-run died at the same point.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from d2s_search.pathtext import path_to_text, text_to_path
from tests.helpers import clean_env, run_cli, run_cli_json, write_image

BAD_NAME = b"bad\xff\xfename.jpg"
SHOWN = "bad\\xff\\xfename.jpg"


@pytest.fixture
def folder(tmp_path) -> Path:
    """Five good images, one of them under a name that is not UTF-8."""
    root = tmp_path / "photos"
    for i in range(4):
        write_image(root / f"good{i}.jpg", 300 + i)
    bad = os.fsencode(root) + b"/" + BAD_NAME
    write_image(Path(os.fsdecode(bad)), 399, fmt="JPEG")
    return root


def test_text_round_trips_any_name():
    names = [BAD_NAME, b"plain.jpg", b"\xc3\xbc.jpg", b"a\\b", b"a\\xff", b"a\\\xff", b"\\\\x41", b"x\\"]
    for raw in names:
        text = path_to_text(os.fsdecode(raw))
        text.encode("utf-8")  # storable in SQLite and JSON
        assert os.fsencode(text_to_path(text)) == raw
    assert path_to_text(os.fsdecode(BAD_NAME)) == SHOWN
    assert path_to_text("/photos/beach day/ü.jpg") == "/photos/beach day/ü.jpg"  # ordinary paths unchanged


def test_local_ingest_stores_the_whole_folder_and_shows_the_name_escaped(folder, tmp_path, tiny_blip_bundle):
    index = tmp_path / "idx"
    write_image(tmp_path / "before" / "kept.jpg", 398)
    env = clean_env(tmp_path)
    env["PYTHONIOENCODING"] = "utf-8:strict"  # a terminal that refuses surrogates, like most
    base = [sys.executable, "-m", "d2s_search.cli", "ingest", "--bundle", str(tiny_blip_bundle), "--index", str(index)]
    first = subprocess.run([*base, str(tmp_path / "before")], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    run = subprocess.run([*base, str(folder), "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    report = json.loads(run.stdout)
    assert report["stored"] == 5 and report["rejected"] == []
    with sqlite3.connect(index / "index.sqlite") as db:
        paths = [r[0] for r in db.execute("SELECT path FROM docs")]
    assert len(paths) == 6  # the earlier image is still there, plus the five distinct good ones
    bad = [p for p in paths if p.endswith(SHOWN)]
    assert len(bad) == 1
    assert Path(text_to_path(bad[0])).read_bytes()[:2] == b"\xff\xd8"  # names the real file
    again = subprocess.run([*base, str(folder), "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["already_stored"] == 5
    # Text output of a query shows the escaped name, on a strict UTF-8 stdout.
    query = subprocess.run([sys.executable, "-m", "d2s_search.cli", "query", "--image", os.fsdecode(os.fsencode(folder) + b"/" + BAD_NAME),
                            "--bundle", str(tiny_blip_bundle), "--index", str(index), "-k", "1", "--json"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout)["results"][0]["path"].endswith(SHOWN)


def test_rejected_names_are_escaped_in_text_and_json(tmp_path, tiny_blip_bundle, capsys):
    folder = tmp_path / "photos"
    write_image(folder / "good.jpg", 310)
    broken = Path(os.fsdecode(os.fsencode(folder) + b"/broken\xff.jpg"))
    broken.write_bytes(b"not a picture")
    args = ["ingest", folder, "--bundle", tiny_blip_bundle, "--index", tmp_path / "idx"]
    code, report = run_cli_json(args, capsys)
    assert code == 3 and report["stored"] == 1
    assert [r["path"].rsplit("/", 1)[1] for r in report["rejected"]] == ["broken\\xff.jpg"]
    code, out, err = run_cli(args, capsys)
    assert code == 3 and "rejected " in err and "broken\\xff.jpg: not an image" in err


def test_opensearch_ingest_stores_the_whole_folder(folder, tmp_path, tiny_blip_bundle, osmem_url, capsys):
    write_image(tmp_path / "before" / "kept.jpg", 398)
    common = ["--bundle", tiny_blip_bundle, "--backend", "opensearch", "--url", osmem_url, "--index-name", "names"]
    assert run_cli_json(["ingest", tmp_path / "before", *common], capsys)[0] == 0
    code, report = run_cli_json(["ingest", folder, *common], capsys)
    assert code == 0 and report["stored"] == 5, report
    from d2s_search.backends.opensearch.backend import OpenSearchBackend

    store = OpenSearchBackend(osmem_url, index_name="names")
    try:
        store.open(None, create=False)
        assert store.stats()["documents"] == 6
        hits = httpx.post(f"{osmem_url}/names/_search", json={"size": 10, "_source": ["path"]}).json()["hits"]["hits"]
        paths = [h["_source"]["path"] for h in hits]
    finally:
        store.close()
    assert sum(p.endswith(SHOWN) for p in paths) == 1


def test_serve_shows_and_thumbnails_a_non_utf8_name(folder, tmp_path, tiny_blip_bundle):
    from fastapi.testclient import TestClient

    from tests.serve.conftest import make_app, make_index

    index = make_index(tmp_path / "idx", tiny_blip_bundle, folder)
    with TestClient(make_app(tiny_blip_bundle, index, tmp_path / "thumbs")) as client:
        hits = client.get("/api/search", params={"q": "a photo", "k": 10}).json()["results"]
        assert len(hits) == 5
        (bad,) = [h for h in hits if h["path"].endswith(SHOWN)]
        detail = client.get(f"/api/documents/{bad['id']}").json()
        assert detail["path"].endswith(SHOWN)
        thumb = client.get(f"/api/documents/{bad['id']}/thumbnail")
        assert thumb.status_code == 200 and thumb.content[:2] == b"\xff\xd8"


def test_serve_images_serves_the_url_ingest_stored(folder, tmp_path):
    from d2s_search.serve.image_server import ImageServer
    from d2s_search.serve.image_urls import url_builder

    server = ImageServer(folder, port=0)
    server.start_background()
    try:
        url = url_builder(server.url, [folder])(Path(os.fsdecode(os.fsencode(folder) + b"/" + BAD_NAME)))
        assert url.endswith("/bad%FF%FEname.jpg")
        answer = httpx.get(url)
        assert answer.status_code == 200 and answer.content[:2] == b"\xff\xd8"
    finally:
        server.shutdown()
        server.server_close()


# -- names with characters a terminal acts on -------------------------------------------------

RETITLE = "a\033]0;PWNED\007.jpg"  # ESC ] 0 ; ... BEL: sets the terminal's title
TWO_LINES = "two\nlines.jpg"
CLEARS = "broken\033[2J.jpg"  # ESC [ 2 J: clears the screen
RAW_CONTROLS = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")  # a newline ends a line


def run_bytes(args: list, capsysbinary) -> tuple[int, bytes, bytes]:
    """The CLI in-process; (exit code, stdout bytes, stderr bytes)."""
    from d2s_search.cli import main

    capsysbinary.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsysbinary.readouterr()
    return code, out, err


@pytest.fixture
def hostile_folder(tmp_path) -> Path:
    folder = tmp_path / "photos"
    for seed, name in enumerate((RETITLE, TWO_LINES, "plain.jpg")):
        write_image(folder / name, 320 + seed)
    (folder / CLEARS).write_text("not a picture")
    return folder


def test_control_characters_in_names_never_reach_the_terminal(hostile_folder, tmp_path, tiny_blip_bundle,
                                                              capsysbinary):
    index = tmp_path / "idx\033[31m"  # the index's own folder too
    common = ["--bundle", tiny_blip_bundle, "--index", index]
    code, out, err = run_bytes(["ingest", hostile_folder, *common], capsysbinary)
    assert code == 3 and not RAW_CONTROLS.search(out + err), err
    assert b"rejected " + os.fsencode(hostile_folder) + b"/broken\\x1b[2J.jpg: not an image" in err
    query = ["query", "a photo", "--mode", "dense", "-k", "10", "--no-serve", *common]

    code, out, err = run_bytes(query, capsysbinary)
    assert code == 0 and not RAW_CONTROLS.search(out + err)
    assert b"a\\x1b]0;PWNED\\x07.jpg" in out and b"two\\x0alines.jpg" in out

    code, out, err = run_bytes([*query, "--paths"], capsysbinary)
    lines = out.decode().splitlines()
    assert code == 0 and len(lines) == 3 and not RAW_CONTROLS.search(out + err)  # a newline splits no line
    assert {Path(text_to_path(line)) for line in lines} == {hostile_folder / n for n in (RETITLE, TWO_LINES, "plain.jpg")}

    code, out, err = run_bytes([*query, "-0"], capsysbinary)
    assert code == 0 and out.endswith(b"\0")
    assert set(out[:-1].split(b"\0")) == {os.fsencode(hostile_folder / n) for n in (RETITLE, TWO_LINES, "plain.jpg")}

    code, out, err = run_bytes([*query, "--json"], capsysbinary)
    assert code == 0 and not RAW_CONTROLS.search(out)  # JSON escapes them itself
    assert {r["path"] for r in json.loads(out)["results"]} == {str(hostile_folder / n)
                                                              for n in (RETITLE, TWO_LINES, "plain.jpg")}

    (hostile_folder / RETITLE).unlink()
    code, out, err = run_bytes(["index", "prune", "--dry-run", "--index", index], capsysbinary)
    assert code == 0 and not RAW_CONTROLS.search(out + err)
    assert out.decode().splitlines()[0] == f"gone: {hostile_folder}/a\\x1b]0;PWNED\\x07.jpg"
    code, out, err = run_bytes(["index", "stats", "--index", index], capsysbinary)
    assert code == 0 and not RAW_CONTROLS.search(out + err) and b"idx\\x1b[31m" in out

    # An error naming such a file is one line, escaped (and maps back to the name).
    code, out, err = run_bytes(["query", "--image", hostile_folder / CLEARS, *common], capsysbinary)
    assert code == 1 and not RAW_CONTROLS.search(err) and len(err.decode().strip().splitlines()) == 1
    assert b"cannot use " + os.fsencode(hostile_folder) + b"/broken\\x1b[2J.jpg as a query" in err


def test_serve_images_names_a_hostile_folder_escaped(tmp_path):
    folder = tmp_path / "pics\033]0;PWNED\007"
    write_image(folder / "a.jpg", 330)
    env = clean_env(tmp_path)
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "d2s_search.cli", "serve-images", str(folder), "--port", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert first.startswith(b"serving the pictures under ") and not RAW_CONTROLS.search(first)
    assert b"pics\\x1b]0;PWNED\\x07" in first
