"""The embedded default backend: no server, one folder.

SQLite (WAL) is the durable source of truth; every upsert batch is one transaction, so an
interrupted ingest keeps whole batches and a re-run skips them. Search structures are
derived from it and cached in ``cache/``:

* the sparse vectors as a docs x terms matrix kept both column-wise (CSC: term -> postings,
  for exact term-at-a-time scoring) and row-wise (CSR: for rescoring and explanations);
* the dense vectors in a faiss ``IndexFlatIP`` (exact inner product).

The cache is extended with new rows when documents were only added, and rebuilt when
anything was deleted or replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import BundleMismatchError, IndexStoreError
from .base import Document, Hit, IndexIdentity, SparseVector

FORMAT = "d2s-local/1"
_SCHEMA = """
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


@dataclass
class _SearchState:
    """Everything a search reads, built from SQLite rows in ``seq`` order."""

    mutations: int
    max_seq: int
    seqs: np.ndarray  # (n,) int64
    ids: np.ndarray  # (n,) bytes (S64)
    csr: sp.csr_matrix  # docs x (n_terms + 1); column = term id
    csc: sp.csc_matrix
    dense: np.ndarray  # (n, d) float32
    faiss_index: object

    @property
    def size(self) -> int:
        return len(self.seqs)


class LocalBackend:
    name = "local"

    def __init__(self, path: str | Path, threads: int | None = 1) -> None:
        self.path = Path(path).expanduser()
        self.threads = threads
        self._db: sqlite3.Connection | None = None
        self._terms: list[str] = [""]  # term id -> term (ids start at 1)
        self._term_ids: dict[str, int] = {}
        self._state: _SearchState | None = None
        self._state_version: tuple | None = None
        self.identity: IndexIdentity | None = None

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.path / "index.sqlite"

    def exists(self) -> bool:
        return self.db_path.is_file()

    def _connect(self, create: bool) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        if not self.exists():
            if not create:
                raise IndexStoreError(f"no index at {self.path}: ingest some images first (`d2s-search ingest PATH`)")
            self.path.mkdir(parents=True, exist_ok=True)
        try:
            db = sqlite3.connect(str(self.db_path), isolation_level=None, timeout=30)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise IndexStoreError(f"{self.db_path} is not a usable index: {exc}") from None
        self._db = db
        return db

    def _meta(self) -> dict[str, str]:
        return dict(self._connect(False).execute("SELECT key, value FROM meta"))

    def open(self, identity: IndexIdentity | None, create: bool = True) -> None:
        """Open the index; with ``identity`` check (or, when new, record) the bundle."""
        db = self._connect(create)
        meta = self._meta()
        if meta.get("format", FORMAT) != FORMAT:
            raise IndexStoreError(f"{self.path}: unknown index format {meta.get('format')!r}")
        if identity is not None:
            recorded = meta.get("bundle_fingerprint")
            if recorded is None:
                if not create:
                    raise IndexStoreError(f"{self.path} is empty: ingest some images first")
                with _transaction(db):
                    for key, value in (
                        ("format", FORMAT),
                        ("bundle_fingerprint", identity.fingerprint),
                        ("bundle_model", identity.model),
                        ("dense_dim", str(identity.dense_dim)),
                        ("created_at", str(time.time())),
                        ("mutations", "0"),
                    ):
                        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
            elif recorded != identity.fingerprint:
                raise BundleMismatchError(
                    f"index {self.path} was filled with bundle {recorded[:12]} ({meta.get('bundle_model', '?')}), "
                    f"not {identity.fingerprint[:12]} ({identity.model}); their vectors differ: use that bundle, "
                    "or re-ingest the images with this one into another --index"
                )
        self.identity = identity or (
            IndexIdentity(meta["bundle_fingerprint"], int(meta["dense_dim"]), meta.get("bundle_model", ""))
            if "bundle_fingerprint" in meta
            else None
        )
        self._load_terms()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        self._state = None

    def drop(self) -> None:
        self.close()
        if self.path.exists():
            if not (self.path / "index.sqlite").exists():
                raise IndexStoreError(f"{self.path} does not look like a d2s index; not deleting it")
            shutil.rmtree(self.path)

    # -- writing --------------------------------------------------------------------------

    def _load_terms(self) -> None:
        rows = self._connect(False).execute("SELECT id, term FROM terms ORDER BY id").fetchall()
        size = (rows[-1][0] + 1) if rows else 1
        self._terms = [""] * size
        for term_id, term in rows:
            self._terms[term_id] = term
        self._term_ids = {term: term_id for term_id, term in rows}

    def _ensure_terms(self, db: sqlite3.Connection, terms: Iterable[str]) -> None:
        new = sorted({t for t in terms if t not in self._term_ids})
        if not new:
            return
        db.executemany("INSERT OR IGNORE INTO terms(term) VALUES (?)", [(t,) for t in new])
        for term in new:
            (term_id,) = db.execute("SELECT id FROM terms WHERE term = ?", (term,)).fetchone()
            self._term_ids[term] = term_id
            if term_id >= len(self._terms):
                self._terms.extend([""] * (term_id + 1 - len(self._terms)))
            self._terms[term_id] = term

    def upsert(self, docs: Sequence[Document]) -> None:
        if not docs:
            return
        db = self._connect(True)
        with _transaction(db):
            self._ensure_terms(db, (t for d in docs for t in d.sparse))
            replaced = db.execute(
                f"SELECT COUNT(*) FROM docs WHERE id IN ({','.join('?' * len(docs))})", [d.id for d in docs]
            ).fetchone()[0]
            rows = []
            for d in docs:
                items = [(self._term_ids[t], w) for t, w in d.sparse.items() if w > 0]
                items.sort()
                term_ids = np.fromiter((i for i, _ in items), dtype="<i4", count=len(items))
                weights = np.fromiter((w for _, w in items), dtype="<f4", count=len(items))
                rows.append(
                    (
                        d.id, d.path, d.url, int(d.size_bytes), int(d.width), int(d.height),
                        d.ingested_at or time.time(), term_ids.tobytes(), weights.tobytes(),
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
            if replaced:  # rows changed in place: the cached matrices must be rebuilt
                db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'mutations'")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('last_ingest_at', ?)", (str(time.time()),))

    def delete(self, ids: Iterable[str]) -> int:
        ids = list(ids)
        if not ids:
            return 0
        db = self._connect(False)
        removed = 0
        with _transaction(db):
            for chunk in _chunks(ids, 500):
                removed += db.execute(f"DELETE FROM docs WHERE id IN ({','.join('?' * len(chunk))})", chunk).rowcount
            if removed:
                db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'mutations'")
        return removed

    # -- reading --------------------------------------------------------------------------

    def ids_present(self, ids: Iterable[str]) -> set[str]:
        db = self._connect(False)
        present: set[str] = set()
        for chunk in _chunks(list(ids), 500):
            present.update(
                r[0] for r in db.execute(f"SELECT id FROM docs WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            )
        return present

    def get(self, ids: Sequence[str]) -> list[Document]:
        db = self._connect(False)
        found: dict[str, Document] = {}
        for chunk in _chunks(list(ids), 500):
            for row in db.execute(
                "SELECT id, path, url, size_bytes, width, height, ingested_at, term_ids, weights, dense "
                f"FROM docs WHERE id IN ({','.join('?' * len(chunk))})",
                chunk,
            ):
                term_ids = np.frombuffer(row[7], dtype="<i4")
                weights = np.frombuffer(row[8], dtype="<f4")
                found[row[0]] = Document(
                    id=row[0], path=row[1], url=row[2], size_bytes=row[3], width=row[4], height=row[5],
                    ingested_at=row[6],
                    sparse={self._terms[i]: float(w) for i, w in zip(term_ids.tolist(), weights.tolist())},
                    dense=np.frombuffer(row[9], dtype="<f4").copy(),
                )
        return [found[i] for i in ids if i in found]

    def count(self) -> int:
        return self._connect(False).execute("SELECT COUNT(*) FROM docs").fetchone()[0]

    def stats(self) -> dict:
        db = self._connect(False)
        meta = self._meta()
        docs, avg_terms = db.execute("SELECT COUNT(*), AVG(LENGTH(term_ids)) / 4.0 FROM docs").fetchone()
        disk = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
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
        }

    # -- search structures ----------------------------------------------------------------

    def _search_state(self) -> _SearchState:
        db = self._connect(False)
        version = (db.execute("PRAGMA data_version").fetchone()[0], db.total_changes)
        if self._state is not None and version == self._state_version:
            return self._state
        mutations = int(self._meta().get("mutations", "0"))
        max_seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM docs").fetchone()[0]
        state = self._state if self._state is not None else self._load_cache()
        if state is None or state.mutations != mutations or state.max_seq > max_seq:
            state = self._build_state(mutations, since_seq=0, base=None)
            self._save_cache(state)
        elif state.max_seq < max_seq:
            state = self._build_state(mutations, since_seq=state.max_seq, base=state)
            self._save_cache(state)
        self._load_terms()
        self._state, self._state_version = state, version
        return state

    def _build_state(self, mutations: int, since_seq: int, base: _SearchState | None) -> _SearchState:
        db = self._connect(False)
        seqs, ids, indptr, indices, data, dense = [], [], [0], [], [], []
        nnz = 0
        for seq, doc_id, term_ids, weights, vec in db.execute(
            "SELECT seq, id, term_ids, weights, dense FROM docs WHERE seq > ? ORDER BY seq", (since_seq,)
        ):
            seqs.append(seq)
            ids.append(doc_id)
            indices.append(np.frombuffer(term_ids, dtype="<i4"))
            data.append(np.frombuffer(weights, dtype="<f4"))
            nnz += len(term_ids) // 4
            indptr.append(nnz)
            dense.append(np.frombuffer(vec, dtype="<f4"))
        n_cols = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM terms").fetchone()[0]
        dim = self.identity.dense_dim if self.identity else (len(dense[0]) if dense else 0)
        new_csr = sp.csr_matrix(
            (
                np.concatenate(data) if data else np.zeros(0, np.float32),
                np.concatenate(indices) if indices else np.zeros(0, np.int32),
                np.asarray(indptr, dtype=np.int64),
            ),
            shape=(len(seqs), n_cols),
        )
        new_dense = np.vstack(dense).astype(np.float32) if dense else np.zeros((0, dim), np.float32)
        new_seqs = np.asarray(seqs, dtype=np.int64)
        new_ids = np.asarray(ids, dtype="S64")
        if base is not None:
            old = base.csr
            old.resize((old.shape[0], n_cols))
            new_csr = sp.vstack([old, new_csr], format="csr")
            new_dense = np.vstack([base.dense, new_dense])
            new_seqs = np.concatenate([base.seqs, new_seqs])
            new_ids = np.concatenate([base.ids, new_ids])
        return self._make_state(mutations, new_seqs, new_ids, new_csr, new_dense)

    def _make_state(self, mutations, seqs, ids, csr, dense) -> _SearchState:
        import faiss

        if self.threads:
            faiss.omp_set_num_threads(self.threads)
        csr = csr.astype(np.float32)
        csr.sort_indices()
        index = faiss.IndexFlatIP(dense.shape[1] if dense.ndim == 2 and dense.shape[1] else 1)
        if len(dense):
            index.add(np.ascontiguousarray(dense))
        return _SearchState(
            mutations=mutations,
            max_seq=int(seqs[-1]) if len(seqs) else 0,
            seqs=seqs,
            ids=ids,
            csr=csr,
            csc=csr.tocsc(),
            dense=dense,
            faiss_index=index,
        )

    @property
    def _cache_file(self) -> Path:
        return self.path / "cache" / "search-state.npz"

    def _load_cache(self) -> _SearchState | None:
        try:
            with np.load(self._cache_file, allow_pickle=False) as z:
                header = json.loads(str(z["header"]))
                if header.get("format") != FORMAT:
                    return None
                csr = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(header["shape"]))
                return self._make_state(header["mutations"], z["seqs"], z["ids"], csr, z["dense"])
        except (OSError, KeyError, ValueError):
            return None  # missing or damaged cache: rebuilt from SQLite

    def _save_cache(self, state: _SearchState) -> None:
        self._cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._cache_file.with_name(f".{os.getpid()}.tmp.npz")
        header = {"format": FORMAT, "mutations": state.mutations, "shape": list(state.csr.shape)}
        np.savez(
            tmp, header=json.dumps(header), seqs=state.seqs, ids=state.ids, data=state.csr.data,
            indices=state.csr.indices, indptr=state.csr.indptr, dense=state.dense,
        )
        os.replace(tmp, self._cache_file)

    # -- search ---------------------------------------------------------------------------

    def _query_columns(self, query: SparseVector) -> tuple[np.ndarray, np.ndarray]:
        pairs = [(self._term_ids[t], w) for t, w in query.items() if w > 0 and t in self._term_ids]
        cols = np.fromiter((c for c, _ in pairs), dtype=np.int64, count=len(pairs))
        weights = np.fromiter((w for _, w in pairs), dtype=np.float32, count=len(pairs))
        return cols, weights

    def _query_columns_within(self, state: _SearchState, query: SparseVector) -> tuple[np.ndarray, np.ndarray]:
        """Query columns known to the index and covered by the cached matrix."""
        cols, weights = self._query_columns(query)
        keep = cols < state.csr.shape[1]
        return cols[keep], weights[keep]

    def _query_vector(self, state: _SearchState, query: SparseVector) -> np.ndarray:
        qvec = np.zeros(state.csr.shape[1], dtype=np.float32)
        cols, weights = self._query_columns_within(state, query)
        qvec[cols] = weights
        return qvec

    def _sparse_scores(self, state: _SearchState, query: SparseVector) -> np.ndarray | None:
        """Exact dot product of the query with every document (term-at-a-time over postings)."""
        cols, weights = self._query_columns_within(state, query)
        if cols.size == 0 or state.size == 0:
            return None
        return _accumulate_postings(state.csc, cols, weights)

    def sparse_search(self, query: SparseVector, k: int, explain: int = 5) -> list[Hit]:
        state = self._search_state()
        scores = self._sparse_scores(state, query)
        if scores is None:
            return []
        rows = _top_rows(scores, k)
        return self._hits(state, rows, scores[rows], query, explain)

    def two_phase_search(
        self, first: SparseVector, full: SparseVector, k: int, window: int, explain: int = 5
    ) -> list[Hit]:
        state = self._search_state()
        first_scores = self._sparse_scores(state, first)
        if first_scores is None:
            return []
        rows = _top_rows(first_scores, max(window, k))
        rescored = state.csr[rows] @ self._query_vector(state, full)
        order = np.lexsort((rows, -rescored))[:k]
        rows = rows[order]
        return self._hits(state, rows, rescored[order], full, explain)

    def dense_search(
        self, vector: np.ndarray, k: int, explain_with: SparseVector | None = None, explain: int = 5
    ) -> list[Hit]:
        state = self._search_state()
        if state.size == 0:
            return []
        query = np.ascontiguousarray(np.asarray(vector, dtype=np.float32).reshape(1, -1))
        if query.shape[1] != state.dense.shape[1]:
            from ..errors import QueryError

            raise QueryError(f"query vector has {query.shape[1]} dims, the index {state.dense.shape[1]}")
        scores, rows = state.faiss_index.search(query, min(k, state.size))
        keep = rows[0] >= 0
        return self._hits(state, rows[0][keep], scores[0][keep], explain_with or {}, explain)

    def _hits(self, state: _SearchState, rows: np.ndarray, scores: np.ndarray, query: SparseVector, explain: int) -> list[Hit]:
        if len(rows) == 0:
            return []
        ids = [state.ids[r].decode() for r in rows]
        seqs = state.seqs[rows].tolist()
        db = self._connect(False)
        where = ",".join("?" * len(seqs))  # rowid look-ups: the fastest way into SQLite
        info = {r[0]: (r[1], r[2]) for r in db.execute(f"SELECT id, path, url FROM docs WHERE seq IN ({where})", seqs)}
        qvec = self._query_vector(state, query) if (explain and query) else None
        hits = []
        for row, doc_id, score in zip(rows.tolist(), ids, np.asarray(scores).tolist()):
            path, url = info.get(doc_id, ("", None))
            matched = self._explain(state, row, qvec, explain) if qvec is not None else []
            hits.append(Hit(id=doc_id, score=float(score), path=path, url=url, matched=matched))
        return hits

    def _explain(self, state: _SearchState, row: int, qvec: np.ndarray, n: int) -> list[tuple[str, float]]:
        """The n terms contributing most to this document's sparse score."""
        start, end = state.csr.indptr[row], state.csr.indptr[row + 1]
        cols = state.csr.indices[start:end]
        contrib = qvec[cols] * state.csr.data[start:end]
        nonzero = np.flatnonzero(contrib > 0)
        if nonzero.size > n:
            nonzero = nonzero[np.argpartition(-contrib[nonzero], n - 1)[:n]]
        pairs = [(self._terms[c], float(v)) for c, v in zip(cols[nonzero].tolist(), contrib[nonzero].tolist())]
        pairs.sort(key=lambda tc: (-tc[1], tc[0]))
        return pairs


def _top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the k highest positive scores, best first, ties broken by insertion order."""
    bound = _kth_score_lower_bound(scores, k)
    # Every row at or above the bound (at least k of them, ties included), ordered exactly.
    rows = np.flatnonzero(scores >= bound) if bound > 0 else np.flatnonzero(scores > 0)
    if rows.size > 4 * k:
        keep = np.argpartition(-scores[rows], k - 1)[:k]
        kth = scores[rows[keep]].min()
        rows = rows[scores[rows] >= kth]
    order = np.lexsort((rows, -scores[rows]))
    return rows[order][:k]


def _kth_score_lower_bound(scores: np.ndarray, k: int) -> float:
    """A value that at least k scores reach, found on block maxima (a few hundred values)
    instead of a selection over every document: the k-th largest maximum of k distinct
    blocks is reached by at least k documents."""
    n = scores.size
    if k >= n:
        return 0.0
    block = min(64, n // (4 * k))
    if block < 4:
        return float(np.partition(scores, n - k)[n - k])
    whole = n - n % block
    maxima = scores[:whole].reshape(-1, block).max(axis=1)
    if whole < n:
        maxima = np.append(maxima, scores[whole:].max())
    return float(np.partition(maxima, maxima.size - k)[maxima.size - k])


def _accumulate_postings(csc: sp.csc_matrix, cols: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """scores = sum over query terms of weight * posting list (term-at-a-time, exact).

    Calls scipy's C++ ``csc_matvec`` once per term on views of the posting arrays, so no
    posting is copied; falls back to column slicing when that private kernel is missing.
    """
    n_docs = csc.shape[0]
    scores = np.zeros(n_docs, dtype=np.float32)
    if _csc_matvec is None:
        return np.asarray(csc[:, cols] @ weights, dtype=np.float32)
    indptr, indices, data = csc.indptr, csc.indices, csc.data
    for col, weight in zip(cols.tolist(), weights.tolist()):
        start, end = indptr[col], indptr[col + 1]
        if end > start:
            _csc_matvec(
                n_docs, 1, np.array([0, end - start], dtype=indptr.dtype), indices[start:end], data[start:end],
                np.array([weight], dtype=np.float32), scores,
            )
    return scores


try:  # scipy's private kernel; present in every scipy >= 1.8
    from scipy.sparse._sparsetools import csc_matvec as _csc_matvec
except ImportError:  # pragma: no cover
    _csc_matvec = None


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (including KeyboardInterrupt)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _iso(epoch: str | None) -> str | None:
    if not epoch:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch)))
