"""The local index's metadata: one ``metadata`` row per document that has any (date taken,
camera, GPS, the user's fields as JSON), and the user's field types in ``meta``.

Like ``copies`` (:mod:`.paths`), the table is made by the first write that needs it, so an
index made before metadata existed reads as having none until its next ingest. A change of
metadata alone does not touch the vectors: it bumps ``metadata_version`` in ``meta`` (not the
generation the search cache is keyed by), which the filter columns (:mod:`.narrowing`) follow.
Everything read back is untrusted: malformed values are read as missing.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Mapping

from ...errors import MetadataError
from ...metadata import FIELD_TYPES, Metadata, fields_from_json, is_field_name

_MADE = ("CREATE TABLE IF NOT EXISTS metadata (id TEXT PRIMARY KEY, taken_at REAL, camera TEXT, lat REAL, "
         "lon REAL, fields TEXT)",)
CHUNK = 500


def make(db: sqlite3.Connection) -> None:
    """Inside a write transaction: the table (a no-op once made)."""
    for statement in _MADE:
        db.execute(statement)


def has_table(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'metadata'").fetchone() is not None


def row_of(doc_id: str, m: Metadata) -> tuple:
    lat, lon = m.location if m.location else (None, None)
    return (doc_id, m.taken_at, m.camera, lat, lon,
            json.dumps(dict(m.fields), ensure_ascii=False, allow_nan=False) if m.fields else None)


def write(db: sqlite3.Connection, metadata: Mapping[str, Metadata]) -> None:
    """Inside a write transaction: these documents' metadata become exactly these."""
    make(db)
    ids = list(metadata)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        db.execute(f"DELETE FROM metadata WHERE id IN ({','.join('?' * len(chunk))})", chunk)
    db.executemany("INSERT INTO metadata VALUES (?,?,?,?,?,?)",
                   [row_of(doc_id, m) for doc_id, m in metadata.items() if m])
    bump_version(db)


def bump_version(db: sqlite3.Connection) -> None:
    db.execute("INSERT OR IGNORE INTO meta VALUES ('metadata_version', '0')")
    db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'metadata_version'")


def version(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM meta WHERE key = 'metadata_version'").fetchone()
    try:
        return int(row[0]) if row else 0
    except (TypeError, ValueError):
        return 0


def forget(db: sqlite3.Connection, ids: Iterable[str]) -> None:
    if not has_table(db):
        return
    ids = list(ids)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        db.execute(f"DELETE FROM metadata WHERE id IN ({','.join('?' * len(chunk))})", chunk)


def from_row(taken, camera, lat, lon, fields) -> Metadata:
    """A stored row as Metadata; what is malformed is left out."""
    taken = float(taken) if isinstance(taken, (int, float)) and math.isfinite(taken) else None
    camera = camera if isinstance(camera, str) and camera else None
    location = None
    if isinstance(lat, (int, float)) and isinstance(lon, (int, float)) and -90 <= lat <= 90 and -180 <= lon <= 180:
        location = (float(lat), float(lon))
    parsed = {}
    if isinstance(fields, str):
        try:
            parsed = fields_from_json(json.loads(fields))
        except ValueError:
            parsed = {}
    return Metadata(taken_at=taken, camera=camera, location=location, fields=parsed)


def read(db: sqlite3.Connection, ids: Iterable[str]) -> dict[str, Metadata]:
    if not has_table(db):
        return {}
    ids = list(ids)
    found = {}
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        for doc_id, *values in db.execute(
            f"SELECT id, taken_at, camera, lat, lon, fields FROM metadata WHERE id IN ({','.join('?' * len(chunk))})",
            chunk,
        ):
            found[doc_id] = from_row(*values)
    return found


def field_types(db: sqlite3.Connection) -> dict[str, str]:
    """The user's fields (name -> type) as recorded; malformed entries are left out."""
    row = db.execute("SELECT value FROM meta WHERE key = 'field_types'").fetchone()
    try:
        recorded = json.loads(row[0]) if row else {}
    except (TypeError, ValueError):
        return {}
    if not isinstance(recorded, dict):
        return {}
    return {n: t for n, t in recorded.items() if is_field_name(n) and t in FIELD_TYPES}


def declare(db: sqlite3.Connection, types: Mapping[str, str]) -> bool:
    """Inside a write transaction: record new fields; MetadataError when one is recorded with
    another type. Whether anything was added."""
    known = field_types(db)
    for name, kind in types.items():
        if name in known and known[name] != kind:
            raise MetadataError(f"field {name!r} is {known[name]} in this index, not {kind}: rename the column, "
                                f"or declare it as {name}:{known[name]}")
    added = {n: t for n, t in types.items() if n not in known}
    if added:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('field_types', ?)",
                   (json.dumps({**known, **added}, sort_keys=True),))
    return bool(added)
