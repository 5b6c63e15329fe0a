"""``index check``: integrity of the local index's database and cache, and repair.

The check reports everything a command could trip over: SQLite's own structure, tables that
are gone, an identity (``meta``) that is damaged or missing, documents whose stored vectors
cannot be searched (what a search warns about), and a cache that does not match its
checksums or the database.

Repair rewrites a database SQLite finds damaged (or that lost tables) from what it can still
read, restores the identity from what survives (:mod:`.identity`), removes the documents
whose vectors are damaged (their files can be ingested again), and rebuilds what is derived
(the cache). Every document that is lost is named, by its path when the cache still knows it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass, field

from ...errors import D2SError, IndexStoreError
from . import cache as cache_mod
from . import identity, store
from .cache import CacheUnusable, Structures

ROWS_AT_ONCE = 4096


@dataclass
class Findings:
    """What the look at the database found (it writes nothing)."""

    problems: list[str] = field(default_factory=list)
    needs_rewrite: bool = False  # SQLite finds it damaged, or tables are gone
    meta: dict[str, str] = field(default_factory=dict)
    plan: identity.Plan | None = None
    damaged_rows: list[tuple[int, str]] = field(default_factory=list)  # (seq, path)
    max_seq: int | None = None


def check(backend, repair: bool = False) -> dict:  # backend: a LocalBackend
    """Integrity of SQLite and of the cache. With ``repair``: rewrite what is damaged from what
    survives, and report the documents that are lost."""
    report: dict = {"location": str(backend.path), "database": [], "cache": [], "lost_documents": [],
                    "repaired": False}
    backend.close()
    structures = _load_cache(backend, report)
    verified = structures is not None and not report["cache"]
    found = _inspect(backend, structures)
    report["database"] = found.problems
    if structures is not None and not found.needs_rewrite:
        _compare_cache(structures, found, report)
    if not repair:
        return report
    return _repair(backend, found, structures if verified else None, _cached_identity(structures), report)


def _load_cache(backend, report: dict) -> Structures | None:
    """The cache as it is (its header checksummed), its bytes verified against the checksums
    written with it (problems in the report)."""
    try:
        structures = cache_mod.load(backend.cache_dir, verify=False)  # verify_all below reads every byte
    except CacheUnusable as exc:
        if str(exc) != "no cache yet":  # none yet is fine: the first search writes it
            report["cache"].append(str(exc))
        return None
    report["cache"] = cache_mod.verify_all(structures)
    return structures


def _inspect(backend, structures: Structures | None) -> Findings:
    found = Findings()
    try:
        db = store.open_as_found(backend.db_path)
    except sqlite3.DatabaseError as exc:
        found.problems.append(f"{backend.db_path} cannot be opened: {exc}")
        found.needs_rewrite = True
        return found
    try:
        structure = store.quick_check(db)
        if structure:
            found.problems.append(store.damaged(backend.db_path, sqlite3.DatabaseError(structure[0])).args[0])
            found.problems.extend(structure[1:])
            found.needs_rewrite = True
        try:
            missing = store.missing_tables(db)
        except sqlite3.DatabaseError:
            missing = []
        if missing:
            found.problems.append(store.tables_lost(backend.path, missing).args[0])
            found.needs_rewrite = True
        if "meta" not in missing:
            with contextlib.suppress(sqlite3.DatabaseError):  # said by quick_check
                found.meta = dict(db.execute("SELECT key, value FROM meta"))
        if found.needs_rewrite:
            return found  # the rest is looked at in the rewritten database
        dims = identity.row_dims(db)
        (documents,) = db.execute("SELECT COUNT(*) FROM docs").fetchone()
        found.plan = identity.plan(found.meta, store.read_manifest(backend.path), dims,
                                   _cached_identity(structures), documents)
        found.problems.extend(found.plan.problems)
        found.max_seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM docs").fetchone()[0]
        if found.plan.dense_dim is not None and not found.plan.unresolved and not _contradicted(found.plan):
            found.damaged_rows = damaged_rows(db, found.plan.dense_dim)
        if found.damaged_rows:
            found.problems.append(_damaged_line(backend, found.damaged_rows))
    except sqlite3.DatabaseError as exc:
        found.problems.append(store.damaged(backend.db_path, exc).args[0])
        found.needs_rewrite = True
    finally:
        db.close()
    return found


def _contradicted(change: identity.Plan) -> bool:
    """The recorded bundle disagrees with the documents: no row is called damaged for that."""
    return any("recorded bundle makes" in p for p in change.problems)


def _damaged_line(backend, rows: list[tuple[int, str]]) -> str:
    shown = ", ".join(f"seq {seq} ({path})" for seq, path in rows[:3]) + (" …" if len(rows) > 3 else "")
    return (f"{len(rows)} document(s) have damaged stored vectors and cannot be searched: {shown}; "
            f"`d2s-search index check --index {backend.path} --repair` removes them, and ingesting their files again "
            "restores them")


def damaged_rows(db: sqlite3.Connection, dim: int) -> list[tuple[int, str]]:
    """(seq, path) of the documents a search leaves out: vectors of another size, term ids
    outside the vocabulary (the same test as the cache build, :func:`.cache.parse_rows`)."""
    n_cols = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM terms").fetchone()[0]
    out: list[tuple[int, str]] = []
    cursor = db.execute("SELECT seq, id, path, url, term_ids, weights, dense FROM docs ORDER BY seq")
    while batch := cursor.fetchmany(ROWS_AT_ONCE):
        _, bad = cache_mod.parse_rows(batch, n_cols, dim)
        if bad:
            paths = {row[0]: row[2] for row in batch}
            out.extend((seq, str(paths[seq])) for seq in bad)
    return out


def _cached_identity(structures: Structures | None) -> identity.Cached | None:
    if structures is None:
        return None
    return identity.Cached(structures.index_id, structures.generation, structures.mutations, structures.dim)


def _compare_cache(structures: Structures, found: Findings, report: dict) -> None:
    meta = found.meta
    generation = identity.count(meta.get("generation", "0"))
    if "index_id" in meta and structures.index_id != meta["index_id"]:
        report["cache"].append("the cache belongs to another index")
    elif generation is not None and structures.generation != generation:
        report["cache"].append("the cache is older than the database (it is brought up to date on the next search)")
    elif found.max_seq is not None and found.max_seq != structures.max_seq:
        report["cache"].append("the cache holds other documents than the database at the same generation "
                               "(the database was changed by another program)")


def _repair(backend, found: Findings, structures: Structures | None, cached: identity.Cached | None,
            report: dict) -> dict:
    """``structures``: the old cache when every byte verified (the record of lost documents);
    ``cached``: what its checksummed header says (for the identity)."""
    lost: dict[int, str] = {}
    if found.needs_rewrite:
        outcome = _repair_database(backend)
        if outcome is None:
            report["database_repair"] = ("the database could not be read at all: delete the index "
                                         f"(`d2s-search index delete --index {backend.path}`) and ingest again")
            return report
        report["database_repair"], unreadable, lost_tables = outcome
        lost.update({seq: "" for seq in unreadable})
        report["lost_parts"] = [t for t in lost_tables if "meta" not in t]  # the identity is said below
    try:
        db = backend._connect(False)
        meta = backend._meta(checked=False)
        documents = db.execute("SELECT COUNT(*) FROM docs").fetchone()[0]
        change = identity.plan(meta, store.read_manifest(backend.path), identity.row_dims(db), cached, documents)
        if change.changes:
            with store.Transaction(db):
                identity.apply(db, change)
        report["identity_repair"] = change.restored
        report["unresolved"] = change.unresolved
        if change.dense_dim is not None and not change.unresolved and not _contradicted(change):
            removed = _remove_damaged(db, damaged_rows(db, change.dense_dim))
            lost.update(removed)
        index_id = change.set.get("index_id", meta.get("index_id"))
        lost.update(_only_in_cache(db, structures, index_id, found))
        backend.open(None, create=False)
        built, _ = backend._rebuild()
        report["documents"] = built.size
        report["repaired"] = True
    except sqlite3.DatabaseError as exc:
        report["database"].append(f"could not read the documents back: {exc}")
    except D2SError as exc:
        report["database"].append(str(exc))
    report["lost_documents"] = [f"seq {seq}" + (f" ({path})" if path else "") for seq, path in sorted(lost.items())]
    return report


def _remove_damaged(db: sqlite3.Connection, rows: list[tuple[int, str]]) -> dict[int, str]:
    """Delete the documents whose vectors cannot be searched: named as lost, their files can
    be ingested again (a document kept would make ingest skip them as already stored)."""
    if not rows:
        return {}
    with store.Transaction(db):
        db.executemany("DELETE FROM docs WHERE seq = ?", [(seq,) for seq, _ in rows])
        store.bump(db, mutation=True)
    return dict(rows)


def _only_in_cache(db: sqlite3.Connection, structures: Structures | None, index_id: str | None,
                   found: Findings) -> dict[int, str]:
    """seq -> path of the documents the old cache holds that the database no longer has: the
    cache is the last record of what a lost table or page held. Used only when it verified,
    belongs to this index and is not older than the database was (when that is known)."""
    if structures is None or structures.index_id != index_id:
        return {}
    old_generation = identity.count(found.meta.get("generation"))
    if old_generation is not None and old_generation != structures.generation:
        return {}
    try:
        present = {seq for (seq,) in db.execute("SELECT seq FROM docs")}
        out = {}
        for shard in structures.shards:
            seqs = shard.arrays["seqs"]
            for row in [i for i, seq in enumerate(seqs.tolist()) if seq not in present]:
                out[int(seqs[row])] = shard.string("paths", row)
        return out
    except (CacheUnusable, OSError, ValueError, IndexError):
        return {}


def _repair_database(backend) -> tuple[str, list[int], list[str]] | None:
    """Rewrite the database from what SQLite can still read: meta, terms and every
    document row readable by its rowid, into a new file that replaces the old one. None when
    nothing at all can be read."""
    backend.close()
    tmp = backend.path / f".tmp-{os.getpid()}-repair-{store.DB_NAME}"
    tmp.unlink(missing_ok=True)
    try:
        db = store.open_as_found(backend.db_path)
    except sqlite3.DatabaseError:
        return None
    try:
        salvaged, unreadable, lost_tables = store.salvage(db, tmp)
    except IndexStoreError:
        salvaged = None
    finally:
        db.close()
    if salvaged is None:
        tmp.unlink(missing_ok=True)
        return None
    for suffix in ("-wal", "-shm"):
        (backend.path / f"{store.DB_NAME}{suffix}").unlink(missing_ok=True)
    os.replace(tmp, backend.db_path)
    store.fsync_dir(backend.path)
    backend._write_checked = False
    backend._terms, backend._term_ids = [""], {}
    parts = [f"{len(unreadable)} unreadable: {', '.join(unreadable[:5])}"] if unreadable else []
    parts += [f"lost {t}" for t in lost_tables]
    lost = f"; {'; '.join(parts)}" if parts else ""
    seqs = [int(u.split()[1]) for u in unreadable]
    return f"the database was rewritten from its readable pages ({salvaged} documents kept{lost})", seqs, lost_tables
