"""A newcomer's first hour: the index remembers its bundle, files move, exit
codes and JSON errors are as documented, paths print whole, every option explains itself."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import httpx

from d2s_search import settings
from d2s_search.backends.local import LocalBackend
from tests.helpers import clean_env, interruptible, run_cli, run_cli_json, write_image

ROOT = Path(__file__).resolve().parents[1]
RUN_CLI = "import sys; from d2s_search.cli import main; main(sys.argv[1:])"


def make_photos(folder: Path, seeds, prefix: str = "photo") -> list[Path]:
    return [write_image(folder / f"{prefix}{seed:03d}.jpg", seed=seed) for seed in seeds]


def stored(index: Path) -> dict[str, str]:
    """id -> the path a hit shows (copies aside), read straight from the index."""
    backend = LocalBackend(index)
    backend.open(None, create=False)
    try:
        shown: dict[str, str] = {}
        for doc_id, path in backend.document_paths():
            shown.setdefault(doc_id, path)
        return shown
    finally:
        backend.close()


def json_error(out: str) -> dict:
    payload = json.loads(out)
    assert set(payload) == {"error"} and set(payload["error"]) == {"type", "message"}, payload
    return payload["error"]


# --- the index remembers the bundle that filled it ----------------------------------------

def test_a_second_export_does_not_break_the_index(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"
    make_photos(tmp_path / "photos", range(6))
    code, report = run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and report["stored"] == 6
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert stats["bundle_path"] == str(tiny_blip_bundle.resolve())
    code, before = run_cli_json(["query", "a dog", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and before["results"]

    # A second export (another model) becomes the last bundle ...
    code, _, err = run_cli(["export-onnx", "--model", "tiny-clip", "--out", tmp_path / "second"], capsys)
    assert code == 0, err
    assert settings.last_bundle() == (tmp_path / "second").resolve()
    # ... but a plain query still uses the bundle that filled the index, with the same answer.
    code, after = run_cli_json(["query", "a dog", "--index", index], capsys)
    assert code == 0
    assert [h["id"] for h in after["results"]] == [h["id"] for h in before["results"]]
    # Ingesting more without --bundle goes on with that bundle too.
    make_photos(tmp_path / "more", range(100, 103))
    code, more = run_cli_json(["ingest", tmp_path / "more", "--index", index], capsys)
    assert code == 0 and more["stored"] == 3
    # Only an explicitly given other bundle is refused, naming the recorded one's path.
    code, _, err = run_cli(["query", "a dog", "--index", index, "--bundle", tmp_path / "second"], capsys)
    assert code == 1 and str(tiny_blip_bundle.resolve()) in err and len(err.strip().splitlines()) == 1
    assert len(stored(index)) == 9


def test_a_moved_bundle_is_followed_and_a_lost_one_named(tmp_path, tiny_blip_bundle, tiny_clip_bundle, capsys):
    copy = tmp_path / "bundle-copy"
    shutil.copytree(tiny_blip_bundle, copy)
    index = tmp_path / "idx"
    make_photos(tmp_path / "photos", range(4))
    code, _ = run_cli_json(["ingest", tmp_path / "photos", "--bundle", copy, "--index", index], capsys)
    assert code == 0
    shutil.rmtree(copy)
    # The recorded copy is gone; the bundle exported last has the same fingerprint: fine.
    settings.remember_bundle(tiny_blip_bundle)
    code, result = run_cli_json(["query", "a dog", "--index", index], capsys)
    assert code == 0 and result["results"]
    # An ingest with it records its new place.
    make_photos(tmp_path / "more", [50])
    code, _ = run_cli_json(["ingest", tmp_path / "more", "--index", index], capsys)
    assert code == 0
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert stats["bundle_path"] == str(tiny_blip_bundle.resolve())
    # Recorded bundle gone and the last export is another model: the error names both.
    shutil.copytree(tiny_blip_bundle, copy)
    run_cli_json(["ingest", tmp_path / "more", "--bundle", copy, "--index", index], capsys)
    shutil.rmtree(copy)
    settings.remember_bundle(tiny_clip_bundle)
    code, out, err = run_cli(["query", "a dog", "--index", index, "--json"], capsys)
    error = json_error(out)
    assert code == 1 and error["type"] == "BundleMismatchError" and err == ""
    assert str(copy.resolve()) in error["message"] and "gone" in error["message"]
    assert str(tiny_clip_bundle.resolve()) in error["message"]


def test_no_index_here_names_the_one_used_last(tmp_path, tiny_blip_bundle, monkeypatch, capsys):
    first = tmp_path / "project"
    make_photos(first / "photos", range(3))
    monkeypatch.chdir(first)
    code, _ = run_cli_json(["ingest", "photos", "--bundle", tiny_blip_bundle], capsys)
    assert code == 0 and (first / "d2s-index" / "index.sqlite").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = run_cli(["query", "a dog"], capsys)
    assert code == 1
    assert f"no index at {elsewhere / 'd2s-index'}" in err
    assert f"the index used last is {(first / 'd2s-index').resolve()}" in err
    assert not (elsewhere / "d2s-index").exists()  # a query never creates one
    code, result = run_cli_json(["query", "a dog", "--index", first / "d2s-index"], capsys)
    assert code == 0 and result["results"]


def test_opensearch_index_records_the_bundle_path_in_meta(osmem_url, tiny_blip_bundle, tiny_clip_bundle, tmp_path,
                                                          capsys):
    make_photos(tmp_path / "photos", range(4))
    where = ["--url", osmem_url, "--index-name", "newcomer"]
    code, report = run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, *where], capsys)
    assert code == 0 and report["stored"] == 4
    mapping = httpx.get(f"{osmem_url}/newcomer/_mapping", timeout=10).json()
    (meta,) = [m["mappings"]["_meta"] for m in mapping.values()]
    assert meta["bundle_path"] == str(tiny_blip_bundle.resolve())
    settings.remember_bundle(tiny_clip_bundle)  # exported later: not the index's bundle
    code, result = run_cli_json(["query", "a dog", *where], capsys)
    assert code == 0 and result["results"]
    code, out, _ = run_cli(["query", "a dog", *where, "--bundle", tiny_clip_bundle, "--json"], capsys)
    assert code == 1 and str(tiny_blip_bundle.resolve()) in json_error(out)["message"]
    # The same bundle from another place: an ingest records where it is now.
    copy = tmp_path / "bundle-copy"
    shutil.copytree(tiny_blip_bundle, copy)
    code, report = run_cli_json(["ingest", tmp_path / "photos", "--bundle", copy, *where], capsys)
    assert code == 0 and report["already_stored"] == 4
    mapping = httpx.get(f"{osmem_url}/newcomer/_mapping", timeout=10).json()
    (meta,) = [m["mappings"]["_meta"] for m in mapping.values()]
    assert meta["bundle_path"] == str(copy.resolve()) and meta["fingerprint"]


# --- files move, files go ---------------------------------------------------------------

def test_moved_and_deleted_files(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"
    photos = make_photos(tmp_path / "old", range(5))
    code, _ = run_cli_json(["ingest", tmp_path / "old", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0
    ids = {path: doc_id for doc_id, path in stored(index).items()}
    # A renamed picture: same bytes at a new place, the old file gone.
    moved_to = tmp_path / "new" / "renamed.jpg"
    moved_to.parent.mkdir()
    photos[0].rename(moved_to)
    # A copy: the original is still there, so its document keeps the original path.
    shutil.copy(photos[1], tmp_path / "new" / "copy.jpg")
    code, report = run_cli_json(["ingest", tmp_path / "new", "--index", index], capsys)
    assert code == 0
    assert report["stored"] == 0 and report["already_stored"] == 2 and report["moved"] == 1
    paths = stored(index)
    assert paths[ids[str(photos[0])]] == str(moved_to)
    assert paths[ids[str(photos[1])]] == str(photos[1])
    code, out, _ = run_cli(["ingest", tmp_path / "new", "--index", index], capsys)
    assert code == 0 and "1 moved" not in out  # nothing moves twice

    # Two files deleted: stats counts them, a dry run lists them, prune removes them.
    photos[2].unlink()
    photos[3].unlink()
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert stats["documents"] == 5 and stats["missing_files"] == 2
    code, dry = run_cli_json(["index", "prune", "--dry-run", "--index", index], capsys)
    assert code == 0 and sorted(dry["missing"]) == sorted([str(photos[2]), str(photos[3])]) and dry["removed"] == 0
    assert len(stored(index)) == 5
    assert "search_structures_seconds" not in dry  # nothing removed, nothing rebuilt
    code, out, _ = run_cli(["index", "prune", "--index", index], capsys)
    assert code == 0 and "removed 2 of 5" in out
    from d2s_search.backends.local import cache as cache_mod

    assert cache_mod.load(index / "cache").size == 3  # rebuilt and saved by prune, not by the next query
    assert sorted(stored(index).values()) == sorted([str(moved_to), str(photos[1]), str(photos[4])])
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert stats["documents"] == 3 and stats["missing_files"] == 0
    # Searches see the pruned index at once (the search cache is rebuilt).
    code, out, _ = run_cli(["query", "a dog", "--mode", "dense", "-k", "10", "--paths", "--index", index], capsys)
    assert code == 0 and sorted(out.splitlines()) == sorted(stored(index).values())


def test_prune_refuses_to_empty_an_index_whose_files_all_vanished(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"
    make_photos(tmp_path / "drive", range(3))
    run_cli_json(["ingest", tmp_path / "drive", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    (tmp_path / "drive").rename(tmp_path / "unmounted")
    code, out, _ = run_cli(["index", "prune", "--index", index, "--json"], capsys)
    assert code == 1 and "every one of the 3 stored files is gone" in json_error(out)["message"]
    assert len(stored(index)) == 3
    code, result = run_cli_json(["index", "prune", "--index", index, "--yes"], capsys)
    assert code == 0 and result["removed"] == 3 and stored(index) == {}


# --- exit codes and JSON errors ------------------------------------------------------------

def test_nothing_stored_is_a_failure_and_leaves_no_index(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"
    # A path that does not exist.
    code, out, err = run_cli(["ingest", tmp_path / "nope", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 1 and "no such file or folder" in err and "error: nothing stored" in err
    assert not index.exists()
    # A folder where every file is rejected.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.jpg").write_bytes(b"not a picture")
    (bad / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    code, report = run_cli_json(["ingest", bad, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 1 and report["exit_code"] == 1 and report["stored"] == 0 and len(report["rejected"]) == 2
    assert report["error"]["type"] == "NothingStored"
    assert not index.exists()
    # An index folder that was there before stays, and only the index files go.
    index.mkdir()
    (index / "notes.txt").write_text("mine")
    code, _ = run_cli_json(["ingest", bad, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 1 and sorted(p.name for p in index.iterdir()) == ["notes.txt"]
    # An existing index keeps everything when a later run stores nothing.
    (index / "notes.txt").unlink()
    index.rmdir()
    make_photos(tmp_path / "good", range(2))
    run_cli_json(["ingest", tmp_path / "good", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    code, _ = run_cli_json(["ingest", bad, "--index", index], capsys)
    assert code == 1 and len(stored(index)) == 2
    # Partial: some rejected, the rest stored.
    make_photos(bad, [77])
    code, report = run_cli_json(["ingest", bad, "--index", index], capsys)
    assert code == 3 and report["stored"] == 1
    # All already stored: nothing new, nothing wrong.
    code, report = run_cli_json(["ingest", tmp_path / "good", "--index", index], capsys)
    assert code == 0 and report["already_stored"] == 2


def test_errors_as_json_keep_their_exit_codes(tmp_path, tiny_blip_bundle, capsys):
    code, out, err = run_cli(["query", "--index", tmp_path / "none", "--server-side", "--json"], capsys)  # no TEXT
    assert code == 2 and json_error(out)["type"] == "UsageError" and err == ""
    code, out, err = run_cli(["query", "dogs", "--bundle", tiny_blip_bundle, "--index", tmp_path / "none", "--json"],
                             capsys)
    error = json_error(out)
    assert code == 1 and error["type"] == "IndexStoreError" and "no index at" in error["message"] and err == ""
    code, out, _ = run_cli(["query", "dogs", "-k", "0", "--json"], capsys)
    assert code == 2 and "-k" in json_error(out)["message"]
    code, out, _ = run_cli(["nonsense", "--json"], capsys)
    assert code == 2 and "nonsense" in json_error(out)["message"]
    # Without --json: one line on stderr, nothing on stdout.
    code, out, err = run_cli(["query", "dogs", "--bundle", tiny_blip_bundle, "--index", tmp_path / "none"], capsys)
    assert code == 1 and out == "" and err.startswith("error: no index at") and len(err.splitlines()) == 1


def test_index_delete_without_a_terminal_asks_for_yes(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"
    make_photos(tmp_path / "photos", range(2))
    run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    code, out, err = run_cli(["index", "delete", "--index", index], capsys)
    assert code == 2 and "pass --yes" in err and "interrupted" not in err
    code, out, err = run_cli(["index", "delete", "--index", index, "--json"], capsys)
    assert code == 2 and "pass --yes" in json_error(out)["message"] and "interrupted" not in err
    assert len(stored(index)) == 2
    # The same without a terminal in a real process (stdin closed, as from cron or a pipe).
    proc = subprocess.run([sys.executable, "-c", RUN_CLI, "index", "delete", "--index", str(index)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=clean_env(tmp_path), timeout=60)
    assert proc.returncode == 2 and "interrupted" not in proc.stderr and "pass --yes" in proc.stderr
    code, result = run_cli_json(["index", "delete", "--index", index, "--yes"], capsys)
    assert code == 0 and result["deleted"] == str(index) and not index.exists()


def test_a_declined_prompt_is_not_an_interrupted_ingest(tmp_path, tiny_blip_bundle, capsys, monkeypatch):
    index = tmp_path / "idx"
    make_photos(tmp_path / "photos", range(2))
    run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], capsys)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())

    def no_answer(*_args, **_kwargs):
        raise click.exceptions.Abort()  # what click.confirm raises on end of input

    monkeypatch.setattr(click, "confirm", no_answer)
    code, out, err = run_cli(["index", "delete", "--index", index], capsys)
    assert code == 1 and "interrupted" not in err and "aborted" in err
    assert len(stored(index)) == 2


def _busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def test_busy_ports_fail_in_one_line(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"
    make_photos(tmp_path / "photos", range(2))
    run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    busy = _busy_port()
    try:
        port = str(busy.getsockname()[1])
        code, out, err = run_cli(["serve", "--index", index, "--port", port], capsys)
        assert code == 1 and err.startswith(f"error: cannot listen on 127.0.0.1:{port}") and len(err.splitlines()) == 1
        code, out, err = run_cli(["serve", "--index", index, "--port", port, "--json"], capsys)
        assert code == 1 and "cannot listen" in json_error(out)["message"] and err == ""
        code, out, err = run_cli(["serve-images", tmp_path / "photos", "--port", port], capsys)
        assert code == 1 and err.startswith("error: cannot listen") and len(err.splitlines()) == 1
    finally:
        busy.close()


# --- output --------------------------------------------------------------------------------

def test_paths_output_and_stored_paths_are_absolute_and_resolved(tmp_path, tiny_blip_bundle, monkeypatch, capsys):
    make_photos(tmp_path / "lib" / "photos", range(4))
    (tmp_path / "lib" / "other").mkdir()
    monkeypatch.chdir(tmp_path / "lib" / "other")
    index = tmp_path / "idx"
    code, _ = run_cli_json(["ingest", "../photos", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0
    expected = sorted(str(p) for p in (tmp_path / "lib" / "photos").resolve().iterdir())
    assert sorted(stored(index).values()) == expected
    code, out, err = run_cli(["query", "a dog", "--mode", "dense", "-k", "3", "--paths", "--index", index], capsys)
    code_json, result = run_cli_json(["query", "a dog", "--mode", "dense", "-k", "3", "--index", index], capsys)
    assert code == 0 and err == ""
    assert out.splitlines() == [h["path"] for h in result["results"]] and len(out.splitlines()) == 3
    assert all(".." not in line and Path(line).is_absolute() and Path(line).is_file() for line in out.splitlines())
    code, out, _ = run_cli(["query", "a dog", "--paths", "--json", "--index", index], capsys)
    assert code == 2


def test_result_table_keeps_file_names_whole(tmp_path, tiny_blip_bundle, monkeypatch, capsys):
    deep = tmp_path / "a-rather-long-folder-name" / "another-long-folder" / "and-one-more-level"
    names = [f"holiday-{i}-with-a-quite-long-descriptive-name.jpg" for i in range(3)]
    for i, name in enumerate(names):
        write_image(deep / name, seed=200 + i)
    index = tmp_path / "idx"
    run_cli_json(["ingest", deep, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    for columns in ("80", "120"):
        monkeypatch.setenv("COLUMNS", columns)
        code, out, _ = run_cli(["query", "a dog", "--mode", "dense", "--index", index], capsys)
        assert code == 0
        for name in names:
            assert sum(name in line for line in out.splitlines()) == 1, (columns, out)
        assert "…/" in out  # the folders were shortened, not the names


# --- help and the README ---------------------------------------------------------------------

def _commands(group, path=("d2s-search",)):
    yield path, group
    if isinstance(group, click.Group):
        for name, command in group.commands.items():
            yield from _commands(command, (*path, name))


def test_every_option_has_help_every_command_json_and_no_help_points_outside_the_repository():
    from d2s_search.cli import cli

    missing, outside, no_json = [], [], []
    for path, command in _commands(cli):
        runs_itself = not isinstance(command, click.Group) or command.invoke_without_command
        if runs_itself and not any(p.name == "as_json" for p in command.params):
            no_json.append(" ".join(path))
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                missing.append(f"{' '.join(path)} {param.opts[0]}")
        with click.Context(command, info_name=path[-1]) as ctx:
            text = command.get_help(ctx)
        for bad in ("DESIGN.md", "../shared", "/work/"):
            if bad in text:
                outside.append(f"{' '.join(path)}: {bad}")
    assert missing == []
    assert outside == []
    assert no_json == []  # "every command takes --json"


def test_no_source_or_page_points_to_files_users_do_not_have():
    shipped = [*ROOT.glob("d2s_search/**/*.py"), *ROOT.glob("onnx_export/**/*.py"), *ROOT.glob("docs/*.md"),
               ROOT / "README.md"]
    assert len(shipped) > 20
    assert [str(f.relative_to(ROOT)) for f in shipped if "DESIGN.md" in f.read_text()] == []


def test_align_wants_its_data_named(capsys):
    code, _, err = run_cli(["align"], capsys)
    assert code == 2 and "--data is required" in err


def test_readme_quick_start_installs_what_it_runs():
    import tomllib

    from d2s_search.cli import cli

    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    quick = next(b for b in blocks if "export-onnx" in b)
    extras = set(re.search(r'-e "\.\[([^\]]+)\]"', quick).group(1).split(","))
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(declared)
    used = re.findall(r"d2s-search ([a-z-]+)", quick)
    assert used[-1] == "serve" and "serve" in extras  # ends on the search page, installed
    assert all(name in cli.commands for name in used)
    assert "Chromium" in readme


# --- serve and serve-images announce themselves once, also as JSON ----------------------------

def _read_line(stream, proc, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if line:
            return line
        if proc.poll() is not None:
            break
    raise AssertionError(f"no line from {proc.args[3:]} (exit {proc.poll()})")


def _stop(proc) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out, err


def test_serve_json_says_when_ready_and_the_address_is_printed_once(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"
    make_photos(tmp_path / "photos", range(3))
    run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    env = clean_env(tmp_path)
    base = [sys.executable, "-c", RUN_CLI, "serve", "--index", str(index), "--port", "0",
            "--thumbnail-dir", str(tmp_path / "thumbs")]
    proc = subprocess.Popen([*base, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            **interruptible())
    try:
        ready = json.loads(_read_line(proc.stdout, proc, 90))
        assert ready["ready"] is True and ready["index"] == str(index)
        assert ready["bundle"] == str(tiny_blip_bundle.resolve())  # recorded by the index, no --bundle given
        assert httpx.get(f"{ready['address']}api/status", timeout=10).json()["documents"] == 3
    finally:
        code, out, err = _stop(proc)
    assert code == 0 and out == ""  # one JSON line on stdout, nothing else
    assert "http://" not in err and "Uvicorn" not in err  # the address once, in the JSON line

    proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **interruptible())
    try:
        line = _read_line(proc.stderr, proc, 90)
        address = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        assert httpx.get(address, timeout=10).status_code == 200
    finally:
        code, out, err = _stop(proc)
    assert code == 0 and (line + err).count("http://") == 1, line + err


def test_serve_images_json_says_when_ready(tmp_path):
    photos = make_photos(tmp_path / "photos", range(2))
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, "serve-images", str(tmp_path / "photos"), "--port", "0",
                             "--quiet", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(tmp_path), **interruptible())
    try:
        ready = json.loads(_read_line(proc.stdout, proc, 60))
        assert ready["ready"] is True and ready["root"] == str((tmp_path / "photos").resolve())
        assert ready["ingest_with"].endswith(f"--url-base {ready['url']}")
        reply = httpx.get(ready["url"] + photos[0].name, timeout=10)
        assert reply.status_code == 200 and reply.content == photos[0].read_bytes()
    finally:
        code, out, _ = _stop(proc)
    assert code == 0 and out == ""


def test_settings_remember_the_last_index(tmp_path):
    assert settings.last_index() is None
    settings.remember_index(tmp_path / "a" / ".." / "b")
    assert settings.last_index() == (tmp_path / "b").resolve()
    (settings.config_dir() / "state.json").write_text("[1, 2]")
    assert settings.last_index() is None  # a damaged state file is ignored, never an error
    assert os.environ["D2S_CONFIG_DIR"]
