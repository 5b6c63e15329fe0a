"""ingest: formats, bad inputs, idempotence, crash safety, bundle checks."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from d2s_search.backends.local import LocalBackend
from tests.helpers import (
    clean_env,
    interruptible,
    jpeg_bytes,
    pattern_image,
    run_cli,
    run_cli_json,
    write_image,
)


def stored_paths(index: Path) -> list[str]:
    with sqlite3.connect(index / "index.sqlite") as db:
        return [r[0] for r in db.execute("SELECT path FROM docs ORDER BY seq")]


def test_every_format_is_ingested(tmp_path, tiny_blip_bundle, capsys):
    folder = tmp_path / "formats"
    write_image(folder / "a.jpg", 1)
    write_image(folder / "b.jpeg", 2)
    write_image(folder / "c.png", 3)
    write_image(folder / "d.webp", 4)
    write_image(folder / "e.gif", 5)
    write_image(folder / "f.bmp", 6)
    write_image(folder / "g.tif", 7)
    write_image(folder / "h.tiff", 8)
    pattern_image(9).convert("CMYK").save(folder / "i-cmyk.jpg")
    pattern_image(10).convert("P").save(folder / "j-palette.png", transparency=3)
    pattern_image(11).convert("RGBA").save(folder / "k-alpha.png")
    (folder / "UPPER.JPG").write_bytes(jpeg_bytes(12))
    index = tmp_path / "idx"
    code, report = run_cli_json(["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0, report
    assert report["found"] == report["stored"] == 12 and report["rejected"] == []
    assert sorted(Path(p).name for p in stored_paths(index)) == sorted(p.name for p in folder.iterdir())


def make_bad_folder(root: Path) -> dict[str, str]:
    """Good images mixed with every kind of bad input; returns {bad file name: expected reason}."""
    for i in range(6):
        write_image(root / f"good{i}.jpg", 100 + i)
    (root / "empty.jpg").write_bytes(b"")
    (root / "truncated.jpg").write_bytes(jpeg_bytes(7)[:500])
    (root / "notes.jpg").write_text("this is a text file, not a picture\n")
    Image.new("1", (20000, 20000)).save(root / "huge.png")
    (root / "broken-link.jpg").symlink_to(root / "nowhere.jpg")
    return {
        "empty.jpg": "empty file",
        "truncated.jpg": "truncated",
        "notes.jpg": "not an image",
        "huge.png": "20000x20000 is over the 120 MP limit",
        "broken-link.jpg": "not found",
    }


def test_bad_inputs_are_reported_and_the_rest_stored(tmp_path, tiny_blip_bundle, capsys):
    folder = tmp_path / "mixed"
    expected = make_bad_folder(folder)
    index = tmp_path / "idx"
    args = ["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index, "--batch-size", "4"]
    code, report = run_cli_json(args, capsys)
    assert code == 3  # partial: some inputs rejected, the rest stored
    assert report["stored"] == 6
    reasons = {Path(r["path"]).name: r["reason"] for r in report["rejected"]}
    assert set(reasons) == set(expected)
    for name, fragment in expected.items():
        assert fragment in reasons[name], (name, reasons[name])
    # Human output: one line per rejected file, then the summary; no traceback.
    code, out, err = run_cli(args, capsys)
    assert code == 3 and "Traceback" not in err
    assert sum(line.startswith("rejected ") for line in err.splitlines()) == len(expected)
    assert "stored 0 new image(s)" in out and "6 already stored" in out


def test_reingest_adds_nothing_and_same_bytes_are_one_document(tmp_path, tiny_blip_bundle, image_folder, capsys):
    index = tmp_path / "idx"
    code, first = run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and first["stored"] == 40
    copy = tmp_path / "copy.jpg"
    copy.write_bytes(next(image_folder.rglob("*.jpg")).read_bytes())
    code, again = run_cli_json(["ingest", image_folder, copy, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0
    assert again["stored"] == 0 and again["already_stored"] == 41
    assert len(stored_paths(index)) == 40


def test_duplicates_within_one_run(tmp_path, tiny_blip_bundle, capsys):
    folder = tmp_path / "dups"
    data = jpeg_bytes(3)
    for name in ("x.jpg", "y.jpg", "z.jpg"):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    code, report = run_cli_json(["ingest", folder, "--bundle", tiny_blip_bundle, "--index", tmp_path / "i"], capsys)
    assert code == 0 and report["stored"] == 1 and report["duplicates"] == 2


def test_empty_folder_is_a_clear_error(tmp_path, tiny_blip_bundle, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = run_cli(["ingest", tmp_path / "empty", "--bundle", tiny_blip_bundle, "--index", tmp_path / "i"], capsys)
    assert code == 1
    assert err.strip().startswith("error: no images found under") and len(err.strip().splitlines()) == 1


def test_missing_bundle_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "imgs").mkdir()
    write_image(tmp_path / "imgs" / "a.jpg", 1)
    code, _, err = run_cli(["ingest", tmp_path / "imgs", "--index", tmp_path / "i"], capsys)
    assert code == 1 and "no model bundle: run `d2s-search export-onnx` first" in err
    code, _, err = run_cli(["ingest", tmp_path / "imgs", "--bundle", tmp_path, "--index", tmp_path / "i"], capsys)
    assert code == 1 and "is not a model bundle" in err


def test_another_bundle_is_refused_and_nothing_is_lost(tmp_path, tiny_blip_bundle, tiny_clip_bundle, image_folder, capsys):
    index = tmp_path / "idx"
    run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    extra = tmp_path / "extra"
    write_image(extra / "new.jpg", 999)
    code, _, err = run_cli(["ingest", extra, "--bundle", tiny_clip_bundle, "--index", index], capsys)
    assert code == 1 and "was filled with bundle" in err and "tiny-blip" in err and "tiny-clip" in err
    code, _, err = run_cli(["query", "a dog", "--bundle", tiny_clip_bundle, "--index", index], capsys)
    assert code == 1 and "was filled with bundle" in err
    assert len(stored_paths(index)) == 40


def test_default_bundle_is_the_one_exported_last(tmp_path, image_folder, capsys):
    code, out, err = run_cli(["export-onnx", "--model", "tiny-clip", "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    code, report = run_cli_json(["ingest", image_folder, "--index", tmp_path / "i"], capsys)
    assert code == 0 and report["stored"] == 40
    backend = LocalBackend(tmp_path / "i")
    backend.open(None, create=False)
    assert backend.stats()["bundle_model"] == "tiny-clip"


def test_flickr8k_photos_are_ingested(tmp_path_factory, tiny_blip_bundle, flickr_images, capsys):
    index = tmp_path_factory.mktemp("flickr") / "idx"
    code, report = run_cli_json(["ingest", flickr_images, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and report["stored"] == 800 and report["rejected"] == []
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert stats["documents"] == 800 and stats["bundle_model"] == "tiny-blip"
    backend = LocalBackend(index)
    backend.open(None, create=False)
    with sqlite3.connect(index / "index.sqlite") as db:
        some_id = db.execute("SELECT id FROM docs LIMIT 1").fetchone()[0]
    (doc,) = backend.get([some_id])
    assert doc.dense.shape == (16,) and min(doc.sparse.values()) > 0
    widths = {row for row in sqlite3.connect(index / "index.sqlite").execute("SELECT width FROM docs")}
    assert len(widths) > 5  # real, varied photo sizes were recorded


def test_sigkill_mid_ingest_then_rerun_stores_everything_once(tmp_path, tiny_blip_bundle):
    folder = tmp_path / "many"
    for i in range(240):
        write_image(folder / f"p{i:04d}.png", seed=1000 + i)
    index = tmp_path / "idx"
    env = clean_env(tmp_path)
    cmd = [sys.executable, "-m", "d2s_search.cli", "ingest", str(folder), "--bundle", str(tiny_blip_bundle),
           "--index", str(index), "--batch-size", "4", "--workers", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stored = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (index / "index.sqlite").exists():
            try:
                with sqlite3.connect(index / "index.sqlite", timeout=1) as db:
                    stored = db.execute("SELECT COUNT(*) FROM docs").fetchone()[0]
            except sqlite3.OperationalError:
                stored = 0
            if stored >= 20:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "ingest finished before it could be killed; make the input larger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with sqlite3.connect(index / "index.sqlite") as db:
        after_kill = db.execute("SELECT COUNT(*) FROM docs").fetchone()[0]
    assert 20 <= after_kill < 240
    rerun = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    import json

    report = json.loads(rerun.stdout)
    assert report["already_stored"] == after_kill and report["stored"] == 240 - after_kill
    with sqlite3.connect(index / "index.sqlite") as db:
        ids = [r[0] for r in db.execute("SELECT id FROM docs")]
        paths = [r[0] for r in db.execute("SELECT path FROM docs")]
    assert len(ids) == len(set(ids)) == 240
    assert sorted(Path(p).name for p in paths) == sorted(p.name for p in folder.iterdir())
    # The stored vectors are whole: every document can be read back and searched.
    backend = LocalBackend(index)
    backend.open(None, create=False)
    docs = backend.get(ids)
    assert len(docs) == 240 and all(d.sparse and np.isfinite(d.dense).all() for d in docs)


def test_query_by_image_finds_that_image_first(tmp_path, tiny_blip_bundle, image_folder, capsys):
    index = tmp_path / "idx"
    run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    probe = sorted(image_folder.rglob("*.png"))[3]
    for mode in ("dense", "sparse"):
        code, result = run_cli_json(
            ["query", "--image", probe, "--mode", mode, "-k", "3", "--bundle", tiny_blip_bundle, "--index", index], capsys
        )
        assert code == 0
        assert Path(result["results"][0]["path"]).name == probe.name, mode
    bad = tmp_path / "bad.jpg"
    bad.write_text("nope")
    code, _, err = run_cli(["query", "--image", bad, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 1 and "cannot use" in err and "not an image in a format we read" in err


def test_image_bytes_in_memory_match_file_ids(tmp_path):
    from d2s_search.images import content_id, load_image

    p = write_image(tmp_path / "a.png", 5)
    assert load_image(p).id == content_id(p.read_bytes())
    buf = io.BytesIO()
    pattern_image(5).save(buf, "PNG")
    assert content_id(buf.getvalue()) == load_image(p).id


def test_documents_refused_by_the_index_are_reported_and_the_rest_stored(tmp_path, tiny_blip_bundle, image_folder):
    """A backend that refuses some documents of a batch (as OpenSearch can, per bulk item)."""
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    from d2s_search.errors import DocumentsRejectedError
    from d2s_search.ingest import ingest

    class PickyBackend(LocalBackend):
        def upsert(self, docs):
            refused = {d.id: "mapper_parsing_exception" for d in docs if d.path.endswith("img007.jpg")}
            super().upsert([d for d in docs if d.id not in refused])
            if refused:
                raise DocumentsRejectedError("some documents were refused", refused)

    bundle = Bundle.load(tiny_blip_bundle)
    backend = PickyBackend(tmp_path / "idx")
    backend.open(bundle.identity())
    report = ingest([image_folder], Encoder(bundle), backend, batch_size=8)
    assert report.stored == 39
    assert [(Path(p).name, r) for p, r in report.rejected] == [("img007.jpg", "refused by the index: mapper_parsing_exception")]
    assert backend.count() == 39


def test_ctrl_c_keeps_finished_batches_and_says_how_to_continue(tmp_path, tiny_blip_bundle):
    folder = tmp_path / "many"
    for i in range(240):
        write_image(folder / f"p{i:04d}.png", seed=3000 + i)
    index = tmp_path / "idx"
    cmd = [sys.executable, "-m", "d2s_search.cli", "ingest", str(folder), "--bundle", str(tiny_blip_bundle),
           "--index", str(index), "--batch-size", "4", "--workers", "1"]
    proc = subprocess.Popen(cmd, env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **interruptible())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with sqlite3.connect(index / "index.sqlite", timeout=1) as db:
                if db.execute("SELECT COUNT(*) FROM docs").fetchone()[0] >= 12:
                    break
        except sqlite3.OperationalError:
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: everything stored so far is kept" in err and "Traceback" not in err
    with sqlite3.connect(index / "index.sqlite") as db:
        kept = db.execute("SELECT COUNT(*) FROM docs").fetchone()[0]
    assert 12 <= kept < 240


def test_url_base_stores_a_url_per_image(tmp_path, tiny_blip_bundle, capsys):
    folder = tmp_path / "photos"
    write_image(folder / "beach day" / "ü.jpg", 1)
    write_image(folder / "b.png", 2)
    index = tmp_path / "idx"
    code, report = run_cli_json(
        ["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index, "--url-base", "http://127.0.0.1:8765"], capsys
    )
    assert code == 0 and report["stored"] == 2
    with sqlite3.connect(index / "index.sqlite") as db:
        urls = sorted(r[0] for r in db.execute("SELECT url FROM docs"))
    assert urls == ["http://127.0.0.1:8765/b.png", "http://127.0.0.1:8765/beach%20day/%C3%BC.jpg"]
    code, _, err = run_cli(["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index, "--url-base", "ftp://x"], capsys)
    assert code == 2 and "--url-base must be an absolute http(s) URL" in err


def test_server_side_query_needs_opensearch_and_text(tmp_path, tiny_blip_bundle, image_folder, capsys):
    index = tmp_path / "idx"
    run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    code, _, err = run_cli(["query", "dog", "--server-side", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 2 and "--server-side needs --url" in err
    code, _, err = run_cli(["query", "dog", "--server-side", "--mode", "dense", "--bundle", tiny_blip_bundle], capsys)
    assert code == 2 and "sparse plan" in err


def test_ingest_leaves_the_search_structures_built_for_the_first_query(tmp_path, tiny_blip_bundle, image_folder,
                                                                        capsys, monkeypatch):
    """The local index's search structures are built (or extended) at the end of ingest and saved,
    so the first query does not wait for them; a run that stores nothing does not touch them;
    if building them fails, the documents stay stored and one warning line says so."""
    from d2s_search.backends.local import cache as cache_mod
    from d2s_search.errors import IndexStoreError

    index = tmp_path / "idx"
    code, first = run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and first["stored"] == 40 and first["search_structures_seconds"] >= 0
    assert cache_mod.load(index / "cache").size == 40
    extra = tmp_path / "extra"
    write_image(extra / "new.png", 99)
    code, out, err = run_cli(["ingest", extra, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and "search structures" in out
    assert cache_mod.load(index / "cache").size == 41  # extended, saved
    code, again = run_cli_json(["ingest", extra, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and again["stored"] == 0 and "search_structures_seconds" not in again

    def fails(self):
        raise IndexStoreError("disk full (injected)")

    monkeypatch.setattr(LocalBackend, "prepare_search", fails)
    write_image(extra / "newer.png", 98)
    code, out, err = run_cli(["ingest", extra, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and "stored 1 new image(s)" in out
    assert err.count("warning: the search structures were not prepared (disk full (injected))") == 1
    assert len(stored_paths(index)) == 42
