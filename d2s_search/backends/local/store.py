"""The durable side of the local index: SQLite (WAL), its identity and the files it owns.

``index.sqlite`` is the source of truth. Its ``meta`` table carries the index identity the
derived cache must match: ``index_id`` (random, written once at creation) and
``generation`` (bumped in the same transaction as every change). ``mutations`` counts the
changes that were not pure appends (a cache can be extended across appends only).

The folder may hold other things (an index made inside a photo folder): the index owns
exactly the names in :data:`OWNED_NAMES`, listed in the manifest ``d2s-index.json`` written
at creation, and deletes nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

from ...errors import DiskFullError, IndexStoreError
from ...regular_files import NotRegularFile, open_regular

FORMAT = "d2s-local/1"
DB_NAME = "index.sqlite"
MANIFEST_NAME = "d2s-index.json"
CACHE_DIR = "cache"
CACHE_POINTER = "current"  # cache/current names the cache state in use
# Everything the index may create in its folder (SQLite adds -wal/-shm/-journal beside the db).
OWNED_NAMES = (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", f"{DB_NAME}-journal", MANIFEST_NAME, CACHE_DIR)
# The page size of a new database (SQLite's default is 4 KB). A document's row is about 2 KB
# (term ids, weights, a 256-dimension vector): past the ~1 KB a 4 KB page keeps of a row, the
# rest went to an overflow page of its own, mostly empty (docs/design-decisions.md). An existing
# database keeps the page size it was made with.
PAGE_SIZE = 16384

TABLES = ("meta", "terms", "docs")
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS terms (id INTEGER PRIMARY KEY, term TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS docs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    path TEXT NOT NULL,
    url TEXT,
    size_bytes INTEGER NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    ingested_at REAL NOT NULL,
    term_ids BLOB NOT NULL,
    weights BLOB NOT NULL,
    dense BLOB NOT NULL
);
"""


def damaged(db_path: Path, exc: Exception) -> IndexStoreError:
    """The one-line error for a database SQLite cannot read."""
    return IndexStoreError(
        f"{db_path} is damaged ({exc}): run `d2s-search index check --index {db_path.parent} --repair`, "
        "or delete the index and ingest again"
    )


def is_disk_full(exc: BaseException) -> bool:
    """A write refused for want of space (SQLite's SQLITE_FULL, or ENOSPC/EDQUOT from the system)."""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def failure(db_path: Path, exc: sqlite3.Error) -> IndexStoreError:
    """The one-line error for a database operation that failed: a full disk says so (the
    database is intact: SQLite undid the write), anything else is damage."""
    if is_disk_full(exc):
        return DiskFullError(str(db_path), free_bytes(db_path.parent))
    return damaged(db_path, exc)


class MissingTables(IndexStoreError):
    """An existing database lacks tables every index has (dropped, or the file was emptied)."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(", ".join(missing))
        self.missing = missing


def tables_lost(folder: Path, missing: list[str]) -> IndexStoreError:
    """The one-line error for an index whose database lost tables: never started afresh."""
    db_path = folder / DB_NAME
    if len(missing) == len(TABLES):
        what = f"{db_path} holds no index any more (emptied or replaced), though {folder} held one ({MANIFEST_NAME})"
    else:
        what = f"{db_path} has lost its {' and '.join(missing)} table{'s' if len(missing) > 1 else ''}"
    return IndexStoreError(
        f"{what}; nothing was written: run `d2s-search index check --index {folder} --repair` to make it usable "
        f"again (it says what is lost), or `d2s-search index delete --index {folder}` and ingest again"
    )


def missing_tables(db: sqlite3.Connection) -> list[str]:
    present = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return [t for t in TABLES if t not in present]


def open_as_found(db_path: Path) -> sqlite3.Connection:
    """A connection that writes nothing on its own (no journal mode set, no schema made): for
    looking at a database that may be damaged."""
    return sqlite3.connect(str(db_path), isolation_level=None, timeout=30)


def connect(db_path: Path, schema: bool = True) -> sqlite3.Connection:
    """A connection in WAL mode. ``schema``: make the tables (a new database, with pages of
    :data:`PAGE_SIZE`); otherwise they are checked first, and MissingTables raised before
    anything is written."""
    try:
        db = sqlite3.connect(str(db_path), isolation_level=None, timeout=30)
    except sqlite3.DatabaseError as exc:
        raise IndexStoreError(f"{db_path} is not a usable index: {exc}") from None
    try:
        if not schema:
            missing = missing_tables(db)
            if missing:
                raise MissingTables(missing)
        else:  # before anything is written: WAL mode fixes the page size of a new file
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # no effect on a database that has pages
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        if schema:
            db.executescript(SCHEMA)
    except MissingTables:
        db.close()
        raise
    except sqlite3.DatabaseError as exc:
        db.close()
        if is_disk_full(exc):
            raise DiskFullError(str(db_path), free_bytes(db_path.parent)) from None
        raise IndexStoreError(f"{db_path} is not a usable index: {exc}") from None
    return db


class CommitSignal:
    """Whether any connection may have committed since a moment, read without SQLite: the
    WAL-index header at the start of ``<db>-shm`` (WAL mode). SQLite rewrites it with every
    commit of any connection (``iChange`` counts them), the second of its two copies first,
    then a barrier, then the first, and its own readers trust the header only when both
    copies agree (sqlite/sqlite ``src/wal.c``: ``walIndexWriteHdr``, ``walIndexTryHdr``).
    Unchanged bytes therefore mean no commit since they were read; anything else (copies
    that differ, no file yet, a read error) is answered with None, and the caller asks SQLite.
    Cold, one ``pread`` takes 0.02 ms where ``PRAGMA data_version`` takes 0.09; once mapped (:meth:`map_when_held`), no system call at
    all. Close it before the connection whose file it reads."""

    HEADER = 48  # sizeof(WalIndexHdr); the two copies lie back to back

    def __init__(self, db_path: Path) -> None:
        self.path = Path(f"{db_path}-shm")
        self._fd: int | None = None
        self._refused = False  # the path holds something other than a regular file
        self._may_map = False
        self._map = None

    def map_when_held(self) -> None:
        """Read the header through a memory map from the next read on: to be called once the
        connection this signal belongs to has read the database, so holds the WAL index open.
        A mapped file truncated under the map would kill the process (SIGBUS) where ``pread``
        returns short. SQLite truncates the -shm only when no connection anywhere holds it open
        (the DMS lock: sqlite/sqlite ``src/os_unix.c``, ``unixLockSharedMemory``), and maps it
        itself, so only a foreign program truncating it could, and would stop every SQLite
        reader of the index alike."""
        self._may_map = True

    def read(self) -> bytes | None:
        data = self._map[: 2 * self.HEADER] if self._map is not None else self._read_file()
        if data is None or len(data) < 2 * self.HEADER or data[: self.HEADER] != data[self.HEADER :]:
            return None  # being written, or not a WAL index
        if self._map is None and self._may_map:
            import mmap  # built in: no cost

            try:
                self._map = mmap.mmap(self._fd, 2 * self.HEADER, prot=mmap.PROT_READ)
            except (OSError, ValueError):
                self._may_map = False  # pread then
        return data[: self.HEADER]

    def _read_file(self) -> bytes | None:
        """Both copies of the header by ``pread`` (the file opened on first use), or None."""
        if self._fd is None:
            if self._refused or not hasattr(os, "pread"):  # no pread (Windows): SQLite is asked
                return None
            try:
                with open_regular(self.path) as fh:  # the checks; the descriptor is kept
                    self._fd = os.dup(fh.fileno())
            except NotRegularFile:
                self._refused = True
                return None
            except OSError:  # not there yet (no reader has opened the WAL), or unreadable
                return None
        try:
            return os.pread(self._fd, 2 * self.HEADER, 0)
        except OSError:
            return None

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def quick_check(db: sqlite3.Connection) -> list[str]:
    """SQLite's own structural check; [] when the database is sound."""
    try:
        rows = [r[0] for r in db.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    return [] if rows == ["ok"] else rows


def salvage(db: sqlite3.Connection, target: Path) -> tuple[int | None, list[str], list[str]]:
    """Copy every readable row of a damaged database into a new one at ``target``.

    Documents are read one rowid at a time, so a damaged page loses only its own rows.
    Returns (documents copied, the seq numbers of documents that could not be read, the
    tables lost in part or whole); (None, [reason], []) when nothing can be read.
    """
    try:
        present = set(TABLES) - set(missing_tables(db))
        max_seq = 0
        if "docs" in present:
            top = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'docs'").fetchone()
            max_seq = int(top[0]) if top else int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM docs").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        return None, [str(exc)], []
    new = connect(target)
    copied, unreadable, lost_tables = 0, [], [f"the {t} table" for t in TABLES if t not in present]
    with Transaction(new):
        for table, columns in (("meta", "key, value"), ("terms", "id, term")):
            if table not in present:
                continue
            try:
                new.executemany(f"INSERT OR IGNORE INTO {table} VALUES (?, ?)",
                                db.execute(f"SELECT {columns} FROM {table}").fetchall())
            except sqlite3.DatabaseError:
                lost_tables.append(f"part of the {table} table")
        bump(new, mutation=True)
        columns = "seq, id, path, url, size_bytes, width, height, ingested_at, term_ids, weights, dense"
        for seq in range(1, max_seq + 1):
            try:
                row = db.execute(f"SELECT {columns} FROM docs WHERE seq = ?", (seq,)).fetchone()
            except sqlite3.DatabaseError:
                unreadable.append(f"seq {seq}")
                continue
            if row is not None:
                new.execute(f"INSERT INTO docs({columns}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
                copied += 1
        new.execute("INSERT OR REPLACE INTO sqlite_sequence(name, seq) VALUES ('docs', ?)", (max_seq,))
        lost_tables += _salvage_optional(db, new)
    new.close()
    return copied, unreadable, lost_tables


def _salvage_optional(db: sqlite3.Connection, new: sqlite3.Connection) -> list[str]:
    """Inside the new database's transaction: the tables a first write makes (copies of
    documents, metadata), whatever of them can be read; the names of those lost in part."""
    from . import metadata_table
    from . import paths as doc_paths

    lost = []
    present = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table, make, columns in (("copies", doc_paths.make, "path, id"),
                                 ("metadata", metadata_table.make, "id, taken_at, camera, lat, lon, fields")):
        if table not in present:
            continue
        make(new)
        try:
            rows = db.execute(f"SELECT {columns} FROM {table}").fetchall()
        except sqlite3.DatabaseError:
            lost.append(f"the {table} table")
            continue
        marks = ",".join("?" * len(columns.split(",")))
        new.executemany(f"INSERT OR IGNORE INTO {table}({columns}) VALUES ({marks})", rows)
    return lost


def new_identity_rows() -> list[tuple[str, str]]:
    return [("index_id", uuid.uuid4().hex), ("generation", "0"), ("mutations", "0")]


def bump(db: sqlite3.Connection, *, mutation: bool) -> None:
    """Inside a write transaction: a new generation (and a mutation when rows changed in place)."""
    db.execute("INSERT OR IGNORE INTO meta VALUES ('generation', '0')")
    db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")
    if mutation:
        db.execute("INSERT OR IGNORE INTO meta VALUES ('mutations', '0')")
        db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'mutations'")


class Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (including KeyboardInterrupt);
    ``undone`` is then called (to forget what the transaction had made known in memory)."""

    def __init__(self, db: sqlite3.Connection, undone: Callable[[], None] | None = None) -> None:
        self.db = db
        self.undone = undone

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except sqlite3.Error:
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        """Undo what is still open: SQLite has already undone the transaction after some errors
        (a full disk), and a ROLLBACK then would hide the error that counts."""
        if self.db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
        if self.undone is not None:
            self.undone()


# -- the files the index owns ---------------------------------------------------------------


def write_manifest(folder: Path, index_id: str, created_folder: bool, bundle: dict | None = None) -> None:
    """The manifest: what the index owns, and a copy of its identity (index id; the bundle that
    fills it, once recorded), from which a repair restores a damaged ``meta`` table."""
    body = {"format": FORMAT, "index_id": index_id, "created_folder": created_folder, "owns": list(OWNED_NAMES)}
    if bundle is not None:
        body["bundle"] = bundle
    write_atomic(folder / MANIFEST_NAME, json.dumps(body, indent=1).encode())


def read_manifest(folder: Path) -> dict:
    try:
        body = json.loads((folder / MANIFEST_NAME).read_text())
        return body if isinstance(body, dict) else {}
    except (OSError, ValueError):
        return {}


def foreign_entries(folder: Path) -> list[str]:
    """Names in the index folder (and its cache folder) the index did not create."""
    foreign = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name not in OWNED_NAMES and not is_temp_name(entry.name):
            foreign.append(entry.name)
        elif entry.is_symlink():
            foreign.append(f"{entry.name} (a symbolic link)")
    cache = folder / CACHE_DIR
    if cache.is_dir() and not cache.is_symlink():
        foreign.extend(f"{CACHE_DIR}/{e.name}" for e in sorted(os.scandir(cache), key=lambda e: e.name)
                       if not is_cache_entry(e.name))
    return foreign


LEGACY_CACHE = "search-state.npz"  # the single-file cache of d2s-local/1 before shards


def is_cache_entry(name: str) -> bool:
    """A name in cache/ written by this package, now or by the first version (a
    ``search-state.npz`` and its ``.<pid>.tmp.npz`` temps); anything else is left alone."""
    legacy_temp = name.startswith(".") and name.endswith(".tmp.npz") and name[1:-8].isdigit()
    return name in (CACHE_POINTER, LEGACY_CACHE) or name.startswith("state-") or is_temp_name(name) or legacy_temp


# Temp names this process is writing now: another writer in the same process (a second index
# handle, a watcher's thread) must not take them for a crashed write's leftovers.
_WRITING: set[str] = set()


@contextlib.contextmanager
def writing(name: str):
    """Mark the temp file or folder ``name`` as being written by this process until the block ends."""
    _WRITING.add(name)
    try:
        yield
    finally:
        _WRITING.discard(name)


def being_written(name: str) -> bool:
    """Whether this process is writing the temp file or folder ``name`` now (see :func:`writing`)."""
    return name in _WRITING


def is_temp_name(name: str) -> bool:
    """A temp file name this package writes: ``.tmp-<pid>-...``."""
    parts = name.split("-", 2)
    return len(parts) == 3 and parts[0] == ".tmp" and parts[1].isdigit()


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename over ``path``, fsync the folder: all or nothing after a crash."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")
    with writing(tmp.name):
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    fsync_dir(path.parent)
