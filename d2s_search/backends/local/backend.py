"""The embedded default backend: no server, one folder.

SQLite (WAL, :mod:`.store`) is the durable source of truth; every upsert batch is one
transaction, so an interrupted ingest keeps whole batches and a re-run skips them. The
search structures (:mod:`.cache`) are derived from it, tied to it by the index identity
(``index_id`` + ``generation``), memory-mapped from ``cache/`` and scored shard by shard
(:mod:`.kernels`). A cache that is missing, stale, foreign or damaged is rebuilt from
SQLite with one warning line; a cache extends across appends and is rebuilt after deletes
or replacements. The id, path and URL of every hit are confirmed by SQLite before they are
shown, and a cache file cut short under the mapping of a running search process is noticed
before the next search touches it (:meth:`.cache.Structures.mapped_intact`).
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import os
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ...errors import BundleMismatchError, DiskFullError, IndexStoreError, QueryError
from ...filters import BUILT_IN_FIELDS, SearchFilter
from ...inflections import inflections
from ...metadata import NO_METADATA, Metadata
from ...search import minmax_normalised
from ..base import Document, Hit, IndexIdentity, SparseVector, WordFilter
from . import cache as cache_mod
from . import frequencies, graph, kernels, metadata_table, narrowing, row_blobs, store
from . import identity as index_identity
from . import paths as doc_paths
from .cache import CacheUnusable, Shard, Structures
from .store import FORMAT, Transaction

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["LocalBackend", "FORMAT", "APPROXIMATE_DENSE_FROM"]

# Dense search is exact (every vector scored, in place) below this many documents and
# approximate above it: HNSW graphs (:mod:`.graph`, faiss, over 8-bit copies of the vectors),
# one spanning the full shards and one per other shard, each searched with max(ef, k)
# candidates (graph.default_ef), those rescored with the float vectors, and the top-k merged.
# Recall on real embeddings and speed: docs/benchmarks.md.
APPROXIMATE_DENSE_FROM = 100_000
# A graph answers while the candidates it rescores, max(ef, k), are under this share of its
# rows; more (hybrid at k=1000 asks 2,000 a side) is a scan of its vectors: faster there, and
# exact (65,536 rows, one thread: graph 0.5 ms at k=100, 5 ms at 1,000, 16 ms at 2,000; scan 3-8 ms).
GRAPH_K_SHARE = 1 / 48
# A larger graph costs more a candidate (its nodes lie further apart in memory) while a scan costs
# the same a row: the share falls as (SHARD_ROWS / rows) ** GRAPH_SHARE_FALLOFF. 0.41 fits both
# crossings measured: a shard's 1/48, and 983,040 rows (a graph over 15 shards, 256-d, one
# thread) where 3,000 candidates took 33 ms, 10,000 took 103 ms and a scan of the rows 74 ms: 1/147.
GRAPH_SHARE_FALLOFF = 0.41
# A shard of fewer rows gets no graph and is scanned even above APPROXIMATE_DENSE_FROM (the
# last shard of a large index, until it grows): its scan is about as fast and exact (real-shaped
# vectors, 384-d, one thread, k=10: 2,000 rows scanned in 0.15 ms, 0.19 through a graph; 8,000
# rows 0.52 against 0.27 ms; benchmarks/bench_graph_params.py --shard-sizes).
GRAPH_FROM_ROWS = 4096
# From this many full shards on, one graph spans them all (stored with the first; each shard
# that fills is added to it): searching one graph over 1M real-shaped vectors costs a fraction
# of searching 16 at equal recall (docs/benchmarks.md, "Dense recall of the graphs"). The last,
# partial shard keeps a graph of its own until it fills.
SPANNING_GRAPH_FROM_SHARDS = 2
# The most candidates a graph search may be asked for (LocalBackend.dense_ef): past a few
# thousand a scan of the shard is faster and exact.
MAX_DENSE_EF = 100_000
# Without the compiled kernel's table lookup (kernels.explain_slots), explanations of this many
# hits of a shard or more are read from the query's posting lists (one binary search per term)
# rather than from each hit's own postings.
EXPLAIN_BY_POSTINGS_FROM = 64
# Up to this many hits, their strings are read row by row (10 hits at 123k: 22 against 47 us).
FEW_HITS = 16
# With more than one search thread, shards are searched in groups at once from this many
# shards on. A group handed to another thread costs about 0.1 ms of lock hand-offs: the sparse
# kernel (0.15-0.25 ms a shard) gains from 6 shards (2 threads, the 1M index's first shards:
# 2-4 shards 1.01-1.02x, 6-16 shards 1.26-1.70x), a dense graph search (about 1 ms a shard)
# from 2 (1.16-1.89x); benchmarks/bench_search_threads.py, docs/benchmarks.md "Search threads".
SPARSE_PARALLEL_FROM = 6
DENSE_PARALLEL_FROM = 2
# Past this k a scan's shards hand on every row at least their k-th score, ranked once across
# shards (kernels.select_top) rather than each shard ranking its k first.
RANK_EACH_SHARD_UP_TO = 256
# An approximate (graph) shard answers a filtered dense search through its graph when the
# filter keeps at least this share of its rows (faiss keeps only allowed rows as results), and
# by scoring every allowed vector otherwise (a narrow filter would leave the walk too few).
# At 123k documents (bench_filters.py): 90% kept 1.0x of the unfiltered dense time against 5.3x
# for the exact scan, at recall@10 in the benchmark's table.
GRAPH_FILTER_SHARE = 0.3
# A filter that keeps at most 1/this of the documents may be scored row by row (its rows' own
# postings) rather than over the query's posting lists: _few_allowed compares the reads then.
FEW_ALLOWED_SHARE = 64


def _db_errors(method):
    """SQLite damage becomes one IndexStoreError line, never a traceback."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            raise store.failure(self.db_path, exc) from None

    return wrapper


class LocalBackend:
    name = "local"
    # sparse_search and hybrid_search take ``shown``: the words of a hit are collapsed in the
    # pass that reads its row (search.run_query then leaves them), not from Python pairs
    collapses_words = True

    def __init__(self, path: str | Path, threads: int | None = 1, dense_ef: int | None = None) -> None:
        """``threads``: how many shards are searched at once (1: one after another in the
        calling thread; None or 0: one per CPU). The compiled kernel and faiss release the GIL,
        so shards score in parallel; an index of one shard (65,536 documents) is not split.
        ``dense_ef``: candidates a graph search rescores (:attr:`dense_ef`)."""
        self.path = Path(path).expanduser()
        if threads is not None and threads < 0:
            raise QueryError(f"search threads must be >= 0, got {threads}")
        self.threads = threads or os.cpu_count() or 1
        self.dense_ef = dense_ef
        self._pool: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        self._terms: list[str] = [""]  # term id -> term (ids start at 1)
        self._term_ids: dict[str, int] = {}
        self._structures_cache: Structures | None = None
        self._seen_version: tuple | None = None
        self._columns: narrowing.FilterColumns | None = None  # the filter columns, once a filter asked
        self._columns_seen: tuple | None = None  # _seen_version when they were last checked
        self._commits: store.CommitSignal | None = None  # the WAL-index header of self._db's database
        self._seen_header: bytes | None = None  # its bytes when _seen_version was read
        self._write_checked = False
        self._warned: set[str] = set()
        self._per_thread = threading.local()  # each search thread's kernels.QueryTop buffers
        self.identity: IndexIdentity | None = None
        self.last_fusion: str | None = None  # who fused the last hybrid search (run_query reports it)

    @property
    def dense_ef(self) -> int:
        """Candidates each graph proposes and the float vectors rescore (at least k):
        more is slower and finds more of the exact top k (docs/benchmarks.md, "Dense recall of
        the graphs"). Setting None goes back to the default, graph.EF_SEARCH (a graph spanning
        many shards keeps more: :func:`graph.default_ef`)."""
        return self._dense_ef or graph.EF_SEARCH

    @dense_ef.setter
    def dense_ef(self, value: int | None) -> None:
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_DENSE_EF:
                raise QueryError(f"dense search candidates (--ef) must be a whole number from 1 to {MAX_DENSE_EF:,}, "
                                 f"got {value!r}")
            value = int(value)
        self._dense_ef = value

    def _ef_for(self, span: int) -> int:
        """The candidates a graph over ``span`` shards keeps: the width asked, or its default."""
        return self._dense_ef or graph.default_ef(span)

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.path / store.DB_NAME

    @property
    def cache_dir(self) -> Path:
        return self.path / store.CACHE_DIR

    def exists(self) -> bool:
        return self.db_path.is_file()

    def _connect(self, create: bool) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        new = not self.exists()
        created_folder = False
        if new:
            if not create:
                raise IndexStoreError(f"no index at {self.path}: ingest some images first (`d2s-search ingest PATH`)")
            if self.db_path.exists() or self.db_path.is_symlink():
                raise IndexStoreError(f"{self.db_path} is not a regular file")
            created_folder = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
        try:
            db = store.connect(self.db_path, schema=new)
        except store.MissingTables as exc:
            # No table and no manifest: a creation stopped before its first commit. Anything
            # else held an index, which is never silently started afresh.
            if len(exc.missing) < len(store.TABLES) or index_identity.manifest_index_id(store.read_manifest(self.path)):
                raise store.tables_lost(self.path, exc.missing) from None
            if not create:
                raise IndexStoreError(f"no index at {self.path}: ingest some images first (`d2s-search ingest PATH`)") from None
            new = True
            db = store.connect(self.db_path, schema=True)
        self._db = db
        self._commits = store.CommitSignal(self.db_path)
        if new:
            try:
                with Transaction(db):
                    db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", store.new_identity_rows())
                index_id = db.execute("SELECT value FROM meta WHERE key = 'index_id'").fetchone()[0]
                store.write_manifest(self.path, index_id, created_folder)
            except sqlite3.DatabaseError as exc:
                raise store.failure(self.db_path, exc) from None
            except OSError as exc:
                raise self._write_error(self.path / store.MANIFEST_NAME, exc) from None
        return db

    def _write_error(self, path: Path, exc: OSError) -> IndexStoreError:
        if store.is_disk_full(exc):
            return DiskFullError(str(path), store.free_bytes(self.path))
        return IndexStoreError(f"{path} cannot be written: {exc.strerror or exc}")

    def _meta(self, checked: bool = True) -> dict[str, str]:
        """The ``meta`` rows; ``checked``: refuse values this package never writes (one line
        that says which, and that `index check --repair` mends them)."""
        meta = dict(self._connect(False).execute("SELECT key, value FROM meta"))
        if checked:
            bad = index_identity.problems(meta)
            if bad:
                raise IndexStoreError(f"{self.db_path} has damaged metadata ({next(iter(bad.values()))}): run "
                                      f"`d2s-search index check --index {self.path} --repair`")
        return meta

    @_db_errors
    def open(self, identity: IndexIdentity | None, create: bool = True) -> None:
        """Open the index; with ``identity`` check (or, when new, record) the bundle."""
        db = self._connect(create)
        meta = self._meta()
        if meta.get("format", FORMAT) != FORMAT:
            raise IndexStoreError(f"{self.path}: unknown index format {meta.get('format')!r}")
        if "index_id" not in meta:  # made before index identities: give it one now (the manifest's, if any)
            rows = store.new_identity_rows()[:2]
            known = index_identity.manifest_index_id(store.read_manifest(self.path))
            if known:
                rows[0] = ("index_id", known)
            try:
                with Transaction(db):
                    db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", rows)
            except sqlite3.OperationalError:
                pass  # read-only: the cache is then rebuilt in memory
        recorded = index_identity.recorded_bundle(meta)
        unknown = self._unknown_bundle(db, meta) if recorded is None else None
        if identity is not None:
            if unknown is not None:  # nothing records the bundle of what is stored: check what can be
                self._check_against_rows(identity, unknown)
            if recorded is None:
                if not create and unknown is None:
                    raise IndexStoreError(f"{self.path} is empty: ingest some images first")
                if create:
                    self._record_bundle(db, identity)
            elif recorded.fingerprint != identity.fingerprint:
                at = f" at {recorded.bundle_path}" if recorded.bundle_path else ""
                raise BundleMismatchError(
                    f"index {self.path} was filled with bundle {recorded.fingerprint[:12]} ({recorded.model or '?'}){at}, "
                    f"not {identity.fingerprint[:12]} ({identity.model}); their vectors differ: use that bundle, "
                    "or re-ingest the images with this one into another --index"
                )
            elif create and identity.bundle_path and meta.get("bundle_path") != identity.bundle_path:
                self.record_bundle_path(identity.bundle_path)  # the same bundle, moved or copied
            elif create:
                self._save_identity(identity)  # indexes made before the manifest kept a copy
        # An index whose bundle nobody recorded any more is known by its dense size alone (an
        # identity without fingerprint): commands then need the bundle named (--bundle).
        self.identity = identity or recorded or (IndexIdentity("", unknown) if unknown is not None else None)
        self._terms, self._term_ids = [""], {}
        self._load_terms()
        cache_mod.remove_leftovers(self.path)
        if self.cache_dir.is_dir():
            cache_mod.remove_leftovers(self.cache_dir)

    def _unknown_bundle(self, db: sqlite3.Connection, meta: dict[str, str]) -> int | None:
        """For an index that records no bundle: None when it holds nothing a bundle could
        disagree with (a new index), else the dense size its documents have (0: unknown)."""
        if index_identity.BUNDLE_UNKNOWN not in meta and db.execute("SELECT 1 FROM docs LIMIT 1").fetchone() is None:
            return None
        return index_identity.majority(index_identity.row_dims(db)) or index_identity.dim(meta.get("dense_dim")) or 0

    def _check_against_rows(self, identity: IndexIdentity, size: int) -> None:
        if size and identity.dense_dim != size:
            raise BundleMismatchError(
                f"index {self.path} holds {size}-dimensional vectors and no longer records their bundle; "
                f"{identity.fingerprint[:12]} ({identity.model}) makes {identity.dense_dim}-dimensional ones: it did "
                "not fill this index. Name the bundle that did with --bundle"
            )

    def _record_bundle(self, db: sqlite3.Connection, identity: IndexIdentity) -> None:
        self._check_writable(db)
        with Transaction(db):
            for key, value in (
                ("format", FORMAT),
                ("bundle_fingerprint", identity.fingerprint),
                ("bundle_model", identity.model),
                ("dense_dim", str(identity.dense_dim)),
                ("created_at", str(time.time())),
                ("bundle_path", identity.bundle_path),
            ):
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
            db.execute("DELETE FROM meta WHERE key = ?", (index_identity.BUNDLE_UNKNOWN,))
            store.bump(db, mutation=False)
        self._save_identity(identity)

    def _save_identity(self, identity: IndexIdentity) -> None:
        """Keep the manifest's copy of the identity equal to ``meta``'s (a repair restores a
        damaged ``meta`` from it). A copy that cannot be written leaves the index working."""
        manifest = store.read_manifest(self.path)
        bundle = {"fingerprint": identity.fingerprint, "model": identity.model, "dense_dim": identity.dense_dim,
                  "path": identity.bundle_path}
        index_id = self._meta().get("index_id", "")
        if manifest.get("bundle") == bundle and manifest.get("index_id") == index_id:
            return
        try:
            store.write_manifest(self.path, index_id, manifest.get("created_folder") is True, bundle)
        except OSError as exc:
            error = self._write_error(self.path / store.MANIFEST_NAME, exc)
            if isinstance(error, DiskFullError):
                raise error from None
            self._warn(f"{error}; the index works, but a repair could not restore its identity from it")

    def record_bundle_path(self, path: str) -> None:
        """Remember where the bundle that fills this index lives (a hint for commands without --bundle)."""
        db = self._connect(False)
        with Transaction(db):
            db.execute("INSERT OR REPLACE INTO meta VALUES ('bundle_path', ?)", (path,))
        recorded = index_identity.recorded_bundle(self._meta())
        if recorded is not None:
            self._save_identity(recorded)

    def document_paths(self) -> list[tuple[str, str]]:
        """(id, path) of every stored path, in ingest order (a document's copies after it)."""
        return doc_paths.every_path(self._connect(False))

    def paths_of(self, ids: Iterable[str]) -> dict[str, list[str]]:
        """id -> every stored path (the shown one first) of the given ids that are stored
        (no vectors decoded)."""
        return doc_paths.paths_of(self._connect(False), ids)

    @_db_errors
    def relink(self, found: Mapping[str, str] | None = None, gone: Iterable[str] = ()) -> int:
        """Move paths between documents (see ``Backend.relink``) in one transaction."""
        found, gone = dict(found or {}), list(gone)
        if not found and not gone:
            return 0
        db = self._connect(False)
        self._check_writable(db)
        with Transaction(db):
            doc_paths.make(db)
            removed, rows_changed = doc_paths.relink(db, found, gone)
            if rows_changed:  # a shown path changed or a document went: the cache is rebuilt
                store.bump(db, mutation=True)
        return removed

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._commits is not None:  # unmapped while the connection still holds the file open
            self._commits.close()
            self._commits = None
        if self._db is not None:
            self._db.close()
            self._db = None
        self._structures_cache = None
        self._seen_version = None
        self._columns = self._columns_seen = None

    def drop(self) -> None:
        """Delete the files the index created; refuse (deleting nothing) when the folder
        holds anything else."""
        self.close()
        if not self.path.exists():
            return
        reason = self.why_not_droppable()
        if reason:
            raise IndexStoreError(reason)
        self._remove_owned()

    def remove_created(self) -> None:
        """Undo the creation of an index that stayed empty: its own files only (whatever else
        its folder holds stays), and the folder when the index made it."""
        self.close()
        if self.path.is_dir() and not self.path.is_symlink():
            self._remove_owned()

    def _remove_owned(self) -> None:
        created_folder = store.read_manifest(self.path).get("created_folder", False)
        for name in store.OWNED_NAMES:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        for leftover in self.path.glob(".tmp-*"):
            if store.is_temp_name(leftover.name) and leftover.is_file() and not leftover.is_symlink():
                leftover.unlink(missing_ok=True)
        if created_folder:
            with contextlib.suppress(OSError):  # something appeared meanwhile: leave the folder
                self.path.rmdir()

    def why_not_droppable(self) -> str | None:
        """Why :meth:`drop` would refuse (None: it would not), to ask before any prompt."""
        if not self.path.is_dir() or self.path.is_symlink() or not self.exists():
            return f"{self.path} does not look like a d2s index; not deleting it"
        foreign = store.foreign_entries(self.path)
        if not foreign:
            return None
        shown = ", ".join(repr(n) for n in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        return (f"{self.path} also holds files the index did not create ({shown}); not deleting anything. "
                f"Remove the index's own files by hand: {', '.join(store.OWNED_NAMES)}")

    # -- writing --------------------------------------------------------------------------

    def _load_terms(self) -> None:
        """Read the terms added since the last call (term ids only grow)."""
        rows = self._connect(False).execute(
            "SELECT id, term FROM terms WHERE id >= ? ORDER BY id", (len(self._terms),)
        ).fetchall()
        if not rows:
            return
        top = rows[-1][0] + 1
        if top > len(self._terms):
            self._terms.extend([""] * (top - len(self._terms)))
        for term_id, term in rows:
            if term_id > 0:
                self._terms[term_id] = term
                self._term_ids[term] = term_id

    def _check_writable(self, db: sqlite3.Connection) -> None:
        """Refuse to write into a database SQLite finds damaged (once per connection)."""
        if self._write_checked:
            return
        problems = store.quick_check(db)
        if problems:
            raise IndexStoreError(
                f"{self.db_path} is damaged ({problems[0]}); nothing was written: run "
                f"`d2s-search index check --index {self.path} --repair`"
            )
        self._write_checked = True

    def _forget_terms(self) -> None:
        """Terms an undone transaction added are gone again: read them afresh before the next write."""
        self._terms, self._term_ids = [""], {}

    def _ensure_terms(self, db: sqlite3.Connection, vectors: Iterable[Mapping[str, float]]) -> None:
        """Every term of ``vectors`` given an id (new ones stored in ``terms``)."""
        self._load_terms()
        # set operations in C: a batch of an untrained head's vectors holds millions of terms
        new = sorted(set().union(*vectors).difference(self._term_ids))
        if not new:
            return
        db.executemany("INSERT OR IGNORE INTO terms(term) VALUES (?)", [(t,) for t in new])
        for term in new:
            (term_id,) = db.execute("SELECT id FROM terms WHERE term = ?", (term,)).fetchone()
            self._term_ids[term] = term_id
            if term_id >= len(self._terms):
                self._terms.extend([""] * (term_id + 1 - len(self._terms)))
            self._terms[term_id] = term

    @_db_errors
    def upsert(self, docs: Sequence[Document]) -> None:
        if not docs:
            return
        db = self._connect(True)
        self._check_writable(db)
        with Transaction(db, undone=self._forget_terms):
            self._ensure_terms(db, [d.sparse for d in docs])
            replaced = db.execute(
                f"SELECT COUNT(*) FROM docs WHERE id IN ({','.join('?' * len(docs))})", [d.id for d in docs]
            ).fetchone()[0]
            # One path, one document: whatever held these paths before (a file overwritten in
            # place) gives them up, in the same transaction.
            doc_paths.make(db)
            ids = [d.id for d in docs]
            _, taken = doc_paths.relink(db, {p: d.id for d in docs for p in d.paths}, keep=ids)
            rows = []
            term_id = self._term_ids.__getitem__
            for d in docs:
                # the positive weights by term id, as float32 (ids are distinct: one per term)
                ids = np.fromiter(map(term_id, d.sparse), dtype=np.int64, count=len(d.sparse))
                values = np.fromiter(d.sparse.values(), dtype=np.float64, count=len(d.sparse))
                positive = values > 0
                ids, values = ids[positive], values[positive]
                order = np.argsort(ids)
                term_ids = ids[order]
                weights = values[order].astype("<f4")
                rows.append(
                    (
                        d.id, d.path, d.url, int(d.size_bytes), int(d.width), int(d.height),
                        d.ingested_at or time.time(), row_blobs.encode_term_ids(term_ids), weights.tobytes(),
                        np.asarray(d.dense, dtype="<f4").tobytes(),
                    )
                )
            db.executemany(
                "INSERT INTO docs(id, path, url, size_bytes, width, height, ingested_at, term_ids, weights, dense) "
                "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET path=excluded.path, url=excluded.url, "
                "size_bytes=excluded.size_bytes, width=excluded.width, height=excluded.height, "
                "ingested_at=excluded.ingested_at, term_ids=excluded.term_ids, weights=excluded.weights, "
                "dense=excluded.dense",
                rows,
            )
            doc_paths.set_copies(db, {d.id: d.copies for d in docs})
            if any(d.metadata for d in docs) or metadata_table.has_table(db):
                metadata_table.write(db, {d.id: d.metadata for d in docs})
            store.bump(db, mutation=bool(replaced) or taken)  # rows changed in place: the cache is rebuilt
            db.execute("INSERT OR REPLACE INTO meta VALUES ('last_ingest_at', ?)", (str(time.time()),))

    @_db_errors
    def delete(self, ids: Iterable[str]) -> int:
        ids = list(ids)
        if not ids:
            return 0
        db = self._connect(False)
        self._check_writable(db)
        removed = 0
        with Transaction(db):
            for chunk in _chunks(ids, 500):
                removed += db.execute(f"DELETE FROM docs WHERE id IN ({','.join('?' * len(chunk))})", chunk).rowcount
            doc_paths.forget(db, ids)
            metadata_table.forget(db, ids)
            if removed:
                store.bump(db, mutation=True)
        return removed

    # -- reading --------------------------------------------------------------------------

    @_db_errors
    def ids_present(self, ids: Iterable[str]) -> set[str]:
        db = self._connect(False)
        present: set[str] = set()
        for chunk in _chunks(list(ids), 500):
            present.update(
                r[0] for r in db.execute(f"SELECT id FROM docs WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            )
        return present

    @_db_errors
    def get(self, ids: Sequence[str]) -> list[Document]:
        db = self._connect(False)
        self._load_terms()  # another process may have added terms since (a running `serve`)
        found: dict[str, Document] = {}
        for chunk in _chunks(list(ids), 500):
            for row in db.execute(
                "SELECT id, path, url, size_bytes, width, height, ingested_at, term_ids, weights, dense "
                f"FROM docs WHERE id IN ({','.join('?' * len(chunk))})",
                chunk,
            ):
                found[row[0]] = Document(
                    id=row[0], path=row[1], url=row[2], size_bytes=row[3], width=row[4], height=row[5],
                    ingested_at=row[6], sparse=self._stored_sparse(row[7], row[8]),
                    dense=_floats(row[9]).copy(),
                )
        for doc_id, paths in doc_paths.paths_of(db, found).items():
            found[doc_id].copies = tuple(paths[1:])
        for doc_id, metadata in metadata_table.read(db, found).items():
            found[doc_id].metadata = metadata
        return [found[i] for i in ids if i in found]

    def _stored_sparse(self, term_blob: bytes, weight_blob: bytes) -> SparseVector:
        """A stored sparse vector; term ids outside the vocabulary (damage) are left out."""
        weights = _floats(weight_blob)
        term_ids = row_blobs.paired_term_ids(term_blob, weights)
        n = min(term_ids.size, weights.size)
        terms = self._terms
        return {
            terms[i]: float(w)
            for i, w in zip(term_ids[:n].tolist(), weights[:n].tolist())
            if 0 < i < len(terms) and terms[i]
        }

    # -- metadata and filters (base.Narrowing) ----------------------------------------------------

    @_db_errors
    def field_types(self) -> dict[str, str]:
        return {**BUILT_IN_FIELDS, **metadata_table.field_types(self._connect(False))}

    @_db_errors
    def declare_fields(self, types: Mapping[str, str]) -> None:
        if not types:
            return
        db = self._connect(True)
        self._check_writable(db)
        with Transaction(db):
            if metadata_table.declare(db, types):
                metadata_table.bump_version(db)

    @_db_errors
    def set_metadata(self, metadata: Mapping[str, Metadata], keep_fields: Collection[str] = ()) -> int:
        """Metadata of stored documents replaced in one transaction, those whose metadata
        changed only (returns how many); vectors and the search cache untouched (only the
        filter columns are read again)."""
        db = self._connect(False)
        present = self.ids_present(metadata)
        stored = metadata_table.read(db, present)
        keep = set(keep_fields)
        metadata = {i: m.with_fields(stored.get(i, NO_METADATA).fields) if i in keep else m for i, m in metadata.items()}
        changed = {i: m for i, m in metadata.items() if i in present and stored.get(i, NO_METADATA) != m}
        if not changed:
            return 0
        self._check_writable(db)
        with Transaction(db):
            metadata_table.write(db, changed)
        return len(changed)

    @_db_errors
    def browse(self, k: int, filters: SearchFilter | None = None, offset: int = 0, *,
               words: WordFilter | None = None) -> list[Hit]:
        if k < 1 or offset < 0:
            raise QueryError("k must be at least 1 and the offset not negative")

        def run(state: Structures) -> list[Hit]:
            if state.size == 0:
                return []
            columns = self._filter_columns(state)
            rows = columns.browse_order(self._allowed(state, words, filters), k, offset)
            return self._hits(state, rows, np.zeros(rows.size, dtype=np.float32), {}, 0)

        return self._searching(run)

    @_db_errors
    def facets(self, filters: SearchFilter | None = None, size: int = 20, *,
               words: WordFilter | None = None) -> dict[str, list[tuple[str, int]]]:
        def run(state: Structures) -> dict[str, list[tuple[str, int]]]:
            return self._filter_columns(state).facets(self._allowed(state, words, filters), size)

        return self._searching(run)

    def _filter_columns(self, state: Structures) -> narrowing.FilterColumns:
        """The filter columns of ``state``'s documents at the current metadata version."""
        columns = self._columns
        if (columns is not None and self._seen_version is not None and self._columns_seen == self._seen_version
                and columns.key[:2] == (state.index_id, state.generation) and columns.rows == state.size):
            return columns  # no commit seen since they were checked
        db = self._connect(False)
        db.execute("BEGIN")  # the metadata and the documents from one snapshot
        try:
            key = (state.index_id, state.generation, metadata_table.version(db))
            if columns is None or columns.key != key or columns.rows != state.size:
                seqs = (np.concatenate([np.asarray(s.arrays["seqs"], dtype=np.int64) for s in state.shards])
                        if state.shards else np.zeros(0, np.int64))
                columns = self._columns = narrowing.load(db, seqs, key)
        finally:
            db.execute("COMMIT")
        self._columns_seen = self._seen_version
        return columns

    def _allowed(self, state: Structures, words: WordFilter | None,
                 filters: SearchFilter | None) -> np.ndarray | None:
        """One bool per row: the rows that pass ``words`` and ``filters`` (None: no restriction)."""
        allowed = None
        if filters:
            allowed = self._filter_columns(state).mask(filters)  # shared: never written to
        if words:
            carrying = (np.concatenate([self._carrying(shard, words) for shard in state.shards])
                        if state.shards else np.zeros(0, dtype=bool))
            allowed = carrying if allowed is None else allowed & carrying
        return allowed

    @_db_errors
    def count(self) -> int:
        return self._connect(False).execute("SELECT COUNT(*) FROM docs").fetchone()[0]

    @_db_errors
    def stats(self) -> dict:
        db = self._connect(False)
        meta = self._meta()
        docs, avg_terms = db.execute("SELECT COUNT(*), AVG(LENGTH(weights)) / 4.0 FROM docs").fetchone()
        disk = _owned_bytes(self.path)
        return {
            "backend": self.name,
            "location": str(self.path),
            "documents": docs,
            "distinct_terms": db.execute("SELECT COUNT(*) FROM terms").fetchone()[0],
            "mean_terms_per_document": round(avg_terms or 0.0, 2),
            "bundle_fingerprint": meta.get("bundle_fingerprint"),
            "bundle_model": meta.get("bundle_model"),
            "dense_dim": int(meta["dense_dim"]) if "dense_dim" in meta else None,
            "created_at": _iso(meta.get("created_at")),
            "last_ingest_at": _iso(meta.get("last_ingest_at")),
            "disk_bytes": disk,
            # which scoring kernel this install has: "numpy" means no C compiler at install time
            "scoring_kernel": "compiled" if kernels.c_kernel_loaded() else "numpy",
            "hit_builder": "compiled" if kernels._c_hits is not None else "python",  # _hits.c, built with it
            "graph_walk": "compiled" if kernels._c_graph is not None else "faiss",  # _graph.c
            # _query.c: a sparse query's columns, every shard's top k and their merge in one call
            "sparse_query": "compiled" if kernels._c_query is not None and kernels.c_kernel_loaded() else "python",
            # "hnsw": dense search proposes candidates from graphs (approximate), see APPROXIMATE_DENSE_FROM
            "dense_search": "hnsw" if docs >= APPROXIMATE_DENSE_FROM and graph.available() else "exact",
            # recall@10 of the graphs at the default candidates, measured when they were built
            "dense_recall_at_10": self._graph_recall() if docs >= APPROXIMATE_DENSE_FROM else None,
            "metadata": self._metadata_counts(db),
        }

    def _graph_recall(self) -> float | None:
        """The graphs' sampled recall@10 (graph.sampled_recall, at graph.EF_SEARCH candidates),
        pooled over the shards that recorded one, read from the cache's header (stats builds
        nothing); None when no graph has one (exact, no cache yet, or one written before)."""
        measured = cache_mod.recorded_recalls(self.cache_dir)
        wanted = sum(w for _, w in measured)
        return round(sum(f for f, _ in measured) / wanted, 3) if wanted else None

    def _metadata_counts(self, db: sqlite3.Connection) -> dict:
        """How many documents have a date taken (from EXIF or their file), a GPS position, a
        camera, and the user's fields with their types: what the filters can narrow by."""
        counts = (0, 0, 0)
        if metadata_table.has_table(db):
            counts = db.execute("SELECT COUNT(taken_at), COUNT(lat), COUNT(camera) FROM metadata "
                                "WHERE id IN (SELECT id FROM docs)").fetchone()
        return {"taken": counts[0], "location": counts[1], "camera": counts[2],
                "fields": metadata_table.field_types(db)}

    def generation(self) -> tuple[str, int]:
        """(index_id, generation): changes with every write by any process."""
        meta = self._meta()
        return meta.get("index_id", ""), int(meta.get("generation", "0"))

    # -- integrity ------------------------------------------------------------------------

    def check(self, repair: bool = False) -> dict:
        """Integrity of SQLite and of the cache (see :mod:`.integrity`)."""
        from .integrity import check

        return check(self, repair)

    # -- search structures ----------------------------------------------------------------

    def _warn(self, message: str, kind: str = "warning") -> None:
        if message not in self._warned:
            self._warned.add(message)
            from ...pathtext import shown  # the index's path may hold any character

            print(f"{kind}: {shown(message)}", file=sys.stderr)

    def _search_state(self) -> Structures:
        """The search structures of the current generation (loaded, extended or rebuilt)."""
        db = self._connect(False)
        current = self._structures_cache
        if current is not None and not current.mapped_intact():
            # A mapped file was cut short under this process (files the index publishes never
            # change in place): its mappings are never touched again; the state is read anew.
            self._structures_cache = current = self._seen_version = None
        # No commit by anyone since the last check (the WAL-index header unchanged, read before
        # asking SQLite) and none of this connection's own changes: nothing to look up.
        header = self._commits.read() if self._commits is not None else None
        seen = self._seen_version
        if current is not None and seen is not None and header is not None and header == self._seen_header \
                and db.total_changes == seen[1]:
            return current
        try:
            version = (db.execute("PRAGMA data_version").fetchone()[0], db.total_changes)
            if self._commits is not None:
                self._commits.map_when_held()  # the connection has read: it holds the WAL index open
            if current is not None and version == seen:
                self._seen_header = header
                return current
            meta = self._meta()
            index_id, generation = meta.get("index_id", ""), int(meta.get("generation", "0"))
            mutations = int(meta.get("mutations", "0"))
            self._load_terms()
            if current is not None and current.index_id == index_id and current.generation == generation:
                current = self._same_rows(db, current)  # a commit that kept the generation (a bundle path)
            else:
                current = self._refresh(current, index_id, generation, mutations)
        except sqlite3.DatabaseError as exc:
            raise store.failure(self.db_path, exc) from None
        self._structures_cache, self._seen_version, self._seen_header = current, version, header
        return current

    def _same_rows(self, db: sqlite3.Connection, current: Structures) -> Structures:
        """``current`` when the documents are still those it was made from. Every change of
        documents by this package comes with a new generation; documents changed under the same
        one (a table dropped or rows deleted by another program) are damage, not answered from
        the cache."""
        (top,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM docs").fetchone()
        if top == current.max_seq:
            return current
        db.execute("BEGIN")  # both values from one snapshot: a writer may have committed in between
        try:
            meta = self._meta()
            (top,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM docs").fetchone()
        finally:
            db.execute("COMMIT")
        generation = int(meta.get("generation", "0"))
        if meta.get("index_id", "") != current.index_id or generation != current.generation:
            return self._refresh(current, meta.get("index_id", ""), generation, int(meta.get("mutations", "0")))
        raise IndexStoreError(
            f"{self.db_path} no longer holds the documents its search cache was made from (changed by another "
            f"program?): run `d2s-search index check --index {self.path}`"
        )

    def _refresh(self, current: Structures | None, index_id: str, generation: int, mutations: int) -> Structures:
        problem = None
        if current is not None and not current.unchanged_on_disk():
            current = None  # a file changed since it was verified (or another state now shares it): read it anew
        if current is None:
            try:
                current = cache_mod.load(self.cache_dir)
            except CacheUnusable as exc:
                if str(exc) != "no cache yet":
                    problem = str(exc)
                current = None
        if current is not None and current.index_id != index_id:
            problem = "it belongs to another index"
        if current is not None and current.index_id == index_id and current.generation == generation:
            return current
        db = self._connect(False)
        if (
            current is not None and current.index_id == index_id and current.mutations == mutations
            and current.generation < generation and current.dim == self._dim()
            and current.shard_rows == cache_mod.SHARD_ROWS
        ):
            (older,) = db.execute("SELECT COUNT(*) FROM docs WHERE seq <= ?", (current.max_seq,)).fetchone()
            if older == current.size:  # only appended since: extend the last shard and add new ones
                return self._build(index_id, generation, mutations, base=current)[0]
        return self._build(index_id, generation, mutations, base=None, problem=problem)[0]

    def _rebuild(self) -> tuple[Structures, list[int]]:
        meta = self._meta()
        self._load_terms()
        built, lost = self._build(meta.get("index_id", ""), int(meta.get("generation", "0")),
                                  int(meta.get("mutations", "0")), base=None)
        self._structures_cache, self._seen_version = built, None
        return built, lost

    def _dim(self) -> int:
        return self.identity.dense_dim if self.identity else 0

    def _build(self, index_id: str, generation: int, mutations: int, base: Structures | None,
               problem: str | None = None) -> tuple[Structures, list[int]]:
        """Search structures from SQLite (from scratch, or ``base`` extended with the rows
        appended since), saved to the cache; ``problem`` is why the cache on disk was not
        used (said in the one warning line)."""
        if problem:  # said before the work: a million documents take minutes
            self._warn(f"search cache of {self.path} unusable ({problem}): rebuilding it from the database")
        db = self._connect(False)
        n_cols = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM terms").fetchone()[0]
        dim = self._dim() or _first_dim(db)
        max_seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM docs").fetchone()[0]
        shard_rows = cache_mod.SHARD_ROWS
        shards: list[Shard] = []
        since = 0
        if base is not None:
            shards = [s for s in base.shards if s.rows == shard_rows]  # full shards never change
            if len(shards) < len(base.shards):
                since = int(base.shards[len(shards)].arrays["seqs"][0]) - 1
            else:
                since = base.max_seq
        lost: list[int] = []
        writer, unwritten = self._state_writer(base) if index_id else (None, None)
        ahead = None
        cursor = db.execute(
            "SELECT seq, id, path, url, term_ids, weights, dense FROM docs WHERE seq > ? ORDER BY seq", (since,)
        )
        pending: list[tuple] = []
        start = sum(s.rows for s in shards)
        try:
            ahead = self._graph_ahead(db, max_seq, dim) if base is None else None
            while True:
                batch = cursor.fetchmany(4096)
                good, bad = cache_mod.parse_rows(batch, n_cols, dim)
                pending.extend(good)
                lost.extend(bad)
                while len(pending) >= shard_rows or (not batch and pending):
                    shards.append(cache_mod.build_shard(start, pending[:shard_rows], n_cols, dim))
                    start += shards[-1].rows
                    pending = pending[shard_rows:]
                    if writer is not None:  # written now, mapped back: one shard in memory at a time
                        try:
                            writer.add(len(shards) - 1, shards[-1])
                        except OSError as exc:
                            writer.close()
                            writer, unwritten = None, exc
                    if ahead is not None and shards[-1].rows == shard_rows:  # into the graph beside the next shard
                        ahead.add(shards[-1].arrays["dense"],
                                  functools.partial(writer.release, len(shards) - 1, "dense") if writer else None)
                if not batch:
                    break
            if lost:
                self._warn(f"{len(lost)} document(s) in {self.db_path} have damaged vectors and cannot be searched "
                           f"(run `d2s-search index check --index {self.path}`)")
            built = Structures(index_id=index_id, generation=generation, mutations=mutations, max_seq=max_seq,
                               dim=dim, shards=shards, shard_rows=shard_rows)
            try:
                self._dense_graphs(built, writer, ahead)
            except OSError as exc:  # writing a graph's file
                writer.close()
                writer, unwritten = None, exc
                self._dense_graphs(built, None)
            if writer is not None:
                try:
                    built.state_dir = writer.commit(built)
                    built = cache_mod.load(self.cache_dir)  # memory-mapped: the pages are shared
                except (OSError, CacheUnusable) as exc:
                    unwritten = exc
            if unwritten is not None:
                self._warn(self._cache_not_written(built, unwritten))
                built.state_dir = None
        finally:
            if ahead is not None:
                ahead.abandon()
            if writer is not None:
                writer.close()
        return built, lost

    def _graph_ahead(self, db: sqlite3.Connection, max_seq: int, dim: int) -> graph.Builder | None:
        """For a build from scratch that will make a spanning graph: that graph started now,
        its 8-bit ranges from rows spread over the whole database (every ceil(max_seq /
        RANGE_SAMPLE)-th seq; the last shard's rows among them widen the ranges a little), so
        the full shards go into it as they are made. None where no spanning graph will be."""
        count = db.execute("SELECT COUNT(*) FROM docs").fetchone()[0]
        if not _graphs_searched(count, dim) or not _spanning(count // cache_mod.SHARD_ROWS):
            return None
        step = max(1, -(-max_seq // graph.RANGE_SAMPLE))
        rows = []
        for chunk in _chunks(list(range(1, max_seq + 1, step)), 500):
            for (blob,) in db.execute(f"SELECT dense FROM docs WHERE seq IN ({','.join('?' * len(chunk))})", chunk):
                vector = row_blobs.decode_floats(blob)
                if vector is not None and vector.size == dim and np.isfinite(vector).all():
                    rows.append(vector)
        return graph.Builder(np.vstack(rows)) if rows else None

    def _state_writer(self, base: Structures | None) -> tuple[cache_mod.StateWriter | None, Exception | None]:
        """The new cache state a build writes shard by shard, or (None, why it cannot be written)."""
        try:
            return cache_mod.StateWriter(self.cache_dir, base), None
        except OSError as exc:
            return None, exc

    def _cache_not_written(self, built: Structures, exc: Exception) -> str:
        """Why the rebuilt cache stays in memory. A full disk is said as such: numpy reports a
        short write without errno, so it counts as one when the cache needs more than is free."""
        free = store.free_bytes(self.path)
        needed = sum(a.nbytes for shard in built.shards for a in shard.arrays.values())
        short_write = isinstance(exc, OSError) and exc.errno is None and free is not None and free < needed
        if not (store.is_disk_full(exc) or short_write):
            return f"search cache of {self.path} rebuilt; it cannot be written ({exc}), so it is kept in memory"
        room = f"{free:,} bytes free, it needs about {needed:,}" if free is not None else "no space left"
        return (f"disk full: the search cache could not be written to {self.cache_dir} ({room}); it is kept in "
                "memory for this run: every document is stored, and the first search after space is freed writes it")

    def _dense_graphs(self, built: Structures, writer: cache_mod.StateWriter | None = None,
                      ahead: graph.Builder | None = None) -> None:
        """From APPROXIMATE_DENSE_FROM documents on, the dense side is searched through HNSW
        graphs: one spanning the full shards once there are SPANNING_GRAPH_FROM_SHARDS of them
        (extended as shards fill), and one for every other shard of GRAPH_FROM_ROWS rows or
        more (full shards keep theirs across appends; a shard whose graph faiss cannot build
        stays exact); below it, graphs are dropped. A new graph goes straight into ``writer``'s
        state when there is one; ``ahead``: the spanning graph begun while the shards were made."""
        approximate = _graphs_searched(built.size, built.dim)
        if built.size >= APPROXIMATE_DENSE_FROM and built.dim > 0 and not approximate:
            self._warn(graph.unavailable_note(APPROXIMATE_DENSE_FROM), kind="note")  # the `faiss` extra
        full = 0
        while full < len(built.shards) and built.shards[full].rows == built.shard_rows:
            full += 1
        spanned = (self._spanning_graph(built, full, writer, ahead)
                   if approximate and _spanning(full) else 0)
        for j, shard in enumerate(built.shards[spanned:], start=spanned):
            if "hnsw" in shard.arrays and (shard.graph_span != 1 or not (approximate and shard.rows >= GRAPH_FROM_ROWS)):
                shard.detach_graph()
            if approximate and "hnsw" not in shard.arrays and shard.rows >= max(GRAPH_FROM_ROWS, 1):
                blob = graph.build([shard.dense_rows()], out=writer.graph_file(j) if writer else None)
                if blob is not None:
                    self._attach(shard, blob, built.dim, writer, j)
                    shard.graph_recall = graph.sampled_recall(self._graph_of(shard), shard.dense_rows(),
                                                              graph.EF_SEARCH)

    @staticmethod
    def _attach(shard: Shard, blob: np.ndarray, dim: int, writer: cache_mod.StateWriter | None, j: int,
                span: int = 1, rows: int | None = None) -> None:
        shard.attach_graph(blob, dim, span=span, rows=rows)
        shard.dirty.add("hnsw")
        if writer is not None:  # graph.build wrote it there
            writer.graph_written(j)

    def _spanning_graph(self, built: Structures, full: int, writer: cache_mod.StateWriter | None = None,
                        ahead: graph.Builder | None = None) -> int:
        """The first ``full`` shards under one graph (stored with the first): the one they have
        when it spans them already, else it extended by the shards filled since, else ``ahead``
        when it was handed exactly these shards (or built anew); returns how many shards it
        spans (0: faiss could not build it)."""
        head, members = built.shards[0], built.shards[:full]
        span = head.graph_span if "hnsw" in head.arrays else 0
        if span == full:
            return full
        out = writer.graph_file(0) if writer is not None else None
        blob = None
        if span > 0 and span < full:  # an earlier graph over the first shards: add the newly full ones
            try:
                blob = graph.extend(head.arrays["hnsw"], span * built.shard_rows, built.dim,
                                    [m.dense_rows() for m in members[span:]], out=out)
            except (kernels.DamagedArrays, RuntimeError):  # the layout walk, or faiss's reader, refused it
                blob = None  # built anew below
        release = (lambda i: writer.release(i, "dense")) if writer is not None else None
        if blob is None and span == 0 and ahead is not None and ahead.parts == full:
            blob = ahead.finish(out=out)
        if blob is None:
            blob = graph.build([m.dense_rows() for m in members], out=out, release=release)
        if blob is None:
            return 0
        self._attach(head, blob, built.dim, writer, 0, span=full, rows=full * built.shard_rows)
        for member in members[1:]:
            if "hnsw" in member.arrays:
                member.detach_graph()
        spanned = graph.SpannedRows([m.dense_rows() for m in members], release)  # one part resident at a time
        head.graph_recall = graph.sampled_recall(self._graph_of(head), spanned, graph.default_ef(full))
        return full

    @staticmethod
    def _unit_vectors(members: list[Shard]):
        """The float vectors a graph over these shards rescores with (rows numbered as its labels)."""
        return members[0].dense_rows() if len(members) == 1 else graph.SpannedRows([m.dense_rows() for m in members])

    # -- search ---------------------------------------------------------------------------

    def _query_columns(self, query: SparseVector | QueryColumns) -> QueryColumns:
        """The query's known terms as sorted column ids and weights (once per search: the
        callers below accept either form)."""
        if isinstance(query, QueryColumns):
            return query
        pairs = sorted((self._term_ids[t], w) for t, w in query.items() if w > 0 and t in self._term_ids)
        cols = np.fromiter((c for c, _ in pairs), dtype=np.int64, count=len(pairs))
        weights = np.fromiter((w for _, w in pairs), dtype=np.float32, count=len(pairs))
        return QueryColumns(cols, weights)

    def _sparse_top(self, state: Structures, query: SparseVector | QueryColumns, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Global rows and scores of the exact sparse top-k, shard by shard, merged."""
        cols, weights = self._query_columns(query)
        if cols.size == 0 or state.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)

        def tops(numbers: range) -> list[tuple[np.ndarray, np.ndarray]]:
            buffer = scratch = None  # one group's buffers: groups run at the same time
            out = []
            for slot, j in enumerate(numbers):
                shard = state.shards[j]
                self._validated(shard)
                try:
                    bound = shard.bound_kernel()
                    if bound is not None:
                        if scratch is None:
                            scratch = kernels.QueryScratch(cols, weights, state.shard_rows, len(numbers), k)
                        rows, scores = bound.top(scratch, slot)
                    else:
                        a = shard.arrays
                        if buffer is None:
                            buffer = np.empty(state.shard_rows, dtype=np.float32)
                        rows, scores = kernels.shard_top(a["csc_indptr"], a["csc_indices"], a["csc_data"], shard.rows,
                                                         cols, weights, buffer, k, a.get("dense_terms"),
                                                         a.get("dense_columns"))
                except kernels.DamagedArrays as exc:  # the kernel's own bounds checks: changed since validation
                    self._damaged(exc)
                out.append((rows + shard.start, scores))
            return out

        return kernels.merge_top(self._by_shard_groups(tops, len(state.shards), SPARSE_PARALLEL_FROM), k)

    def _query_top(self, state: Structures, query: SparseVector, k: int, words: int = 0,
                   allow: np.ndarray | None = None, collapse: tuple | None = None) -> kernels.QueryTop | None:
        """The exact sparse top k found by ``_query.c`` (kernels.QueryTop, this thread's, holding
        the result): what _query_columns and _sparse_top give, with each hit's ``words``
        strongest words (``matched``) as _explain gives them (with ``collapse``, :meth:`_collapse`'s:
        the first ``shown`` of them, and the collapsed words in ``words_shown``). One call for
        all shards, or, when shards are searched in groups at once, one call per group (each in
        its thread) with the groups' lists merged here and the words read for the merged hits.
        None when that path does not apply (not built, a shard the kernel does not take, a query
        not a dict of floats)."""
        if kernels._c_query is None or k <= 0 or type(query) is not dict:
            return None
        table = self._shard_table(state)
        if table is False:
            return None
        n_shards = table.n_shards
        # sized for every shard and the words first: the calling thread searches the first group
        # in it, which leaves the query's columns there for the words
        top = self._thread_top(state, table, len(query), k, words)
        try:
            if self._n_groups(n_shards, SPARSE_PARALLEL_FROM) <= 1:
                found = top.run(table, query, self._term_ids, k, words, self._terms, allow, collapse=collapse)
                return top if found is not None else None

            def group_top(numbers: range) -> list:
                part = table.part(numbers.start, numbers.stop)
                mine = self._thread_top(state, part, len(query), k, 0)
                if mine.run(part, query, self._term_ids, k, allow=allow) is None:
                    return [None]
                found = mine.found  # copied: this thread's buffers serve its next search
                return [(mine.out_rows[:found].copy(), mine.out_scores[:found].copy())]

            lists = self._by_shard_groups(group_top, n_shards, SPARSE_PARALLEL_FROM)
            if any(item is None for item in lists):  # every group decides alike: the query is not for C
                return None
            rows, scores = kernels.merge_top(lists, k)
            top.found = n = rows.size
            top.out_rows[:n], top.out_scores[:n], top.out_scores64[:n] = rows, scores, scores
            top.matched, top.words_shown = self._words_of(top, table, rows, words, collapse)
            return top
        except kernels.DamagedArrays as exc:  # the kernel's own bounds checks
            self._damaged(exc)

    def _words_of(self, top: kernels.QueryTop, table: kernels.ShardTable, rows: np.ndarray, words: int,
                  collapse: tuple | None) -> tuple[list | None, list | None]:
        """(matched, collapsed words or None) of given rows for ``top``'s last query (None, None
        when the compiled path does not take them)."""
        got = top.words_of(table, rows, words, self._terms, collapse=collapse) if words else None
        return got if collapse is not None and got is not None else (got, None)

    @staticmethod
    def _collapse(query: SparseVector, shown: int) -> tuple | None:
        """What ``_query.c`` takes to collapse a query's hits' ``shown`` words as
        search.collapse_matches would (None: ``shown`` 0 or a query the compiled path does not take)."""
        if shown <= 0 or type(query) is not dict:
            return None
        return inflections().matches(query).compiled(shown)

    def _shard_table(self, state: Structures) -> kernels.ShardTable | bool:
        """The state's shards as one kernels.ShardTable (made on first use, every shard
        validated), or False when the state holds no rows or a shard is not for the C search."""
        table = state.shard_table
        if table is None and not state.size:
            table = state.shard_table = False
        if table is None:
            for shard in state.shards:
                self._validated(shard)
            bound = [shard.bound_kernel() for shard in state.shards]
            table = False
            if all(bound):
                try:
                    table = kernels.ShardTable(bound, [s.start for s in state.shards],
                                               [(s.arrays["csr_indptr"], s.arrays["csr_indices"], s.arrays["csr_data"])
                                                for s in state.shards])
                except kernels.DamagedArrays:  # row-wise arrays it cannot read raw: the Python path
                    table = False
            state.shard_table = table
        return table

    def _thread_top(self, state: Structures, table: kernels.ShardTable, n_terms: int, k: int,
                    words: int) -> kernels.QueryTop:
        """This thread's kernels.QueryTop, its buffers grown to the most this thread has asked for."""
        top = getattr(self._per_thread, "query_top", None)
        if top is None or not top.fits(table, n_terms, k, words):
            k_most, words_most = (k, words) if top is None else (max(k, top.k), max(words, top.words))
            n_shards, capacity = (table.n_shards, n_terms) if top is None else (max(table.n_shards, top.n_shards),
                                                                                 max(n_terms, top.capacity))
            top = self._per_thread.query_top = kernels.QueryTop(state.shard_rows, n_shards, capacity, k_most,
                                                                words_most, table.n_cols)
        return top

    def _n_groups(self, n_shards: int, parallel_from: int) -> int:
        """How many groups of shards :meth:`_by_shard_groups` searches at once."""
        return min(self.threads, n_shards) if n_shards >= parallel_from else 1

    def _by_shard_groups(self, fn, n_shards: int, parallel_from: int) -> list:
        """``fn(shard numbers)`` over contiguous groups of the shards, one group per search
        thread (the calling thread takes the first) when there are at least ``parallel_from``
        shards, its lists joined in shard order. Every group has finished before this returns
        or raises (they share the shards' buffers)."""
        n_groups = self._n_groups(n_shards, parallel_from)
        if n_groups <= 1:
            return fn(range(n_shards))
        import concurrent.futures  # here: 6 ms of imports a one-shard index (the CLI's usual case) never needs

        bounds = [n_shards * g // n_groups for g in range(n_groups + 1)]
        groups = [range(lo, hi) for lo, hi in zip(bounds, bounds[1:])]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads - 1, thread_name_prefix="d2s-search")
        others = [self._pool.submit(fn, group) for group in groups[1:]]
        try:
            results = [fn(groups[0])]
        finally:
            concurrent.futures.wait(others)
        results += [future.result() for future in others]  # the first error, if any, is raised here
        return [item for part in results for item in part]

    def _validated(self, shard: Shard, postings: bool = True) -> None:
        try:
            shard.validate(postings)
        except CacheUnusable as exc:  # damaged after open: rebuild, and stop this search cleanly
            self._damaged(exc)

    def _damaged(self, exc: Exception | str) -> None:
        """Drop the damaged structures and stop this search cleanly: it reruns after a rebuild."""
        self._structures_cache = None
        self._seen_version = None
        self._warn(f"search cache of {self.path} unusable ({exc}): rebuilding it from the database")
        raise _Retry from None

    def _searching(self, fn, *args):
        """Run a search; when a shard turns out damaged, rebuild once from SQLite and rerun;
        when a commit landed while its hits were confirmed, rerun on what is now committed."""
        state, rebuilt = None, False
        for _ in range(4):
            try:
                return fn(state or self._search_state(), *args)
            except _Stale:
                state = self._seen_version = None
            except _Retry:
                if rebuilt:
                    raise IndexStoreError(f"the search cache of {self.path} cannot be rebuilt") from None
                state, rebuilt = self._rebuild()[0], True
                self._seen_version = None
        raise IndexStoreError(f"{self.path} kept changing during the search: search again")

    @_db_errors
    def prepare_search(self) -> None:
        """Build or extend the search structures now and save them, as the first search after
        a change would: ``ingest`` calls it, so that search does not wait (at 123k documents
        the build takes about 40 s, docs/benchmarks.md)."""
        self._search_state()

    def _carrying(self, shard: Shard, words: WordFilter) -> np.ndarray:
        """Which of the shard's rows pass ``words``: every required word's stored weight at
        least the threshold, no excluded word's (read from the words' posting lists)."""
        a = shard.arrays
        indptr, n_cols = a["csc_indptr"], a["csc_indptr"].size - 1
        allowed = np.ones(shard.rows, dtype=bool)
        for terms, wanted in ((words.required, True), (words.excluded, False)):
            for term in terms:
                col = self._term_ids.get(term)
                carries = np.zeros(shard.rows, dtype=bool)
                if col is not None and col < n_cols:
                    start, end = int(indptr[col]), int(indptr[col + 1])
                    rows = a["csc_indices"][start:end].astype(np.int64)
                    if rows.size and int(rows.max()) >= shard.rows:
                        self._damaged("a posting points past the shard")
                    carries[rows[kernels.decode_weights(a["csc_data"][start:end]) >= np.float32(words.threshold)]] = True
                allowed &= carries if wanted else ~carries
        return allowed

    def _few_allowed(self, state: Structures, query: SparseVector | QueryColumns,
                     allowed: np.ndarray) -> tuple[np.ndarray, QueryColumns] | None:
        """(the allowed rows, the query's columns) when scoring those rows one by one (their own
        postings) reads less than scoring the query's posting lists (a narrow filter: 0.1% of
        the documents), else None; the query's columns are made only for a narrow filter."""
        n_allowed = int(np.count_nonzero(allowed))
        if n_allowed * FEW_ALLOWED_SHARE > state.size:  # a query reads far less than 1/64 of the postings
            return None
        columns = self._query_columns(query)
        stored = sum(int(s.arrays["csr_indptr"][-1]) for s in state.shards)
        row_reads = n_allowed * stored / max(state.size, 1)
        posting_reads = 0
        for shard in state.shards:
            indptr = shard.arrays["csc_indptr"]
            known = columns.cols[columns.cols < shard.n_cols]
            posting_reads += int((indptr[known + 1] - indptr[known]).sum())
        return (np.flatnonzero(allowed), columns) if row_reads < posting_reads else None

    def _allowed_rows_top(self, state: Structures, columns: QueryColumns, k: int,
                          rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exact sparse top-k among ``rows`` (ascending), each scored alone."""
        if rows.size == 0 or columns.cols.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        scores = self._rescore(state, rows, columns)
        positive = np.flatnonzero(scores > 0)
        order = positive[np.lexsort((rows[positive], -scores[positive]))][:k]  # ties by row, as merge_top
        return rows[order].astype(np.int64), scores[order]

    def _filtered_sparse_top(self, state: Structures, query: SparseVector | QueryColumns, k: int,
                             allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exact sparse top-k among the allowed rows, so k hits come back when k pass: the
        rows scored one by one when few, else every shard scored whole with the others zeroed
        before its top k are taken (in C, one call, when the compiled query path is built)."""
        columns = self._query_columns(query)
        if columns.cols.size == 0 or state.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        few = self._few_allowed(state, columns, allowed)
        if few is not None:
            return self._allowed_rows_top(state, columns, k, few[0])
        if isinstance(query, dict):
            top = self._query_top(state, query, k, 0, allow=allowed)
            if top is not None:
                rows, scores, _, _ = top.results()
                return rows, scores
        cols, weights = columns
        buffer = np.empty(state.shard_rows, dtype=np.float32)
        out = []
        for shard in state.shards:
            self._validated(shard)
            a = shard.arrays
            try:
                kernels.accumulate(a["csc_indptr"], a["csc_indices"], a["csc_data"], shard.rows, cols, weights, buffer,
                                   a.get("dense_terms"), a.get("dense_columns"))
            except kernels.DamagedArrays as exc:
                self._damaged(exc)
            scores = buffer[: shard.rows]
            scores[~allowed[shard.start:shard.start + shard.rows]] = 0.0  # top_rows takes positive scores only
            rows = kernels.top_rows(scores, k)
            out.append((rows + shard.start, scores[rows].copy()))
        return kernels.merge_top(out, k)

    def _filtered_dense_top(self, state: Structures, query: np.ndarray, k: int,
                            allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exact dense top-k among the allowed rows (every allowed vector scored: a graph
        search would return fewer than k after filtering); a narrow filter scores only its rows."""
        out = []
        for first, span in state.dense_units():
            members = state.shards[first : first + span]
            head = members[0]
            for shard in members:
                self._validated(shard, postings=False)
            unit_rows = sum(m.rows for m in members)
            mine = allowed[head.start : head.start + unit_rows]
            n_allowed = int(np.count_nonzero(mine))
            if n_allowed == 0:
                continue
            if ("hnsw" in head.arrays and n_allowed >= GRAPH_FILTER_SHARE * unit_rows
                    and self._graph_pays(k, unit_rows, self._ef_for(span))):
                rows, scores = self._graph_search(head, members, query, k, self._ef_for(span), mine)
                if rows.size >= min(k, n_allowed):  # else too few reached: the exact scan below
                    out.append((rows + head.start, scores))
                    continue
            for shard in members:
                out.extend(self._scanned_allowed(shard, query, k, allowed[shard.start : shard.start + shard.rows]))
        if not out:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        return kernels.merge_top(out, k)

    @staticmethod
    def _scanned_allowed(shard: Shard, query: np.ndarray, k: int, mine: np.ndarray) -> list:
        """The shard's exact top-k among its allowed rows (``mine``), every allowed vector scored."""
        n_allowed = int(np.count_nonzero(mine))
        if n_allowed == 0:
            return []
        if n_allowed * 8 < shard.rows:
            local = np.flatnonzero(mine)
            scores = shard.arrays["dense"][local] @ query
            top = kernels.top_rows_any_sign(scores, min(k, n_allowed))
            return [(local[top] + shard.start, scores[top])]
        scores = shard.arrays["dense"] @ query  # in place: picking the allowed rows first copies them
        scores[~mine] = -np.inf
        top = kernels.top_rows_any_sign(scores, min(k, n_allowed))
        return [(top + shard.start, scores[top])]

    @_db_errors
    def sparse_search(self, query: SparseVector, k: int, explain: int = 5, *,
                      words: WordFilter | None = None, filters: SearchFilter | None = None,
                      shown: int = 0) -> list[Hit]:
        """``shown``: the words shown a hit (then ``explain`` is how many terms they are read
        from): the compiled search fills each hit's ``words`` and keeps ``shown`` matched terms."""
        collapse = self._collapse(query, shown) if explain > 0 else None

        def run(state: Structures) -> list[Hit]:
            allowed = self._allowed(state, words, filters)
            few = self._few_allowed(state, query, allowed) if allowed is not None else None
            if few is not None:
                rows, columns = few
                return self._hits(state, *self._allowed_rows_top(state, columns, k, rows), columns, explain)
            # the words in the same call only when _hits.c builds the hits from it (the allowed
            # rows, if any, masked in that call); None for a query it does not take
            top = self._query_top(state, query, k, explain if kernels._c_hits is not None else 0, allow=allowed,
                                  collapse=collapse)
            if top is None and allowed is not None:
                columns = self._query_columns(query)
                return self._hits(state, *self._filtered_sparse_top(state, columns, k, allowed), columns, explain)
            if top is None:
                columns = self._query_columns(query)
                rows, scores = self._sparse_top(state, columns, k)
            elif kernels._c_hits is not None:  # straight from its buffers, with the words it read
                return self._built_hits(state, top.out_rows, top.out_scores64, top.matched, top.found,
                                        top.words_shown)
            else:
                rows, scores, cols, weights = top.results()
                columns = QueryColumns(cols, weights)
            return self._hits(state, rows, scores, columns, explain)

        return self._searching(run)

    @_db_errors
    def two_phase_search(
        self, first: SparseVector, full: SparseVector, k: int, window: int, explain: int = 5, *,
        words: WordFilter | None = None, filters: SearchFilter | None = None,
    ) -> list[Hit]:
        def run(state: Structures) -> list[Hit]:
            allowed = self._allowed(state, words, filters)
            if allowed is not None:
                rows, _ = self._filtered_sparse_top(state, first, max(window, k), allowed)
            else:
                rows, _ = self._sparse_top(state, first, max(window, k))
            if rows.size == 0:
                return []
            columns = self._query_columns(full)
            rescored = self._rescore(state, rows, columns)
            order = np.lexsort((np.arange(rows.size), -rescored))[:k]  # ties keep the first pass's order
            return self._hits(state, rows[order], rescored[order], columns, explain)

        return self._searching(run)

    @_db_errors
    def document_frequencies(self, terms: Iterable[str]) -> tuple[int, dict[str, int]]:
        """(documents in the index, term -> how many of them carry it) for ``terms``: exact,
        from the posting lists' lengths (what a picture's words are ordered by, weight x IDF)."""
        terms = list(terms)

        def run(state: Structures) -> tuple[int, dict[str, int]]:
            known = [t for t in terms if t in self._term_ids]
            counts = frequencies.document_frequencies(state, np.array([self._term_ids[t] for t in known], np.int64))
            return state.size, {t: 0 for t in terms} | dict(zip(known, counts.tolist()))

        return self._searching(run)

    def _rescore(self, state: Structures, rows: np.ndarray, query: SparseVector | QueryColumns) -> np.ndarray:
        """Exact scores of these rows: from their own postings (row-wise) when the window is
        small, else by scoring the shard's query postings and picking (whichever reads less)."""
        cols, weights = self._query_columns(query)
        out = np.zeros(rows.size, dtype=np.float32)
        shard_of = rows // state.shard_rows
        buffer = None
        for j in sorted(set(shard_of.tolist())):
            shard = state.shards[j]
            self._validated(shard)
            picked = np.flatnonzero(shard_of == j)
            picked = picked[np.argsort(rows[picked], kind="stable")]  # read in the shard's order: a sweep, not jumps
            a = shard.arrays
            local = rows[picked] - shard.start
            row_reads = int((a["csr_indptr"][local + 1] - a["csr_indptr"][local]).sum())
            known = cols[cols < shard.n_cols]
            posting_reads = int((a["csc_indptr"][known + 1] - a["csc_indptr"][known]).sum())
            if row_reads <= posting_reads:
                out[picked] = kernels.rescore_rows(a["csr_indptr"], a["csr_indices"], a["csr_data"], local, cols, weights)
            else:
                if buffer is None:
                    buffer = np.empty(state.shard_rows, dtype=np.float32)
                kernels.accumulate(a["csc_indptr"], a["csc_indices"], a["csc_data"], shard.rows, cols, weights, buffer,
                                   a.get("dense_terms"), a.get("dense_columns"))
                out[picked] = buffer[local]
        return out

    @_db_errors
    def dense_search(
        self, vector: np.ndarray, k: int, explain_with: SparseVector | None = None, explain: int = 5, *,
        words: WordFilter | None = None, filters: SearchFilter | None = None,
    ) -> list[Hit]:
        query = np.asarray(vector, dtype=np.float32).reshape(-1)

        def run(state: Structures) -> list[Hit]:
            if state.size == 0:
                return []
            if query.shape[0] != state.dim:
                raise QueryError(f"query vector has {query.shape[0]} dims, the index {state.dim}")
            allowed = self._allowed(state, words, filters)
            if allowed is not None:
                rows, scores = self._filtered_dense_top(state, query, k, allowed)
            else:
                rows, scores = self._dense_top(state, query, k)
            return self._hits(state, rows, scores, explain_with or {}, explain)

        return self._searching(run)

    @_db_errors
    def hybrid_search(self, sparse: SparseVector, vector: np.ndarray, options, *,
                      words: WordFilter | None = None, filters: SearchFilter | None = None,
                      shown: int = 0) -> list[Hit]:
        """Sparse + dense fused here on arrays (the definitions of :func:`search.fuse_minmax` and
        :func:`search.fuse_rrf`, same float64 sums, ties by document id), hits and explanations
        built for the k fused rows only. ``Hit.parts`` holds each run's score. ``shown``: as
        :meth:`sparse_search`'s."""
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        n, k = int(options.candidates), int(options.k)
        collapse = self._collapse(sparse, shown)

        def run(state: Structures) -> list[Hit]:
            if state.size and query.shape[0] != state.dim:
                raise QueryError(f"query vector has {query.shape[0]} dims, the index {state.dim}")
            allowed = self._allowed(state, words, filters)
            top = None if allowed is not None else self._query_top(state, sparse, n)
            if top is None:
                columns = self._query_columns(sparse)
                runs = [("sparse", *(self._filtered_sparse_top(state, sparse, n, allowed) if allowed is not None
                                     else self._sparse_top(state, columns, n)))]
            else:
                rows, scores, cols, weights = top.results()
                columns = QueryColumns(cols, weights)
                runs = [("sparse", rows, scores)]
            dense_top = (functools.partial(self._filtered_dense_top, allowed=allowed) if allowed is not None
                         else functools.partial(self._dense_top, exact=False))
            runs.append(("dense", *(dense_top(state, query, n) if state.size else (np.zeros(0, np.int64),) * 2)))
            if options.fusion == "rrf":
                weights = {name: 1.0 / (int(options.rrf_k) + np.arange(1, rows.size + 1)) for name, rows, _ in runs}
            else:
                weights = {name: ((1 - float(options.alpha)) if name == "sparse" else float(options.alpha))
                           * minmax_normalised(scores) for name, _, scores in runs}
            rows, places = kernels.union_positions([r for _, r, _ in runs])
            totals = np.zeros(rows.size, dtype=np.float64)
            parts = []
            for (name, _, scores), at in zip(runs, places):
                totals[at] += weights[name]
                parts.append((name, at, scores))
            return self._fused_hits(state, rows, totals, parts, columns, k, int(options.explain), top, collapse)

        hits = self._searching(run)
        self.last_fusion = f"client-{options.fusion}"
        return hits

    def _fused_hits(self, state: Structures, rows: np.ndarray, totals: np.ndarray, parts: list,
                    query: SparseVector | QueryColumns, k: int, explain: int,
                    top: kernels.QueryTop | None = None, collapse: tuple | None = None) -> list[Hit]:
        """The k best fused rows, ties by document id (as the client's fusion), as hits; their
        words read by ``top`` (the sparse run's C search) when it found them, and collapsed
        there too with ``collapse``."""
        if rows.size == 0:
            return []
        if rows.size > k:
            kth = np.partition(-totals, k - 1)[k - 1]
            keep = np.flatnonzero(-totals <= kth)  # the top k and whatever ties the k-th
        else:
            keep = np.arange(rows.size)
        ids = self._hits(state, rows[keep], totals[keep], {}, 0)
        ranked = sorted(range(keep.size), key=lambda i: (-ids[i].score, ids[i].id))[:k]
        keep = keep[ranked]
        hits = [ids[i] for i in ranked]
        for name, at, scores in parts:
            where = np.full(rows.size, -1, dtype=np.int64)
            where[at] = np.arange(at.size)
            picked = where[keep]
            found = np.flatnonzero(picked >= 0)
            for i, score in zip(found.tolist(), scores[picked[found]].tolist()):  # float(scores[j]), in one call
                hits[i].parts[name] = score
        if explain and query:
            matched = shown = None
            if top is not None:  # its search found the shard table
                try:
                    matched, shown = self._words_of(top, state.shard_table, rows[keep], explain, collapse)
                except kernels.DamagedArrays as exc:
                    self._damaged(exc)
            for hit, terms in zip(hits, matched if matched is not None else self._explain(state, rows[keep], query, explain)):
                hit.matched = terms
            for hit, words in zip(hits, shown or ()):
                hit.words = words
        return hits

    def _dense_top(self, state: Structures, query: np.ndarray, k: int,
                   exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Global rows and inner products of the dense top-k: per part (a graph and the shards
        it spans, or one shard) through the graph, or exact (every vector, in place) where k is
        a large share of its rows, merged. ``exact=False`` (a hybrid's pool): there, a scan of
        the graph's 8-bit codes, its best rescored (:func:`graph.scanned`)."""
        units = state.dense_units()

        def tops(numbers: range) -> list[tuple[np.ndarray, np.ndarray]]:
            out = []
            for u in numbers:
                first, span = units[u]
                members = state.shards[first : first + span]
                for shard in members:
                    self._validated(shard, postings=False)
                head = members[0]
                ef = self._ef_for(span)
                if "hnsw" in head.arrays and self._graph_pays(k, sum(m.rows for m in members), ef):
                    rows, scores = self._graph_search(head, members, query, k, ef)
                    out.append((rows + head.start, scores))
                    continue
                if not exact and "hnsw" in head.arrays and ranked_once:
                    found = self._code_scan(head, members, query, k)
                    if found is not None:
                        out.append((found[0] + head.start, found[1]))
                        continue
                for shard in members:
                    scores = shard.arrays["dense"] @ query
                    rows = kernels.rows_at_least_kth(scores, k) if ranked_once else kernels.top_rows_any_sign(scores, k)
                    out.append((rows + shard.start, scores[rows]))
            return out

        ranked_once = k > RANK_EACH_SHARD_UP_TO
        found = self._by_shard_groups(tops, len(units), DENSE_PARALLEL_FROM)
        return kernels.select_top(found, k) if ranked_once else kernels.merge_top(found, k)

    @staticmethod
    def _graph_pays(k: int, rows: int, ef: int) -> bool:
        """The plan for one graph's rows: through the graph while the candidates it would rescore
        (max(ef, k)) are under GRAPH_K_SHARE of them (less for a graph over more than a shard's
        rows, GRAPH_SHARE_FALLOFF); past that a scan of every vector is as fast, and exact."""
        share = GRAPH_K_SHARE * min(1.0, cache_mod.SHARD_ROWS / max(rows, 1)) ** GRAPH_SHARE_FALLOFF
        return max(k, ef) < share * rows and graph.searchable()

    def _graph_of(self, shard: Shard) -> graph.OpenedGraph:
        try:
            return shard.dense_graph()
        except CacheUnusable as exc:  # damaged: rebuild, and stop this search cleanly
            self._damaged(exc)

    def _graph_search(self, head: Shard, members: list[Shard], query: np.ndarray, k: int, ef: int,
                      allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The graph stored with ``head`` (over ``members``' rows) searched, among ``allowed`` rows if given."""
        return self._through_graph(head, members, graph.search, query, k, ef, allowed)

    def _code_scan(self, head: Shard, members: list[Shard], query: np.ndarray,
                   k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """About the top k by a scan of that graph's 8-bit codes (:func:`graph.scanned`)."""
        return self._through_graph(head, members, graph.scanned, query, k)

    def _through_graph(self, head: Shard, members: list[Shard], read, *args):
        """``read(the graph stored with head, the members' float vectors, *args)``; a bounds
        check of the walk or scan that fails (the graph changed since it was checked) rebuilds."""
        opened, vectors = self._graph_of(head), self._unit_vectors(members)
        try:
            return read(opened, vectors, *args)
        except kernels.DamagedArrays as exc:
            self._damaged(CacheUnusable(f"shard at row {head.start} is damaged: {exc}"))

    def explain_hits(self, hits: list[Hit], query: SparseVector, explain: int = 5) -> None:
        """Fill ``matched`` of hits (e.g. after fusion) from the cached rows, in place."""
        state = self._search_state()
        rows = self._rows_of_ids(state, [h.id for h in hits])
        known = [(h, r) for h, r in zip(hits, rows) if r >= 0]
        matched = self._explain(state, np.asarray([r for _, r in known], dtype=np.int64), query, explain)
        for (hit, _), terms in zip(known, matched):
            hit.matched = terms

    def _rows_of_ids(self, state: Structures, ids: list[str]) -> list[int]:
        if not ids:
            return []
        db = self._connect(False)
        seq_of: dict[str, int] = {}
        for chunk in _chunks(ids, 500):
            seq_of.update(db.execute(f"SELECT id, seq FROM docs WHERE id IN ({','.join('?' * len(chunk))})", chunk))
        out = []
        for doc_id in ids:
            seq = seq_of.get(doc_id)
            row = -1
            if seq is not None:
                for shard in state.shards:
                    seqs = shard.arrays["seqs"]
                    if shard.rows and seqs[0] <= seq <= seqs[-1]:
                        at = int(np.searchsorted(seqs, seq))
                        row = shard.start + at if at < shard.rows and seqs[at] == seq else -1
                        break
            out.append(row)
        return out

    def _built_hits(self, state: Structures, rows: np.ndarray, scores: np.ndarray, matched: list | None,
                    count: int, words: list | None = None) -> list[Hit]:
        """The first ``count`` hits built by ``_hits.c`` (rows int64, scores float64), with
        their collapsed ``words`` when given."""
        try:
            hits = kernels._c_hits.build(Hit, rows, scores, state.shard_rows, state.hit_sources(), matched, count)
        except ValueError as exc:  # its bounds checks: the cache changed since validation
            self._damaged(exc)
        for hit, shown in zip(hits, words or ()):
            hit.words = shown
        return self._confirmed(state, rows, hits)

    def _confirmed(self, state: Structures, rows: np.ndarray, hits: list[Hit]) -> list[Hit]:
        """``hits`` (of these rows) once SQLite, the source of truth, confirms each one's id,
        path and URL: a cache whose strings were forged, checksums and all, never shows a
        path the index does not hold. A row confirmed once is not asked again while the state
        lasts (a lookup costs about 4 us a row: 0.05 ms for 10 hits at 123,000 documents)."""
        if state.state_dir is None or not hits:  # built from SQLite in this process
            return hits
        if state.confirmed is None:
            state.confirmed = np.zeros(state.size, dtype=np.bool_)
        rows = rows[: len(hits)]
        unconfirmed = np.flatnonzero(~state.confirmed[rows])
        if not unconfirmed.size:
            return hits
        shards, size = state.shards, state.shard_rows
        seqs = [int(shards[row // size].arrays["seqs"][row - shards[row // size].start])
                for row in rows[unconfirmed].tolist()]
        db = self._connect(False)
        stored: dict[int, tuple] = {}
        for chunk in _chunks(seqs, 500):
            for seq, *strings in db.execute(
                f"SELECT seq, id, path, url FROM docs WHERE seq IN ({','.join('?' * len(chunk))})", chunk
            ):
                stored[seq] = tuple(strings)
        for i, seq in zip(unconfirmed.tolist(), seqs):
            hit = hits[i]
            if stored.get(seq) != (hit.id, hit.path, hit.url):
                if self.generation() != (state.index_id, state.generation):
                    raise _Stale  # a commit landed since the search began
                self._damaged(f"the cached id, path or URL of document {seq} is not the database's")
        state.confirmed[rows[unconfirmed]] = True
        return hits

    def _hits(self, state: Structures, rows: np.ndarray, scores: np.ndarray, query: SparseVector | QueryColumns,
              explain: int) -> list[Hit]:
        """Hits from the cached arrays: ids, paths, URLs (confirmed by SQLite), explained words."""
        if len(rows) == 0:
            return []
        matched = self._explain(state, rows, query, explain) if (explain and query) else None
        if kernels._c_hits is not None:  # the same hits built in C (1,000: 0.32 against 0.80 ms warm)
            return self._built_hits(state, np.ascontiguousarray(rows, dtype=np.int64),
                                    np.ascontiguousarray(scores, dtype=np.float64), matched, len(rows))
        return self._confirmed(state, rows, self._python_hits(state, rows, scores, matched))

    def _python_hits(self, state: Structures, rows: np.ndarray, scores: np.ndarray, matched: list | None) -> list[Hit]:
        """:meth:`_hits` without the compiled hit builder."""
        score_list = np.asarray(scores, dtype=np.float64).tolist()
        if len(rows) <= FEW_HITS:  # row by row: no array calls per shard
            shards, size = state.shards, state.shard_rows
            hits = []
            for i, (row, score) in enumerate(zip(rows.tolist(), score_list)):
                shard = shards[row // size]
                doc_id, path, url = shard.row_strings(row - shard.start)
                hits.append(Hit(doc_id, score, path, url, None if matched is None else matched[i]))
            return hits
        shard_of = rows // state.shard_rows
        first = int(shard_of[0])
        if shard_of[-1] == first and np.all(shard_of == first):
            ids, paths, urls = self._hit_strings(state.shards[first], rows - state.shards[first].start)
        else:  # several shards: each one's strings in shard order, then put back in ``rows``' order
            grouped = np.argsort(shard_of, kind="stable")
            ids, paths, urls = [], [], []
            bounds = np.flatnonzero(np.diff(shard_of[grouped])) + 1
            for picked in np.split(grouped, bounds):
                shard = state.shards[int(shard_of[picked[0]])]
                more = self._hit_strings(shard, rows[picked] - shard.start)
                ids += more[0]
                paths += more[1]
                urls += more[2]
            back = np.empty_like(grouped)
            back[grouped] = np.arange(grouped.size)
            at = back.tolist()
            ids, paths, urls = (list(map(strings.__getitem__, at)) for strings in (ids, paths, urls))
        if matched is None:
            return list(map(Hit, ids, score_list, paths, urls))
        return list(map(Hit, ids, score_list, paths, urls, matched))

    @staticmethod
    def _hit_strings(shard: Shard, local: np.ndarray) -> tuple[list[str], list[str], list[str | None]]:
        """ids, paths and URLs (None where a document has none) of a shard's rows."""
        ids = shard.strings("ids", local)
        paths = shard.strings("paths", local)
        has_url = shard.arrays["has_url"][local]
        urls: list[str | None] = [None] * local.size
        if has_url.any():
            with_url = np.flatnonzero(has_url)
            for i, url in zip(with_url.tolist(), shard.strings("urls", local[with_url])):
                urls[i] = url
        return ids, paths, urls

    def _explain(self, state: Structures, rows: np.ndarray, query: SparseVector | QueryColumns, n: int) -> list[list[tuple[str, float]]]:
        """The n terms contributing most to each row's sparse score, largest first (ties by
        term id). Compiled: read from the rows' own postings, each column looked up in a table of
        the query's. Otherwise few rows from their own postings, many from the query's lists."""
        cols, weights = self._query_columns(query)
        out: list[list[tuple[str, float]]] = [[] for _ in rows.tolist()]
        if cols.size == 0 or n <= 0:
            return out
        shard_of = rows // state.shard_rows
        terms = self._terms
        known = len(terms)
        names = names_array = None
        for j in sorted(set(shard_of.tolist())):
            shard = state.shards[j]
            a = shard.arrays
            picked = np.flatnonzero(shard_of == j)
            local = rows[picked] - shard.start
            explained = kernels.explain_slots(a["csr_indptr"], a["csr_indices"], a["csr_data"], local, cols, weights, n)
            if explained is None and picked.size < EXPLAIN_BY_POSTINGS_FROM:
                pairs_of = kernels.explain_rows(a["csr_indptr"], a["csr_indices"], a["csr_data"], local, cols, weights, n)
                for i, pairs in zip(picked.tolist(), pairs_of):
                    out[i] = [(terms[c], v) for c, v in pairs if c < known]
                continue
            if names is None:
                names = tuple(terms[c] if c < known else "" for c in cols.tolist())
            slots, values = explained if explained is not None else kernels.explain_by_postings(
                a["csc_indptr"], a["csc_indices"], a["csc_data"], local, cols, weights, n, a.get("dense_terms"),
                a.get("dense_columns"))
            if kernels._c_hits is not None:  # the lists made in C (1,000 hits' words: 2.1 against 3.5 ms warm)
                kernels._c_hits.explained(out, picked, names, np.ascontiguousarray(slots, dtype=np.int64),
                                          np.ascontiguousarray(values, dtype=np.float32))
                continue
            if names_array is None:
                names_array = np.asarray(names, dtype=object)
            counts = (values > 0).sum(axis=1).tolist()
            for i, row_names, row_values, count in zip(picked.tolist(), names_array[slots].tolist(), values.tolist(), counts):
                out[i] = list(zip(row_names[:count], row_values[:count]))
        return out


class QueryColumns(NamedTuple):
    """A sparse query as the index's sorted column ids and their weights."""

    cols: np.ndarray
    weights: np.ndarray


class _Retry(Exception):
    """A shard was found damaged during a search: rebuild and search again."""


class _Stale(Exception):
    """Another process committed while a search's hits were being confirmed: search again."""


def _first_dim(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT LENGTH(dense) / 4 FROM docs LIMIT 1").fetchone()
    return int(row[0]) if row else 0


def _floats(blob) -> np.ndarray:
    """A stored float32 blob; empty when it is not one (damage)."""
    found = row_blobs.decode_floats(blob)
    return found if found is not None else np.zeros(0, dtype="<f4")


def _owned_bytes(folder: Path) -> int:
    """Bytes of the files the index owns (never a walk of a photo folder it lives in);
    hard-linked cache files are counted once."""
    seen, total = set(), 0
    for name in store.OWNED_NAMES:
        top = folder / name
        if top.is_symlink():
            continue
        files = top.rglob("*") if top.is_dir() else [top]
        for f in files:
            try:
                st = f.lstat()
            except OSError:
                continue
            if f.is_file() and not f.is_symlink() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _graphs_searched(documents: int, dim: int) -> bool:
    """Whether an index of this many documents searches its dense side through graphs."""
    return documents >= APPROXIMATE_DENSE_FROM and dim > 0 and graph.available()


def _spanning(full_shards: int) -> bool:
    """Whether that many full shards share one graph."""
    return full_shards >= max(SPANNING_GRAPH_FROM_SHARDS, 2)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _iso(epoch: str | None) -> str | None:
    if not epoch:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch)))
