"""``index check``: integrity of the local index's database and cache, and repair.

Repair rebuilds only what is derived (the cache, from SQLite) and, for a database SQLite
finds damaged, rewrites it from the rows it can still read; what cannot be read is named.
"""

from __future__ import annotations

import os
import sqlite3

from ...errors import IndexStoreError
from . import cache as cache_mod
from . import store
from .cache import CacheUnusable


def check(backend, repair: bool = False) -> dict:  # backend: a LocalBackend
    """Integrity of SQLite and of the cache. With ``repair``: rebuild what is derived
    (the cache) from SQLite and report the documents whose stored vectors are lost."""
    report: dict = {"location": str(backend.path), "database": [], "cache": [], "lost_documents": [], "repaired": False}
    try:
        db = backend._connect(False)
    except IndexStoreError as exc:
        report["database"].append(str(exc))
        return report
    report["database"] = store.quick_check(db)
    if report["database"]:
        report["database"] = [store.damaged(backend.db_path, sqlite3.DatabaseError(p)).args[0] for p in report["database"][:1]] + report["database"][1:]
    try:
        structures = cache_mod.load(backend.cache_dir, verify=False)  # verify_all reads every byte
        report["cache"] = cache_mod.verify_all(structures)
        meta = backend._meta()
        if structures.index_id != meta.get("index_id"):
            report["cache"].append("the cache belongs to another index")
        elif structures.generation != int(meta.get("generation", "0")):
            report["cache"].append("the cache is older than the database (it is brought up to date on the next search)")
    except CacheUnusable as exc:
        if str(exc) != "no cache yet":  # none yet is fine: the first search writes it
            report["cache"].append(str(exc))
    except sqlite3.DatabaseError:
        pass
    if repair:
        unreadable: list[str] = []
        if report["database"]:
            report["database_repair"], unreadable = _repair_database(backend)
        try:
            built, lost = backend._rebuild()
            report["lost_documents"] = unreadable + [f"seq {seq}" for seq in lost]
            report["documents"] = built.size
            report["repaired"] = True
        except sqlite3.DatabaseError as exc:
            report["database"].append(f"could not read the documents back: {exc}")
    return report

def _repair_database(backend) -> tuple[str, list[str]]:
    """Rewrite the database from what SQLite can still read: meta, terms and every
    document row readable by its rowid, into a new file that replaces the old one."""
    db = backend._connect(False)
    tmp = backend.path / f".tmp-{os.getpid()}-repair-{store.DB_NAME}"
    tmp.unlink(missing_ok=True)
    salvaged, unreadable = store.salvage(db, tmp)
    if salvaged is None:
        tmp.unlink(missing_ok=True)
        return f"the database could not be read at all ({unreadable[0]}): delete the index and ingest again", []
    backend.close()
    for suffix in ("-wal", "-shm"):
        (backend.path / f"{store.DB_NAME}{suffix}").unlink(missing_ok=True)
    os.replace(tmp, backend.db_path)
    store.fsync_dir(backend.path)
    backend._write_checked = False
    backend._terms, backend._term_ids = [""], {}
    lost = f"; {len(unreadable)} unreadable: {', '.join(unreadable[:5])}" if unreadable else ""
    return f"the database was rewritten from its readable pages ({salvaged} documents kept{lost})", unreadable
