"""`d2s-search query` asks a running `d2s-search serve` of the same index, and only that one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from d2s_search.serve import discovery
from tests.helpers import clean_env, interruptible, run_cli, run_cli_json
from tests.serve.test_serve_cli import RUN_CLI, _wait_for_address


@pytest.fixture
def running_serve(tmp_path, tiny_blip_bundle, serve_index, monkeypatch):
    """A real `d2s-search serve` subprocess; the test process shares its config/cache dir."""
    env = clean_env(tmp_path)
    monkeypatch.setenv("D2S_CONFIG_DIR", env["D2S_CONFIG_DIR"])
    args = ["serve", "--bundle", str(tiny_blip_bundle), "--index", str(serve_index), "--port", "0",
            "--thumbnail-dir", str(tmp_path / "thumbs")]
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, *args], stderr=subprocess.PIPE, text=True, env=env,
                            **interruptible())
    try:
        yield proc, _wait_for_address(proc, timeout=90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _query(capsys, index, *extra):
    code, out = run_cli_json(["query", "a dog on the grass", "--index", index, "-k", "5", "--explain", "3", *extra],
                             capsys)
    assert code == 0, out
    return out


def _same_hits(a: dict, b: dict) -> None:
    """The same hits in the same order. Scores agree to float32 rounding: the serve's text
    session pre-packs its weights, the one-shot CLI's does not (last-bit differences)."""
    assert [r["id"] for r in a["results"]] == [r["id"] for r in b["results"]] and a["results"]
    for x, y in zip(a["results"], b["results"]):
        assert (x["path"], x["url"], [m["term"] for m in x["matched"]]) == (y["path"], y["url"], [m["term"] for m in y["matched"]])
        assert x["score"] == pytest.approx(y["score"], rel=1e-5)
        assert [m["contribution"] for m in x["matched"]] == pytest.approx([m["contribution"] for m in y["matched"]], rel=1e-5)
        assert (x.get("parts") or {}) == pytest.approx(y.get("parts") or {}, rel=1e-5)
    assert [t["term"] for t in a["query_terms"]] == [t["term"] for t in b["query_terms"]]
    assert a["mode"] == b["mode"] and a.get("fusion") == b.get("fusion")


@pytest.mark.parametrize("mode", ["sparse", "hybrid"])
def test_query_is_answered_by_the_running_serve_with_the_local_results(running_serve, serve_index, capsys, mode):
    _, url = running_serve
    asked = _query(capsys, serve_index, "--mode", mode)
    local = _query(capsys, serve_index, "--mode", mode, "--no-serve")
    assert asked["answered_by"] == url and "answered_by" not in local
    _same_hits(asked, local)


def test_the_text_output_says_who_answered(running_serve, serve_index, capsys):
    _, url = running_serve
    code, out, err = run_cli(["query", "a dog", "--index", serve_index, "-k", "3"], capsys)
    assert code == 0 and f"answered by the running serve at {url}" in " ".join(out.split()) and not err
    code, out, err = run_cli(["query", "a dog", "--index", serve_index, "-k", "3", "--paths"], capsys)
    assert code == 0 and len(out.splitlines()) == 3 and all(os.path.isabs(p) for p in out.splitlines())
    assert err.strip() == f"answered by the running serve at {url}"  # stdout stays pipeable


def test_the_discovery_file_is_removed_when_serve_stops(running_serve, serve_index):
    proc, _ = running_serve
    path = discovery.discovery_path(serve_index)
    entry = json.loads(path.read_bytes())
    assert entry["pid"] == proc.pid and entry["host"] == "127.0.0.1" and (path.stat().st_mode & 0o777) == 0o600
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0
    assert not path.exists()


def _rewrite(path, **changes) -> None:
    entry = json.loads(path.read_bytes()) | changes
    path.write_text(json.dumps(entry))


def test_a_stale_or_foreign_discovery_file_falls_back_to_the_local_search(running_serve, serve_index, capsys):
    proc, _ = running_serve
    path = discovery.discovery_path(serve_index)
    saved = path.read_bytes()
    local = _query(capsys, serve_index, "--no-serve")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cases = {
        # the live serve's port, but not its token: something else could be listening there
        "wrong token": lambda: _rewrite(path, token="0" * 64),
        "dead pid": lambda: _rewrite(path, pid=dead.pid),
        "closed port": lambda: _rewrite(path, port=1),
        "another bundle": lambda: _rewrite(path, fingerprint="f" * 64),
        "not loopback": lambda: _rewrite(path, host="192.0.2.1"),
        "garbage": lambda: path.write_bytes(b"\xff\x00{not json"),
        "wrong types": lambda: _rewrite(path, port="8000", pid=[1]),
        "a directory": lambda: (path.unlink(), path.mkdir()),
    }
    for name, spoil in cases.items():
        spoil()
        code, out, err = run_cli(["query", "a dog on the grass", "--index", serve_index, "-k", "5", "--explain", "3",
                                  "--json"], capsys)
        assert code == 0 and not err, (name, err)
        answer = json.loads(out)
        assert "answered_by" not in answer, name
        _same_hits(answer, local)
        if path.is_dir():
            path.rmdir()
        path.write_bytes(saved)
        path.chmod(0o600)  # a recreated file gets the umask's mode; the token is for this user only
    # the real file still works, and the serve removes only its own file on exit
    assert _query(capsys, serve_index)["answered_by"]
    _rewrite(path, token="1" * 64)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0
    assert path.is_file()  # another serve's (newer) file is left alone
    os.unlink(path)


def test_two_phase_on_the_local_index_says_it_misses(running_serve, serve_index, capsys):
    """Asked or not asked through the serve, two-phase on a local index carries the note."""
    for extra in ([], ["--no-serve"]):
        answer = _query(capsys, serve_index, "--mode", "two-phase", *extra)
        assert answer["mode"] == "two-phase" and "--mode sparse is exact" in answer["note"]
        assert ("answered_by" in answer) == (not extra)
        assert "note" not in _query(capsys, serve_index, "--mode", "sparse", *extra)
    code, out, err = run_cli(["query", "a dog", "--index", serve_index, "--mode", "two-phase", "--paths", "--no-serve"],
                             capsys)
    lines = out.splitlines()
    assert code == 0 and lines and all(os.path.isabs(line) for line in lines)  # stdout: only paths
    assert err.startswith("note: on the local index two-phase misses") and len(err.splitlines()) == 1


def test_a_query_answered_by_the_serve_says_which_words_the_model_does_not_know(running_serve, serve_index, capsys):
    """The note about unknown words is the same whoever searched: the serve's answer carries it."""
    _, url = running_serve
    words = "qwertyuiop zxcvbnmasdf"
    code, asked = run_cli_json(["query", words, "--index", serve_index, "-k", "3"], capsys)
    assert code == 0 and asked["answered_by"] == url
    code, local = run_cli_json(["query", words, "--index", serve_index, "-k", "3", "--no-serve"], capsys)
    assert code == 0 and "answered_by" not in local
    assert local["notice"] and local["unrecognised_words"]
    assert (asked["weak_query"], asked["unrecognised_words"], asked["notice"]) == (
        local["weak_query"], local["unrecognised_words"], local["notice"])


def test_an_edited_query_searches_in_its_own_process(running_serve, serve_index, capsys):
    """-word, +word and word^N are applied where the edits are shown: the query does not ask
    the serve (whose answer carries hits, not edits), and gets what --no-serve gets."""
    code, edited = run_cli_json(["query", "a dog^2 on the grass -grass", "--index", serve_index, "-k", "5"], capsys)
    assert code == 0 and "answered_by" not in edited
    assert edited["query_edits"] == {"required": [], "excluded": ["grass"], "weighted": [{"term": "dog", "factor": 2.0}]}
    code, local = run_cli_json(["query", "a dog^2 on the grass -grass", "--index", serve_index, "-k", "5",
                                "--no-serve"], capsys)
    assert code == 0
    _same_hits(edited, local)
    assert _query(capsys, serve_index)["answered_by"]  # the plain query still asks it
