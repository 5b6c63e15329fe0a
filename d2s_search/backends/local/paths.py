"""The paths of the local index's documents: ``docs.path`` is the one a hit shows, the
``copies`` table holds the others (the same bytes found at further places).

The table and the two lookup indexes are made by the first write that needs them (inside its
transaction), so an index made before copies existed gains them on its next ingest and reads
as having none until then. A path belongs to one document at most (see
:func:`d2s_search.backends.base.relinked`); ``copies.path`` is unique, ``docs.path`` is kept
so by the writers.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence

from ..base import relinked

_MADE = (
    "CREATE TABLE IF NOT EXISTS copies (path TEXT PRIMARY KEY, id TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS copies_id ON copies(id)",
    # Which document holds a path, asked for every batch an ingest writes.
    "CREATE INDEX IF NOT EXISTS docs_path ON docs(path)",
)
CHUNK = 500  # host parameters per statement (SQLite allows 999 in old builds)


def make(db: sqlite3.Connection) -> None:
    """Inside a write transaction: the copies table and the indexes (no-ops once made)."""
    for statement in _MADE:
        db.execute(statement)


def has_copies(db: sqlite3.Connection) -> bool:
    return (
        db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'copies'"
        ).fetchone()
        is not None
    )


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def paths_of(db: sqlite3.Connection, ids: Iterable[str]) -> dict[str, list[str]]:
    """id -> every path of the stored ones among ``ids``, the shown one first."""
    ids = list(dict.fromkeys(ids))
    found: dict[str, list[str]] = {}
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        for doc_id, path in db.execute(f"SELECT id, path FROM docs WHERE id IN ({marks})", chunk):
            found[doc_id] = [path]
    if found and has_copies(db):
        for chunk in _chunks(list(found)):
            marks = ",".join("?" * len(chunk))
            for doc_id, path in db.execute(
                f"SELECT id, path FROM copies WHERE id IN ({marks}) ORDER BY rowid", chunk
            ):
                found[doc_id].append(path)
    return found


def every_path(db: sqlite3.Connection) -> list[tuple[str, str]]:
    """(id, path) of every stored path, in ingest order, each document's shown path first."""
    shown = db.execute("SELECT id, path FROM docs ORDER BY seq").fetchall()
    if not has_copies(db):
        return shown
    more: dict[str, list[str]] = {}
    for doc_id, path in db.execute("SELECT id, path FROM copies ORDER BY rowid"):
        more.setdefault(doc_id, []).append(path)
    if not more:
        return shown
    return [
        pair
        for doc_id, path in shown
        for pair in [(doc_id, path)] + [(doc_id, p) for p in more.get(doc_id, ())]
    ]


def holders(db: sqlite3.Connection, paths: Iterable[str]) -> set[str]:
    """Ids of the documents that hold any of ``paths``."""
    paths = list(dict.fromkeys(paths))
    copies = has_copies(db)
    ids: set[str] = set()
    for chunk in _chunks(paths):
        marks = ",".join("?" * len(chunk))
        ids.update(r[0] for r in db.execute(f"SELECT id FROM docs WHERE path IN ({marks})", chunk))
        if copies:
            ids.update(
                r[0] for r in db.execute(f"SELECT id FROM copies WHERE path IN ({marks})", chunk)
            )
    return ids


def relink(
    db: sqlite3.Connection,
    found: Mapping[str, str],
    gone: Iterable[str] = (),
    keep: Iterable[str] = (),
) -> tuple[int, bool]:
    """Inside a write transaction (after :func:`make`): give each path of ``found`` to its
    document, take those of ``gone`` from theirs (``relinked``), leaving the documents in
    ``keep`` as they are. Returns (documents removed, whether any ``docs`` row changed)."""
    gone = list(gone)
    current = paths_of(db, holders(db, [*found, *gone]) | set(found.values()))
    keep = set(keep)
    changed = {
        doc_id: new for doc_id, new in relinked(current, found, gone).items() if doc_id not in keep
    }
    return apply(db, current, changed)


def apply(
    db: sqlite3.Connection,
    current: Mapping[str, Sequence[str]],
    changed: Mapping[str, Sequence[str]],
) -> tuple[int, bool]:
    """Write ``changed`` (id -> new paths, [] to remove the document); (removed, docs changed)."""
    removed, rows_changed = 0, False
    ids = list(changed)
    for chunk in _chunks(ids):  # first free every path that moves (copies.path is unique)
        db.execute(f"DELETE FROM copies WHERE id IN ({','.join('?' * len(chunk))})", chunk)
    for doc_id, new in changed.items():
        if not new:
            removed += db.execute("DELETE FROM docs WHERE id = ?", (doc_id,)).rowcount
            rows_changed = True
            continue
        if new[0] != current[doc_id][0]:
            db.execute("UPDATE docs SET path = ? WHERE id = ?", (new[0], doc_id))
            rows_changed = True
        db.executemany(
            "INSERT OR REPLACE INTO copies(path, id) VALUES (?, ?)", [(p, doc_id) for p in new[1:]]
        )
    return removed, rows_changed


def set_copies(db: sqlite3.Connection, copies: Mapping[str, Sequence[str]]) -> None:
    """Inside a write transaction: the copies of these documents become exactly these."""
    ids = list(copies)
    for chunk in _chunks(ids):
        db.execute(f"DELETE FROM copies WHERE id IN ({','.join('?' * len(chunk))})", chunk)
    db.executemany(
        "INSERT OR REPLACE INTO copies(path, id) VALUES (?, ?)",
        [(p, doc_id) for doc_id, paths in copies.items() for p in paths],
    )


def forget(db: sqlite3.Connection, ids: Sequence[str]) -> None:
    """Inside a write transaction: the copies of removed documents."""
    if has_copies(db):
        for chunk in _chunks(ids):
            db.execute(f"DELETE FROM copies WHERE id IN ({','.join('?' * len(chunk))})", chunk)
