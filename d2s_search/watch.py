"""Keep an index in sync with folders of pictures as their files change (``ingest --watch``,
``serve --watch``, ``Index.watch``).

Events from the file system (watchdog) are only collected; nothing is read until a path has
been quiet for ``delay`` seconds and its size and modification time have stopped changing (a
photo still being copied is not ingested half-written). What is ready is applied as a batch,
through the same :meth:`Index.ingest <d2s_search.Index.ingest>` as a normal run, so its skip
rules and its one-path-one-document rules hold unchanged:

- a created or written file is ingested (new bytes are stored; a file overwritten in place
  replaces its document);
- a moved file or folder: the new paths are ingested, which recognises the stored bytes and
  moves the document's path (no encoding), and the old paths are given up;
- a deleted file or folder: its stored paths are given up, and a document left without a
  path is removed (as ``index prune`` does).

The paths are given up after the batch's files are ingested, so a move inside one batch
keeps its document; a path is given up only when nothing is at it any more. The clock and the
source of events are injectable (tests drive :class:`Changes` without sleeping).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from . import extras
from .errors import D2SError, NoInputError, SettingsError
from .images import DEFAULT_SKIP, Formats, Skip, Skipped, _walk
from .pathtext import path_to_text
from .sources import _Name, exists, is_uri


class Index(Protocol):
    """What a watcher uses of :class:`d2s_search.Index` (not imported here: it imports this
    module for ``Index.watch``)."""

    @property
    def backend_name(self) -> str: ...

    def ingest(self, paths, **options): ...

    def prepare_search(self) -> float | None: ...

    def close(self) -> None: ...

    def _open_backend(self): ...


# A file is taken once it has been quiet this long (docs/design-decisions.md, "Watching folders").
DEFAULT_DELAY = 1.0
# Paths found gone wait for files still settling (a folder moved as a copy and a delete keeps its
# documents), but no longer than this many delays.
GONE_WAITS_AT_MOST = 10
POLL_SECONDS = 0.2  # how often the applying loop looks for ready paths and for a stop


class WatchError(D2SError):
    """What was given to watch cannot be watched (missing, a URI)."""


@dataclass
class _Pending:
    seen: float  # clock time of the last event (or of the last change of its signature)
    signature: tuple[int, int] | None  # (size, mtime_ns) then
    first: float = 0.0  # clock time of the first event (gone paths: how long they waited)


@dataclass
class Batch:
    """Paths ready to apply: files (and folders already expanded into them) to ingest, and
    paths (files or folders) found gone."""

    files: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


def _signature(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class Changes:
    """Paths seen changing, each held until it has been quiet for ``delay`` seconds and its
    (size, mtime) is what it was at its last event. Thread-safe: the event source adds, the
    applying loop takes. ``expand(folder)``: the files of a folder that appeared (walked when
    the folder is quiet; its files then settle in turn)."""

    def __init__(self, delay: float = DEFAULT_DELAY, *, expand: Callable[[str], Iterable[str]] = lambda folder: (),
                 clock: Callable[[], float] = time.monotonic, signature: Callable[[str], tuple | None] = _signature):
        self.delay = delay
        self._expand = expand
        self._clock = clock
        self._signature = signature
        self._lock = threading.Lock()
        self._files: dict[str, _Pending] = {}
        self._folders: dict[str, _Pending] = {}
        self._gone: dict[str, _Pending] = {}

    def changed(self, path: str, is_dir: bool = False) -> None:
        now = self._clock()
        with self._lock:
            held = self._folders if is_dir else self._files
            earlier = held.get(path)
            held[path] = _Pending(now, None if is_dir else self._signature(path), earlier.first if earlier else now)

    def gone(self, path: str) -> None:
        now = self._clock()
        with self._lock:
            earlier = self._gone.get(path)
            self._gone[path] = _Pending(now, None, earlier.first if earlier else now)

    def moved(self, source: str | None, dest: str | None, is_dir: bool = False) -> None:
        if source is not None:
            self.gone(source)
        if dest is not None:
            self.changed(dest, is_dir)

    def pending(self) -> int:
        with self._lock:
            return len(self._files) + len(self._folders) + len(self._gone)

    def wait_time(self) -> float | None:
        """Seconds until something may be ready (None: nothing pending)."""
        with self._lock:
            due = [p.seen + self.delay for held in (self._files, self._folders) for p in held.values()]
            settling = bool(due)
            # A gone path waiting for settling files is due when they are, or at its longest wait.
            due += [max(p.seen + self.delay, p.first + GONE_WAITS_AT_MOST * self.delay) if settling
                    else p.seen + self.delay for p in self._gone.values()]
        if not due:
            return None
        return max(0.0, min(due) - self._clock())

    def take(self) -> Batch | None:
        """What is ready now, removed from the pending paths; None when nothing is."""
        now = self._clock()
        with self._lock:
            for folder, pending in list(self._folders.items()):
                if now - pending.seen >= self.delay:
                    del self._folders[folder]
                    for path in self._expand(folder):  # each settles from now, like a file just written
                        if path not in self._files:
                            self._files[path] = _Pending(now, self._signature(path), now)
            ready: list[str] = []
            for path, pending in list(self._files.items()):
                if now - pending.seen < self.delay:
                    continue
                signature = self._signature(path)
                if signature != pending.signature:  # still growing without events: wait again
                    pending.seen, pending.signature = now, signature
                    continue
                ready.append(path)
                del self._files[path]
            settling = bool(self._files or self._folders)
            gone = [path for path, pending in self._gone.items() if now - pending.seen >= self.delay
                    and (not settling or now - pending.first >= GONE_WAITS_AT_MOST * self.delay)]
            for path in gone:
                del self._gone[path]
        if not ready and not gone:
            return None
        return Batch(sorted(ready), sorted(gone))


@dataclass
class WatchBatch:
    """What one applied batch did (``ingest --watch --json`` prints ``to_json()`` per line)."""

    added: int = 0  # new bytes stored: new pictures, files overwritten with other bytes
    moved: int = 0  # stored pictures found at a new place, their old file gone: path moved
    copies: int = 0  # stored pictures found at a further path, the first still there
    removed: int = 0  # documents removed: their last path was given up
    gone: int = 0  # stored paths given up (files deleted or moved away)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def changed_anything(self) -> bool:
        return bool(self.added or self.moved or self.copies or self.removed or self.gone or self.rejected)

    def to_json(self) -> dict:
        return {"added": self.added, "moved": self.moved, "copies": self.copies, "removed": self.removed,
                "gone": self.gone, "rejected": [{"path": p, "reason": r} for p, r in self.rejected],
                "seconds": round(self.seconds, 3)}

    def line(self) -> str:
        """One line for people: the counts, and how many were rejected (listed apart)."""
        parts = [f"added {self.added}", f"moved {self.moved}", f"removed {self.removed}"]
        if self.copies:
            parts.append(f"{self.copies} cop{'y' if self.copies == 1 else 'ies'}")
        if self.gone != self.removed:
            parts.append(f"{self.gone} path(s) given up")
        if self.rejected:
            parts.append(f"{len(self.rejected)} rejected")
        return ", ".join(parts) + f" ({self.seconds:.1f}s)"


@dataclass(frozen=True)
class Root:
    """A watched folder (resolved), or the folder of a watched file with that file's name."""

    folder: Path
    only: str | None = None

    def relative(self, path: str) -> str | None:
        """``path`` below this root, with ``/`` between names ("" for the root itself); None
        when it is not under it (or not the watched file)."""
        try:
            rel = Path(path).relative_to(self.folder)
        except ValueError:
            return None
        if self.only is not None and rel.as_posix() != self.only:
            return None
        return rel.as_posix() if rel.parts else ""


def roots_of(paths: Iterable[str | os.PathLike]) -> list[Root]:
    """The roots to watch, shallowest first; a missing path or a URI is a WatchError."""
    roots: list[Root] = []
    for given in paths:
        text = os.fspath(given)
        if is_uri(text):
            raise WatchError(f"cannot watch {text}: only local folders and files are watched")
        path = Path(text)
        if path.is_dir():
            roots.append(Root(path.resolve()))
        elif path.is_file():
            roots.append(Root(path.parent.resolve(), path.name))
        else:
            raise WatchError(f"cannot watch {path_to_text(path)}: no such file or folder")
    if not roots:
        raise WatchError("give at least one folder or file to watch")
    return sorted(set(roots), key=lambda r: (len(r.folder.parts), r.only or ""))


class EventFilter:
    """Which file-system events matter: paths under a root, outside the ``ignored`` folders
    (the index's own folder, a thumbnail cache), not left out by ``skip`` (hidden and system
    names, --exclude globs) and, for files, with a picture's suffix (temporary files such as
    ``IMG_1.jpg.part`` or ``~IMG_1.tmp`` are not)."""

    def __init__(self, roots: Sequence[Root], skip: Skip = DEFAULT_SKIP, ignored: Iterable[str | os.PathLike] = ()):
        self.roots = list(roots)
        self.skip = skip
        self.ignored = [Path(os.path.abspath(p)).resolve() for p in ignored]
        formats = Formats.here()
        self.suffixes = formats.readable | set(formats.refused)

    def _place(self, path: str) -> tuple[Root, str] | None:
        resolved = Path(path)
        if any(resolved == folder or resolved.is_relative_to(folder) for folder in self.ignored):
            return None
        for root in self.roots:  # shallowest first: the skip rules of the outermost folder
            relative = root.relative(path)
            if relative is not None:
                return root, relative
        return None

    def wanted(self, path: str, is_dir: bool) -> bool:
        """Whether a created, written or moved-in path is to be ingested (a folder: walked)."""
        placed = self._place(path)
        if placed is None:
            return False
        root, relative = placed
        if root.only is not None:
            return not is_dir  # a file given to watch is taken whatever its name, like ingest takes it
        if not relative:
            return False  # the watched folder itself
        if not is_dir and Path(relative).suffix.lower() not in self.suffixes:
            return False
        names = relative.split("/")
        for n, name in enumerate(names):
            last = n == len(names) - 1
            if self.skip.reason(_Name(name), "/".join(names[: n + 1]), is_dir or not last) is not None:
                return False
        return True

    def may_be_stored(self, path: str, is_dir: bool) -> bool:
        """Whether a path that went away may have been stored (a hidden name too: it may have
        been ingested before it was hidden, or with --include-hidden)."""
        placed = self._place(path)
        if placed is None or not placed[1]:
            return False
        return is_dir or placed[0].only is not None or Path(path).suffix.lower() in self.suffixes

    def files_in(self, folder: str) -> list[str]:
        """The pictures a walk of ``folder`` takes, with the skip rules relative to its root
        (an --exclude glob names paths below the watched folder, not below this one)."""
        placed = self._place(folder)
        if placed is None:
            return []
        problems: list[tuple[Path, str]] = []
        files = [str(p) for p in _walk(Path(folder), placed[1], set(), problems, self.skip, Skipped(), Formats.here())]
        # Formats this install refuses: given to ingest, which rejects each with its reason.
        return files + [str(p) for p, _ in problems if os.path.isfile(p)]


EventSource = Callable[[Sequence[Root], "Changes", EventFilter], Callable[[], None]]


def watchdog_source(roots: Sequence[Root], changes: Changes, events: EventFilter) -> Callable[[], None]:
    """Watch ``roots`` with watchdog's native observer (inotify, FSEvents, ReadDirectoryChangesW);
    returns what stops it. The watches are in place when this returns."""
    extras.require("watch", who="watching folders")
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            record(event.event_type, os.fsdecode(event.src_path), os.fsdecode(event.dest_path or b"") or None,
                   event.is_directory)

    def record(kind: str, source: str, dest: str | None, is_dir: bool) -> None:
        if kind in ("created", "modified", "closed"):
            if (kind != "modified" or not is_dir) and events.wanted(source, is_dir):
                changes.changed(source, is_dir)
        elif kind == "deleted":
            if events.may_be_stored(source, is_dir):
                changes.gone(source)
        elif kind == "moved":
            changes.moved(source if events.may_be_stored(source, is_dir) else None,
                          dest if dest and events.wanted(dest, is_dir) else None, is_dir)

    observer = Observer()
    handler = Handler()
    covered: list[Path] = []
    try:
        for root in roots:
            if any(root.folder == c or root.folder.is_relative_to(c) for c in covered):
                continue  # inside a folder already watched recursively
            observer.schedule(handler, str(root.folder), recursive=root.only is None)
            if root.only is None:
                covered.append(root.folder)
        observer.start()
    except OSError as exc:
        observer.stop()
        # Linux: one inotify watch per folder, up to fs.inotify.max_user_watches.
        hint = (": too many folders for the system's watch limit (raise fs.inotify.max_user_watches)"
                if exc.errno == errno.ENOSPC else f": {exc.strerror or exc}")
        raise WatchError(f"cannot watch {', '.join(path_to_text(r.folder) for r in roots)}{hint}") from None

    def stop() -> None:
        observer.stop()
        observer.join(timeout=10)

    return stop


@dataclass
class WatchOptions:
    """How batches are ingested (as ``Index.ingest`` takes them) and how long paths settle."""

    delay: float = DEFAULT_DELAY
    include_hidden: bool = False
    exclude: tuple[str, ...] = ()
    batch_size: int = 32
    workers: int = 2
    top_k: int | None = None
    max_pixels: int | None = None
    url_base: str | None = None
    metadata: str | None = None  # ingest --metadata: the user's fields, read again for every batch
    ignored: tuple[str, ...] = ()  # folders whose events never count (besides a local index's own)

    def __post_init__(self) -> None:
        if isinstance(self.delay, bool) or not isinstance(self.delay, (int, float)) or not 0 <= self.delay <= 3600:
            raise SettingsError(f"the watch delay must be between 0 and 3600 seconds, not {self.delay!r}")


class Watcher:
    """Applies the changes under ``paths`` to ``index`` in the thread that calls :meth:`run`
    (the thread that opened a local index). ``on_batch`` gets each batch that changed
    something; ``on_notice`` a line worth saying once (a backend that cannot follow
    removals); ``on_error`` the one-line error of a batch that could not be written (without
    it, that error ends :meth:`run`; with it, the watch goes on)."""

    def __init__(self, index: Index, paths: Iterable[str | os.PathLike], options: WatchOptions | None = None, *,
                 on_batch: Callable[[WatchBatch], None] | None = None,
                 on_notice: Callable[[str], None] | None = None, on_error: Callable[[str], None] | None = None,
                 source: EventSource | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.index = index
        self.options = options or WatchOptions()
        self.roots = roots_of(paths)
        own = [index._open_backend().path] if index.backend_name == "local" else []
        self.events = EventFilter(self.roots, Skip(hidden=not self.options.include_hidden,
                                                   exclude=tuple(self.options.exclude)),
                                  ignored=[*own, *self.options.ignored])
        self.changes = Changes(self.options.delay, expand=self.events.files_in, clock=clock)
        self.on_batch = on_batch
        self.on_notice = on_notice
        self.on_error = on_error
        self._source = source or watchdog_source
        self._stop_source: Callable[[], None] | None = None
        self._follows_removals = _lists_paths(index)

    def start(self) -> None:
        """Start receiving events (the watches are in place when this returns)."""
        if self._stop_source is None:
            if not self._follows_removals and self.on_notice:
                self.on_notice(f"the {self.index.backend_name} index cannot list its paths: new and changed "
                               "pictures are ingested, but deleted and moved files keep their documents")
            self._stop_source = self._source(self.roots, self.changes, self.events)

    def close(self) -> None:
        if self._stop_source is not None:
            self._stop_source()
            self._stop_source = None

    def run(self, stop: threading.Event) -> None:
        """Apply batches as they become ready until ``stop`` is set; the batch under way is
        finished first (each write is one transaction)."""
        self.start()
        try:
            while not stop.is_set():
                wait = self.changes.wait_time()
                if stop.wait(POLL_SECONDS if wait is None else min(wait + 0.01, POLL_SECONDS)):
                    break
                try:
                    self.step()
                except D2SError as exc:  # a disk full, a cluster away: said; later batches may succeed
                    if self.on_error is None:
                        raise
                    self.on_error(str(exc))
        finally:
            self.close()

    def step(self) -> WatchBatch | None:
        """Apply what is ready now, if anything; the batch when it changed something."""
        batch = self.changes.take()
        if batch is None:
            return None
        done = self.apply(batch)
        if done.changed_anything and self.on_batch:
            self.on_batch(done)
        return done if done.changed_anything else None

    def apply(self, batch: Batch) -> WatchBatch:
        start = time.perf_counter()
        done = WatchBatch()
        files = [f for f in batch.files if os.path.lexists(f)]  # gone meanwhile: its gone event follows
        o = self.options
        if files:
            try:
                report = self.index.ingest(
                    files, batch_size=o.batch_size, workers=o.workers, top_k=o.top_k, max_pixels=o.max_pixels,
                    url_base=o.url_base, url_roots=[str(r.folder) for r in self.roots], prepare_search=False,
                    metadata=o.metadata)
            except NoInputError:
                report = None  # every file went away before it was read
            if report is not None:
                done.added, done.moved, done.copies = report.stored, report.moved, report.copies
                done.rejected = list(report.rejected)
        if batch.gone and self._follows_removals:
            done.gone, done.removed = give_up(self.index._open_backend(), batch.gone)
        if done.added or done.moved or done.removed or done.gone:
            self.index.prepare_search()
        done.seconds = time.perf_counter() - start
        return done


def _lists_paths(index: Index) -> bool:
    from .backends.base import PathListing

    return isinstance(index._open_backend(), PathListing)


def give_up(backend, gone: Iterable[str]) -> tuple[int, int]:
    """Take from their documents the stored paths at or below ``gone`` (files or folders) where
    nothing is any more; a document left without a path is removed. Returns (paths given up,
    documents removed). One pass over the stored paths."""
    from .ingest import index_path

    targets = {index_path(Path(p)) for p in gone}
    below = tuple(t.rstrip("/") + "/" for t in targets)
    lost = [path for _, path in backend.document_paths()
            if (path in targets or path.startswith(below)) and not exists(path)]
    if not lost:
        return 0, 0
    return len(lost), backend.relink(gone=lost)


class Watching:
    """A watcher running in a thread of its own (``Index.watch``, ``serve --watch``): the index
    it writes through is opened in that thread by ``open_index`` (a local index is used from
    the thread that opened it) and closed when it stops. :meth:`stop` ends it."""

    def __init__(self, open_index: Callable[[], Index], paths: Iterable[str | os.PathLike],
                 options: WatchOptions | None = None, *, on_batch: Callable[[WatchBatch], None] | None = None,
                 on_notice: Callable[[str], None] | None = None, on_error: Callable[[str], None] | None = None,
                 source: EventSource | None = None, close_index: bool = True) -> None:
        self.paths = list(paths)
        roots_of(self.paths)  # a missing folder fails here, in the caller's thread
        self._open_index = open_index
        self._options = options
        self._callbacks = (on_batch, on_notice, on_error)
        self._source = source
        self._close_index = close_index
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="d2s-watch", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self.error is not None:
            self._thread.join()
            raise self.error

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        on_batch, on_notice, on_error = self._callbacks
        index = None
        try:
            index = self._open_index()
            watcher = Watcher(index, self.paths, self._options, on_batch=on_batch, on_notice=on_notice,
                              on_error=on_error, source=self._source)
            watcher.start()
        except BaseException as exc:  # said by the constructor, in the caller's thread
            self.error = exc
            self._ready.set()
            if index is not None and self._close_index:
                index.close()
            return
        self._ready.set()
        try:
            watcher.run(self._stop)
        except BaseException as exc:  # raised again by stop()
            self.error = exc
            if on_error is not None:
                on_error(f"the watch stopped: {exc}")
        finally:
            if self._close_index:
                index.close()

    def stop(self, timeout: float | None = 60) -> None:
        """Stop watching (the batch under way is finished first); an error that ended the
        watch is raised here."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def __enter__(self) -> Watching:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
