"""Watching folders: a real folder, watchdog's real observer, a real local index. Every change
is waited for with a deadline (never a fixed sleep); the settling rules themselves are checked
on a hand-driven clock."""

from __future__ import annotations

import hashlib
import json
import queue
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from d2s_search.watch import Batch, Changes
from tests.helpers import clean_env, interruptible, jpeg_bytes, run_cli, write_image

RUN_CLI = "import sys; from d2s_search.cli import main; main(sys.argv[1:])"
DEADLINE = 20.0  # seconds a change may take to show (it takes about the delay; the machine may be busy)
DELAY = 0.3


def stored(index: Path) -> dict[str, list[str]]:
    """id -> every stored path (the shown one first), read from the index's own database."""
    with sqlite3.connect(index / "index.sqlite") as db:
        docs = {doc_id: [path] for doc_id, path in db.execute("SELECT id, path FROM docs")}
        for path, doc_id in db.execute("SELECT path, id FROM copies ORDER BY path"):
            docs[doc_id].append(path)
    return docs


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_for(what: Callable[[], object], message: str, timeout: float = DEADLINE):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout:.0f}s: {message}")


class Lines:
    """A child's output, read line by line in a thread: :meth:`next` waits with a deadline."""

    def __init__(self, stream) -> None:
        import threading

        self._lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout: float = DEADLINE) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout:.0f}s after {self.seen}") from None
        if line is None:
            self._lines.put(None)
            raise AssertionError(f"the output ended after {self.seen}")
        self.seen.append(line)
        return line

    def until(self, text: str, timeout: float = DEADLINE) -> str:
        while True:
            line = self.next(timeout)
            if text in line:
                return line

    def rest(self, timeout: float = DEADLINE) -> str:
        """Everything up to the end of the output (the child has ended)."""
        left = []
        while (line := self._lines.get(timeout=timeout)) is not None:
            left.append(line)
        self._lines.put(None)
        return "".join(left)


class Watched:
    """An index of a photo folder, watched through ``Index.watch``; each applied batch queued."""

    def __init__(self, root: Path, bundle: Path, index: Path | None = None, delay: float = DELAY, **options):
        from d2s_search import Index

        self.photos = root / "photos"
        self.index_path = index or root / "index"
        self.index = Index.open(self.index_path, bundle=bundle, create=True, device="cpu")
        self.index.ingest(self.photos)
        self.batches: queue.Queue = queue.Queue()
        self.errors: list[str] = []
        self.watching = self.index.watch(self.photos, delay=delay, on_batch=self.batches.put,
                                         on_error=self.errors.append, **options)

    def next_batch(self, timeout: float = DEADLINE):
        try:
            return self.batches.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no batch within {timeout:.0f}s") from None

    def no_more_batches(self) -> list:
        left = []
        while not self.batches.empty():
            left.append(self.batches.get_nowait())
        return left

    def close(self) -> None:
        self.index.close()  # stops the watcher first


@pytest.fixture
def watched(tmp_path, tiny_blip_bundle):
    for i in range(3):
        write_image(tmp_path / "photos" / "2024" / f"p{i}.jpg", seed=300 + i)
    write_image(tmp_path / "photos" / "2025" / "q0.png", seed=310)
    made = Watched(tmp_path, tiny_blip_bundle)
    yield made
    made.close()
    assert made.errors == []


def test_a_new_photo_is_added_and_found_by_a_search(watched):
    before = stored(watched.index_path)
    new = write_image(watched.photos / "2025" / "new.jpg", seed=320)
    batch = watched.next_batch()
    assert (batch.added, batch.moved, batch.removed, batch.rejected) == (1, 0, 0, [])
    after = stored(watched.index_path)
    assert set(after) - set(before) == {sha(new)} and after[sha(new)] == [str(new.resolve())]
    # The watcher wrote through its own connection: this thread's searches see the new generation.
    hits = watched.index.search(image=new, mode="dense", k=1).hits
    assert [(h.id, h.path) for h in hits] == [(sha(new), str(new.resolve()))]


def test_a_new_photo_gets_its_exif_date_and_its_fields_from_the_metadata_file(tmp_path, tiny_blip_bundle):
    from tests.helpers import exif_jpeg

    write_image(tmp_path / "photos" / "old.jpg", seed=330)
    (tmp_path / "fields.csv").write_text("file,trip\nnew.jpg,alps\n")
    made = Watched(tmp_path, tiny_blip_bundle, metadata=tmp_path / "fields.csv")
    try:
        exif_jpeg(tmp_path / "photos" / "new.jpg", 331, "2018:08:01 10:00:00", (46.0, 7.0))
        assert made.next_batch().added == 1
        found = made.index.search("a photo", filters=made.index.filter(where=["trip=alps"], after="2018-08-01",
                                                                        near="46,7,1")).hits
        assert [Path(h.path).name for h in found] == ["new.jpg"]
    finally:
        made.close()
    assert made.errors == []


def test_a_photo_moved_to_another_folder_keeps_its_document(watched):
    old = watched.photos / "2024" / "p1.jpg"
    doc_id, count = sha(old), len(stored(watched.index_path))
    new = watched.photos / "2025" / "moved.jpg"
    old.rename(new)
    batch = watched.next_batch()
    assert (batch.added, batch.moved, batch.removed) == (0, 1, 0)  # not encoded again
    after = stored(watched.index_path)
    assert len(after) == count and after[doc_id] == [str(new.resolve())]


def test_a_folder_moved_keeps_the_documents_of_its_photos(watched):
    before = stored(watched.index_path)
    (watched.photos / "2024").rename(watched.photos / "summer")
    moved = 0
    while moved < 3:
        batch = watched.next_batch()
        assert batch.added == 0 and batch.removed == 0
        moved += batch.moved
    after = stored(watched.index_path)
    assert set(after) == set(before)
    assert sorted(Path(p[0]).parent.name for p in after.values()) == ["2025", "summer", "summer", "summer"]


def test_a_deleted_photo_removes_its_document_and_a_deleted_folder_all_of_its(watched):
    gone = watched.photos / "2025" / "q0.png"
    doc_id = sha(gone)
    gone.unlink()
    batch = watched.next_batch()
    assert (batch.added, batch.removed, batch.gone) == (0, 1, 1)
    assert doc_id not in stored(watched.index_path) and len(stored(watched.index_path)) == 3
    for picture in (watched.photos / "2024").iterdir():
        picture.unlink()
    (watched.photos / "2024").rmdir()
    wait_for(lambda: stored(watched.index_path) == {}, "the folder's documents removed")
    removed = 0
    while removed < 3:
        removed += watched.next_batch().removed


def test_a_copy_adds_its_path_to_the_document(watched):
    original = watched.photos / "2024" / "p0.jpg"
    copy = watched.photos / "2025" / "copy.jpg"
    copy.write_bytes(original.read_bytes())
    batch = watched.next_batch()
    assert (batch.added, batch.copies, batch.moved) == (0, 1, 0)
    assert stored(watched.index_path)[sha(original)] == [str(original.resolve()), str(copy.resolve())]


def test_a_name_that_is_not_utf8_is_followed_in_and_out(watched):
    import os

    from d2s_search.pathtext import path_to_text

    raw = os.fsencode(watched.photos / "2025") + b"/caf\xe9.jpg"  # Latin-1, not UTF-8
    with open(raw, "wb") as f:
        f.write(jpeg_bytes(345))
    doc_id = hashlib.sha256(jpeg_bytes(345)).hexdigest()
    assert watched.next_batch().added == 1
    shown = path_to_text(raw)
    assert stored(watched.index_path)[doc_id] == [shown] and shown.endswith("caf\\xe9.jpg")
    os.unlink(raw)
    assert watched.next_batch().removed == 1 and doc_id not in stored(watched.index_path)


def test_a_photo_written_in_two_halves_is_ingested_once_whole(tmp_path, tiny_blip_bundle):
    (tmp_path / "photos").mkdir()
    write_image(tmp_path / "photos" / "first.jpg", seed=330)
    made = Watched(tmp_path, tiny_blip_bundle, delay=1.0)
    try:
        data = jpeg_bytes(331, size=(400, 300))
        target = made.photos / "slow.jpg"
        with open(target, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(0.4)  # the copy pauses, shorter than the delay: nothing may be read yet
            f.write(data[len(data) // 2:])
        batch = made.next_batch()
        assert (batch.added, batch.rejected) == (1, [])  # a half JPEG would be rejected as truncated
        assert hashlib.sha256(data).hexdigest() in stored(made.index_path)
        time.sleep(3 * 1.0)  # three delays: no second batch for the same file
        assert made.no_more_batches() == []
    finally:
        made.close()
    assert made.errors == []


def test_a_file_that_is_not_a_picture_is_rejected_and_the_others_go_on(watched):
    (watched.photos / "2025" / "notes.jpg").write_text("a shopping list, not a picture\n")
    good = write_image(watched.photos / "2025" / "good.jpg", seed=340)
    added, rejected = 0, []
    while added < 1 or not rejected:
        batch = watched.next_batch()
        added += batch.added
        rejected += batch.rejected
    assert rejected == [(str((watched.photos / "2025" / "notes.jpg").resolve()),
                         "not an image in a format we read (JPEG, PNG, WebP, GIF, BMP or TIFF)")]
    assert sha(good) in stored(watched.index_path)


def test_the_index_folder_hidden_and_temporary_files_are_ignored(tmp_path, tiny_blip_bundle):
    photos = tmp_path / "photos"
    write_image(photos / "p0.jpg", seed=350)
    index = photos / "my-index"  # a local index made inside the folder it indexes
    made = Watched(tmp_path, tiny_blip_bundle, index=index)
    try:
        before = stored(index)
        write_image(index / "picture-in-the-index.jpg", seed=351)
        write_image(photos / ".hidden.jpg", seed=352)
        write_image(photos / ".thumbnails" / "t.jpg", seed=353)
        write_image(photos / "download.jpg.part", seed=354, fmt="JPEG")
        marker = write_image(photos / "marker.jpg", seed=355)  # after the others: they had their chance
        batch = made.next_batch()
        assert (batch.added, batch.rejected) == (1, [])
        assert set(stored(index)) - set(before) == {sha(marker)}
        time.sleep(3 * DELAY)
        assert made.no_more_batches() == []
    finally:
        made.close()


def test_a_batch_that_cannot_be_written_is_said_and_the_watch_goes_on(watched, monkeypatch):
    from d2s_search import Index
    from d2s_search.errors import DiskFullError

    real_ingest = Index.ingest
    failures = []

    def full_once(self, *args, **kwargs):
        if not failures:
            failures.append(1)
            raise DiskFullError("/tmp", 0)
        return real_ingest(self, *args, **kwargs)

    monkeypatch.setattr(Index, "ingest", full_once)
    write_image(watched.photos / "first.jpg", seed=360)
    wait_for(lambda: watched.errors, "the failed batch reported")
    assert len(watched.errors) == 1 and "disk" in watched.errors[0].lower()
    watched.errors.clear()
    later = write_image(watched.photos / "later.jpg", seed=361)
    assert watched.next_batch().added == 1 and sha(later) in stored(watched.index_path)


def test_watching_a_missing_folder_is_refused_in_the_callers_thread(tmp_path, tiny_blip_bundle):
    from d2s_search import Index
    from d2s_search.watch import WatchError

    write_image(tmp_path / "photos" / "p.jpg", seed=370)
    with Index.open(tmp_path / "index", bundle=tiny_blip_bundle, create=True, device="cpu") as index:
        index.ingest(tmp_path / "photos")
        with pytest.raises(WatchError, match="no such file or folder"):
            index.watch(tmp_path / "nowhere")


def test_events_from_an_injected_source_on_a_backend_that_cannot_list_paths(tmp_path, tiny_blip_bundle, monkeypatch):
    """The source of events and the clock are the watcher's to be given; a backend without
    path listing gets new pictures, and a notice (once) that removals are not followed."""
    import d2s_search.watch as watch
    from d2s_search import Index
    from d2s_search.watch import Watcher, WatchOptions

    write_image(tmp_path / "photos" / "p.jpg", seed=375)
    monkeypatch.setattr(watch, "_lists_paths", lambda index: False)
    sources, notices, clock = [], [], Clock()
    with Index.open(tmp_path / "index", bundle=tiny_blip_bundle, create=True, device="cpu") as index:
        index.ingest(tmp_path / "photos")
        watcher = Watcher(index, [tmp_path / "photos"], WatchOptions(delay=1.0), on_notice=notices.append,
                          source=lambda roots, changes, events: sources.append((roots, changes)) or (lambda: None),
                          clock=clock)
        watcher.start()
        watcher.start()
        assert len(sources) == 1 and len(notices) == 1 and "deleted and moved files keep their documents" in notices[0]
        (roots, changes), = sources
        assert [r.folder for r in roots] == [(tmp_path / "photos").resolve()]
        new = write_image(tmp_path / "photos" / "new.jpg", seed=376)
        changes.changed(str(new.resolve()))
        changes.gone(str((tmp_path / "photos" / "p.jpg").resolve()))
        (tmp_path / "photos" / "p.jpg").unlink()
        assert watcher.step() is None  # not quiet yet
        clock.now += 1.0
        batch = watcher.step()
        assert (batch.added, batch.removed, batch.gone) == (1, 0, 0)
        assert len(stored(tmp_path / "index")) == 2  # the deleted picture's document stays


# --- settling, on a clock the test moves ---------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_path_is_ready_once_quiet_for_the_delay_and_its_size_stopped_changing():
    clock, sizes = Clock(), {"a.jpg": (10, 1)}
    changes = Changes(1.0, clock=clock, signature=lambda path: sizes.get(path))
    changes.changed("a.jpg")
    clock.now += 0.5
    changes.changed("a.jpg")  # written again: the delay starts over
    clock.now += 0.9
    assert changes.take() is None
    sizes["a.jpg"] = (20, 2)  # grew without an event (a slow network copy)
    clock.now += 0.2
    assert changes.take() is None and changes.wait_time() == pytest.approx(1.0)
    clock.now += 1.0
    assert changes.take() == Batch(files=["a.jpg"], gone=[])
    assert changes.pending() == 0 and changes.wait_time() is None


def test_gone_paths_wait_for_files_still_settling_but_not_for_ever():
    clock = Clock()
    changes = Changes(1.0, clock=clock, signature=lambda path: (1, int(clock.now * 1000)) if path == "busy.jpg"
                      else (1, 1))
    changes.gone("old/a.jpg")
    changes.changed("busy.jpg")  # keeps changing: a long copy under way
    clock.now += 1.5
    assert changes.take() is None  # the delete may be half of a move whose copy is still running
    clock.now += 9.0
    assert changes.take() == Batch(files=[], gone=["old/a.jpg"])


def test_a_folder_that_appears_is_walked_once_quiet_and_its_files_settle_in_turn():
    clock = Clock()
    changes = Changes(1.0, clock=clock, expand=lambda folder: [f"{folder}/x.jpg", f"{folder}/y.jpg"],
                      signature=lambda path: (1, 1))
    changes.moved("elsewhere/trip", "photos/trip", is_dir=True)
    clock.now += 1.0
    assert changes.take() is None  # the folder walked; its files settle, and the old path waits for them
    assert changes.pending() == 3
    clock.now += 1.0
    # One batch: the files ingested first (their stored bytes move), then the old folder given up.
    assert changes.take() == Batch(files=["photos/trip/x.jpg", "photos/trip/y.jpg"], gone=["elsewhere/trip"])


# --- the commands ----------------------------------------------------------------------------


def test_ingest_watch_runs_until_interrupted_and_prints_each_batch(tmp_path, tiny_blip_bundle):
    photos = tmp_path / "photos"
    write_image(photos / "p0.jpg", seed=380)
    write_image(photos / "p1.jpg", seed=381)
    index = tmp_path / "index"
    args = ["ingest", str(photos), "--bundle", str(tiny_blip_bundle), "--index", str(index), "--watch",
            "--watch-delay", "0.3", "--json"]
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(tmp_path), **interruptible())
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        first = json.loads(out.next(timeout=60))
        assert (first["stored"], first["exit_code"]) == (2, 0)
        err.until("watching")
        new = write_image(photos / "sub" / "new.jpg", seed=382)
        added = json.loads(out.next())
        assert added["batch"]["added"] == 1 and added["batch"]["rejected"] == []
        (photos / "p0.jpg").unlink()
        removed = json.loads(out.next())
        assert (removed["batch"]["removed"], removed["batch"]["added"]) == (1, 0)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    rest = err.rest()
    assert code == 0, rest
    assert rest.strip().splitlines()[-1] == "stopped watching" and out.rest() == ""
    assert sorted(stored(index)) == sorted([sha(photos / "p1.jpg"), sha(new)])


def test_ingest_watch_ends_on_sigterm_and_prints_lines(tmp_path, tiny_blip_bundle):
    photos = tmp_path / "photos"
    photos.mkdir()  # empty: the watch waits for the first pictures
    index = tmp_path / "index"
    args = ["ingest", str(photos), "--bundle", str(tiny_blip_bundle), "--index", str(index), "--watch",
            "--watch-delay", "0.3"]
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(tmp_path))
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        err.until("watching", timeout=60)
        write_image(photos / "first.jpg", seed=390)
        (photos / "broken.png").write_bytes(b"\x89PNG not really")
        added = rejected = 0
        while not (added and rejected):
            line = out.next()
            added += "added 1," in line
            rejected += "1 rejected" in line
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    said = "".join(err.seen) + err.rest()
    assert code == 0, said
    assert f"rejected {(photos / 'broken.png').resolve()}: " in said and said.endswith("stopped watching\n")
    assert len(stored(index)) == 1


def test_ingest_watch_stopped_before_any_picture_leaves_no_index(tmp_path, tiny_blip_bundle):
    photos = tmp_path / "photos"
    photos.mkdir()
    index = tmp_path / "index"
    args = ["ingest", str(photos), "--bundle", str(tiny_blip_bundle), "--index", str(index), "--watch"]
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(tmp_path))
    err = Lines(proc.stderr)
    try:
        err.until("no images found under", timeout=60)
        err.until("watching")
        assert index.is_dir()  # made to watch into
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0 and err.rest().strip() == "stopped watching"
    assert not index.exists()


@pytest.mark.parametrize("extra_args, expected", [
    (["s3://bucket/photos"], "--watch follows local folders and files, not s3://bucket/photos"),
    (["--engine", "ray"], "--watch ingests in this process: leave out --engine ray"),
])
def test_ingest_watch_refuses_what_it_cannot_follow_in_one_line(tmp_path, tiny_blip_bundle, capsys, extra_args,
                                                                 expected):
    write_image(tmp_path / "photos" / "p.jpg", seed=395)
    code, out, err = run_cli(["ingest", tmp_path / "photos", *extra_args, "--bundle", tiny_blip_bundle,
                              "--index", tmp_path / "index", "--watch"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    assert not (tmp_path / "index").exists()


def test_serve_watch_finds_a_photo_added_after_it_started(tmp_path, tiny_blip_bundle):
    pytest.importorskip("fastapi")
    photos = tmp_path / "photos"
    for i in range(3):
        write_image(photos / f"p{i}.jpg", seed=400 + i)
    index = tmp_path / "index"
    code = subprocess.run([sys.executable, "-c", RUN_CLI, "ingest", str(photos), "--bundle", str(tiny_blip_bundle),
                           "--index", str(index)], env=clean_env(tmp_path), capture_output=True, text=True,
                          timeout=120).returncode
    assert code == 0
    args = ["serve", "--index", str(index), "--port", "0", "--thumbnail-dir", str(tmp_path / "thumbs"),
            "--watch", str(photos), "--watch-delay", "0.3", "--json"]
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(tmp_path), **interruptible())
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        ready = json.loads(out.until('"ready"', timeout=60))
        address = ready["address"]
        assert httpx.get(f"{address}api/status", timeout=10).json()["documents"] == 3
        new = write_image(photos / "later" / "new.jpg", seed=410)
        batch = json.loads(out.next())
        assert batch["batch"]["added"] == 1

        def found() -> list:
            answer = httpx.post(f"{address}api/search/image", params={"mode": "dense", "k": 1},
                                files={"image": ("q.jpg", new.read_bytes())}, timeout=30)
            answer.raise_for_status()
            return [(h["id"], h["path"]) for h in answer.json()["results"]]

        assert found() == [(sha(new), str(new.resolve()))]
        assert httpx.get(f"{address}api/status", timeout=10).json()["documents"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, err.rest()


def test_serve_watch_refuses_a_uri_and_a_missing_folder_before_loading_anything(tmp_path, capsys):
    pytest.importorskip("fastapi")
    code, _, err = run_cli(["serve", "--index", tmp_path / "index", "--port", "0", "--watch", "s3://bucket/photos"],
                           capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--watch follows local folders and files, not s3://bucket/photos" in err
    code, _, err = run_cli(["serve", "--index", tmp_path / "index", "--port", "0", "--watch", tmp_path / "nowhere"],
                           capsys)
    assert code == 1 and err.strip() == f"error: cannot watch {tmp_path / 'nowhere'}: no such file or folder"
