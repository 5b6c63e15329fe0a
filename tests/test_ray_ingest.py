"""``ingest --engine ray`` on Ray's local mode: the same documents, vectors, ids and report as
one process; a re-run stores nothing twice; a worker killed mid-run loses and duplicates
nothing; bad pictures are reported and the rest go on."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from d2s_search.backends.local import LocalBackend
from tests.helpers import run_cli_json, write_image

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


def test_an_address_nobody_answers_at_is_one_line_at_once(tiny_blip_bundle, tmp_path, capsys):
    import socket

    assert not ray.is_initialized()  # first in this module: the command starts (or joins) Ray itself
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_image(tmp_path / "photos" / "a.jpg", seed=1)
    start = time.perf_counter()
    code, out = run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index",
                              tmp_path / "idx", "--engine", "ray", "--address", f"127.0.0.1:{port}"], capsys)
    assert time.perf_counter() - start < 30  # Ray alone keeps trying for minutes
    assert code == 1 and out["error"]["type"] == "WorkersError"
    assert out["error"]["message"].startswith(f"no Ray cluster answers at 127.0.0.1:{port}")
    assert not (tmp_path / "idx").exists()  # the index this run created is not left empty behind it
    code, out = run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index",
                              tmp_path / "idx", "--engine", "ray", "--address", "nowhere"], capsys)
    assert code == 1 and "expected HOST:PORT" in out["error"]["message"]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (ingest joins it instead of starting its own)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """60 pictures in folders, a copy of one at a second path, a file that is not a picture and
    a cut-off JPEG."""
    root = tmp_path_factory.mktemp("ray-photos")
    for i in range(60):
        write_image(root / f"album{i % 3}" / f"p{i:02d}.jpg", seed=i)
    (root / "copies").mkdir()
    (root / "copies" / "same-as-p07.jpg").write_bytes((root / "album1" / "p07.jpg").read_bytes())
    (root / "album0" / "notes.jpg").write_text("not a picture")
    whole = (root / "album2" / "p08.jpg").read_bytes()
    (root / "album2" / "cut.jpg").write_bytes(whole[: len(whole) // 3])
    return root


def _documents(index: Path) -> dict[str, tuple]:
    """id -> (paths, terms, dense) of every stored document, read back through the backend."""
    store = LocalBackend(index)
    store.open(None, create=False)
    try:
        ids = sorted({doc_id for doc_id, _ in store.document_paths()})
        paths = store.paths_of(ids)
        return {d.id: (sorted(paths[d.id]), d.sparse, np.asarray(d.dense)) for d in store.get(ids)}
    finally:
        store.close()


def _report_counts(report: dict) -> dict:
    """The counts a run must agree on. A copy of a picture read while the picture is still with
    the workers counts as a duplicate of this run, else as a stored picture found again (and a
    copy): the documents end the same either way."""
    keys = ("found", "stored", "moved")
    return {k: report[k] for k in keys} | {
        "seen_before": report["already_stored"] + report["duplicates"],
        "rejected": sorted(r["path"] for r in report["rejected"]),
    }


@pytest.fixture(scope="module")
def one_process(photos, tiny_blip_bundle, tmp_path_factory):
    """The reference: the same folder ingested by one process, in batches of 8."""
    import contextlib
    import io
    import json

    from d2s_search.cli import main

    index = tmp_path_factory.mktemp("one-process") / "idx"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main(["ingest", str(photos), "--bundle", str(tiny_blip_bundle), "--index", str(index), "--batch-size", "8",
              "--json"])
    assert exit_.value.code == 3  # two inputs rejected
    return index, json.loads(out.getvalue())


def _assert_same_documents(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for doc_id, (paths, terms, dense) in want.items():
        got_paths, got_terms, got_dense = got[doc_id]
        assert got_paths == paths
        # The same words, with the same weights up to float32 rounding: ONNX Runtime's sums
        # depend on its thread count (one thread a worker here, two in the one process).
        assert got_terms.keys() == terms.keys()
        words = list(terms)
        np.testing.assert_allclose([got_terms[w] for w in words], [terms[w] for w in words], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got_dense, dense, rtol=1e-5, atol=1e-7)


def test_ray_stores_what_one_process_stores(local_ray, photos, tiny_blip_bundle, one_process, tmp_path, capsys):
    index = tmp_path / "idx"
    args = ["ingest", photos, "--bundle", tiny_blip_bundle, "--index", index, "--batch-size", "8",
            "--engine", "ray", "--workers", "2"]
    code, report = run_cli_json(args, capsys)
    assert code == 3  # the two bad files, each with its reason; everything else stored
    reference_index, reference = one_process
    assert _report_counts(report) == _report_counts(reference) == {
        "found": 63, "stored": 60, "moved": 0, "seen_before": 1,
        "rejected": sorted([str(photos / "album0" / "notes.jpg"), str(photos / "album2" / "cut.jpg")]),
    }
    assert report["workers"]["engine"] == "ray" and report["workers"]["count"] == 2
    assert report["workers"]["start_seconds"] > 0
    assert {r["path"]: r["reason"] for r in report["rejected"]}[str(photos / "album0" / "notes.jpg")].startswith(
        "not an image")
    docs = _documents(index)
    _assert_same_documents(docs, _documents(reference_index))
    copy_id = next(i for i, (paths, _, _) in docs.items() if len(paths) == 2)
    assert docs[copy_id][0] == sorted([str(photos / "album1" / "p07.jpg"), str(photos / "copies" / "same-as-p07.jpg")])

    # again: everything is known, nothing is encoded or written twice
    code, again = run_cli_json(args, capsys)
    assert code == 3 and again["stored"] == 0 and again["already_stored"] == 61
    with sqlite3.connect(index / "index.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM docs").fetchone()[0] == 60


def _encode_workers() -> list[int]:
    """Pids of the Ray actor processes that hold an encoder (their process title)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if title.startswith(b"ray::EncodeWorker"):
                pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the worker processes through /proc")
def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(local_ray, photos, tiny_blip_bundle, one_process,
                                                              tmp_path):
    from d2s_search.bundle import Bundle
    from d2s_search.ray_ingest import IndexTarget, RayOptions, ray_ingest

    bundle = Bundle.load(tiny_blip_bundle)
    store = LocalBackend(tmp_path / "idx")
    store.open(bundle.identity())
    killed: list[int] = []

    def kill_one(done: int, stored: int) -> None:
        if not killed and stored:  # the first batch is stored: one worker dies with its queue
            pids = _encode_workers()
            assert pids, "no encoder worker process found"
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    try:
        report = ray_ingest([photos], bundle, store, IndexTarget("local"), RayOptions(workers=2), batch_size=4,
                            on_progress=kill_one)
    finally:
        store.close()
    assert killed
    assert report.stored == 60 and report.already_stored + report.duplicates == 1 and len(report.rejected) == 2
    _assert_same_documents(_documents(tmp_path / "idx"), _documents(one_process[0]))
    with sqlite3.connect(tmp_path / "idx" / "index.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM docs").fetchone()[0] == 60


def test_a_worker_that_cannot_load_the_bundle_is_one_line(local_ray, photos, tiny_blip_bundle, tmp_path, capsys):
    from d2s_search.bundle import Bundle
    from d2s_search.errors import WorkersError
    from d2s_search.ray_ingest import IndexTarget, RayOptions, ray_ingest

    bundle = Bundle.load(tiny_blip_bundle)
    store = LocalBackend(tmp_path / "idx")
    store.open(bundle.identity())
    # the workers' copy of the bundle is not where the driver's is (no shared filesystem)
    moved = Bundle.load(tiny_blip_bundle)
    moved.path = tmp_path / "not-on-the-workers"
    try:
        with pytest.raises(WorkersError) as info:
            ray_ingest([photos], moved, store, IndexTarget("local"), RayOptions(workers=1))
    finally:
        store.close()
    message = str(info.value)
    assert message.startswith("a worker could not start: ") and "not-on-the-workers" in message
    assert "\n" not in message and "Traceback" not in message


def test_without_ray_the_command_names_the_extra_before_any_work(photos, tiny_blip_bundle, tmp_path, capsys,
                                                                 monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    code, out = run_cli_json(["ingest", photos, "--bundle", tiny_blip_bundle, "--index", tmp_path / "idx",
                              "--engine", "ray"], capsys)
    assert code == 1 and out["error"]["type"] == "MissingDependencyError"
    assert "pip install 'd2s-search[ray]'" in out["error"]["message"] and "--engine ray" in out["error"]["message"]
    assert not (tmp_path / "idx").exists()


def test_progress_reaches_every_file(local_ray, photos, tiny_blip_bundle, tmp_path):
    from d2s_search.bundle import Bundle
    from d2s_search.ray_ingest import IndexTarget, RayOptions, ray_ingest

    bundle = Bundle.load(tiny_blip_bundle)
    store = LocalBackend(tmp_path / "idx")
    store.open(bundle.identity())
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()
    started: list[int] = []

    def on_progress(done: int, stored: int) -> None:
        with lock:
            seen.append((done, stored))

    try:
        t0 = time.perf_counter()
        report = ray_ingest([photos], bundle, store, IndexTarget("local"), RayOptions(workers=1), batch_size=16,
                            on_start=started.append, on_progress=on_progress)
        assert time.perf_counter() - t0 < 600
    finally:
        store.close()
    assert started == [63]
    assert seen[-1] == (63, 60) and report.stored == 60
    assert all(b[0] >= a[0] and b[1] >= a[1] for a, b in zip(seen, seen[1:]))  # never goes back


def test_embed_on_ray_writes_what_one_process_writes(local_ray, tiny_blip_bundle, tmp_path, capsys):
    """``embed --engine ray``: the same ids and vectors as one process, and the bad picture
    rejected with its reason."""
    from d2s_search.train.data import read_embeddings

    rows = ["image,caption"]
    for i in range(40):
        write_image(tmp_path / "imgs" / f"im{i:02d}.png", seed=200 + i)
        rows += [f"imgs/im{i:02d}.png,a dog number {i}", f"imgs/im{i:02d}.png,a car and a tree {i}"]
    (tmp_path / "imgs" / "bad.png").write_text("not a picture")
    rows.append("imgs/bad.png,a broken picture")
    (tmp_path / "caps.csv").write_text("\n".join(rows))
    common = ["embed", tmp_path / "caps.csv", "--bundle", tiny_blip_bundle, "--batch-size", "8", "--format", "npy"]
    code, one = run_cli_json([*common, "--out", tmp_path / "one"], capsys)
    assert code == 3 and one["img"]["count"] == 40
    code, out = run_cli_json([*common, "--out", tmp_path / "ray", "--engine", "ray", "--workers", "2"], capsys)
    assert code == 3
    for side in ("img", "text"):
        assert out[side]["count"] == one[side]["count"] and out[side]["rejected"] == one[side]["rejected"]
        want_ids, want = read_embeddings(tmp_path / "one", side)
        got_ids, got = read_embeddings(tmp_path / "ray", side)
        assert got_ids == want_ids
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [r["id"] for r in out["img"]["rejected"]] == [one["img"]["rejected"][0]["id"]]
    assert (tmp_path / "ray" / "dataset_meta.json").read_text() == (tmp_path / "one" / "dataset_meta.json").read_text()
