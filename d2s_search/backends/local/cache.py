"""The search structures of the local index, derived from SQLite and cached as ``.npy`` files.

Documents are cut into shards of :data:`SHARD_ROWS` rows (in ``seq`` order). A shard holds
everything a search reads about its documents, as plain arrays opened with
``np.load(mmap_mode="r")`` (no copy, no rebuild on open; the page cache is shared by every
process):

* ``csc_*``: postings, term -> shard-local row ids (exact term-at-a-time scoring; the score
  array of one shard, 256 KB, stays in the CPU cache); weights in 16 bits, as OpenSearch's
  ``rank_features`` keeps them (Lucene's ``FeatureField`` encoding, :func:`.kernels.encode_weights`),
  so both backends score the same values;
* ``csr_*``: the same matrix row-wise (rescoring and explanations of returned hits), its term
  ids in 16 bits when the shard's columns fit (:func:`csr_index_dtype`), else 32;
* ``dense_terms``/``dense_columns``: the terms in at least half of the shard's documents
  again as dense columns (term x row, 16-bit weights): a scaled add over a column reads in order and
  beats scattering a posting list that long (same products, same order: the same scores);
  at that density a column is no larger than the term's postings;
* ``dense``: the dense vectors in row order, used in place; when the dense side is
  approximate, ``hnsw`` beside them: an HNSW graph serialised by faiss with 8-bit copies of
  the vectors (:mod:`.graph`; its candidates are rescored with ``dense``), over this shard's
  rows or, in the first shard, over every full shard's (the header's ``graph_span``);
* ``ids``/``paths``/``urls``: the strings a hit shows, as one byte blob plus offsets.

Layout: ``cache/state-<generation>-<random>/`` holds ``header.json`` and the arrays;
``cache/current`` names the state in use and the CRC-32 of its header. A state is written
into a temp folder, fsynced, renamed, then ``current`` is replaced atomically. Full shards
never change when documents are only added, so a new state hard-links them from the last.

Bytes on disk are untrusted: ``current`` and the header are checksummed; on open every
file's size is checked and its bytes against the CRC-32 recorded at write, unless a stamp
(:mod:`.cache_stamp`) says they were, with the file in exactly the ``stat`` it has now (a
file changed in place is read again); the postings' structure and id ranges are checked the
first time a shard is scored (:meth:`Shard.validate`: a dense search checks only the per-row
arrays), a graph's layout and links before faiss first reads it (:meth:`Shard.dense_graph`;
a sparse search never walks them); ``index check`` reads every
byte. A process that keeps a state open compares its mapped files' sizes before each search
(:meth:`Structures.mapped_intact`: touching a mapping past the end of a file cut short kills
the process with SIGBUS) and their ``stat`` before it extends the state
(:meth:`Structures.unchanged_on_disk`).
"""

from __future__ import annotations

import functools
import io
import json
import mmap
import os
import re
import shutil
import stat
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...processes import pid_alive
from . import cache_stamp, graph, row_blobs
from .kernels import (
    BoundShard,
    DamagedArrays,
    check_postings,
    encode_weights,
    postings_reads_checked,
)
from .mapped import MappedFiles
from .store import CACHE_POINTER as POINTER
from .store import LEGACY_CACHE, being_written, fsync_dir, is_temp_name, write_atomic, writing

SHARD_ROWS = 65536  # at most 2**16: the postings hold 16-bit in-shard ids
CACHE_FORMAT = "d2s-local-cache/8"  # 3: dense clusters; 4: 16-bit posting ids; 5: per-shard HNSW graphs;
# 6: 16-bit weights (Lucene's FeatureField encoding, kernels.encode_weights); 7: graphs over 8-bit
# copies of the vectors, the float vectors in their own file; 8: 16-bit term ids in the postings
# by document (csr_indices) when the shard's columns fit in them
STALE_SECONDS = 120  # an unreferenced state this old is no longer being written by anyone

STRING_FIELDS = ("ids", "paths", "urls")
MAPPED_FROM = 1 << 16  # files larger than this are memory-mapped; smaller ones are read
# hnsw: present only when the dense side is approximate (see backend.APPROXIMATE_DENSE_FROM),
# beside ``dense``; dense_*: absent in caches written before them (scored from the postings alone).
OPTIONAL = {"hnsw", "dense_terms", "dense_columns"}
DENSE_COLUMN_FRACTION = 0.5  # a term in at least this share of a shard's rows gets a dense column
# Each array's dtype; csr_indices: one of two, the one csr_index_dtype gives for its shard's columns.
DTYPES = {
    "seqs": np.int64, "has_url": np.bool_, "dense": np.float32,
    "csr_indptr": np.int64, "csr_indices": (np.uint16, np.int32), "csr_data": np.uint16,
    "csc_indptr": np.int32, "csc_indices": np.uint16, "csc_data": np.uint16,
    **{f"{s}_blob": np.uint8 for s in STRING_FIELDS}, **{f"{s}_offsets": np.int64 for s in STRING_FIELDS},
    "hnsw": np.uint8, "dense_terms": np.int32, "dense_columns": np.uint16,
}


def csr_index_dtype(n_cols: int) -> np.dtype:
    """The term ids of a shard's postings by document: 16 bits when its ``n_cols`` columns all
    fit (2 bytes a posting instead of 4), else 32."""
    return np.dtype(np.uint16 if n_cols <= row_blobs.SHORT_IDS_BELOW else np.int32)


class CacheUnusable(Exception):
    """The cache on disk cannot be used; the message says why (shown as one warning line)."""


@dataclass
class Shard:
    start: int  # global row of the shard's first document
    arrays: dict[str, np.ndarray]
    files: dict[str, list[int]] = field(default_factory=dict)  # name -> [size, crc32]
    stats: dict[str, os.stat_result] = field(default_factory=dict)  # name -> its file's stat when verified
    mapped: dict[str, tuple] = field(default_factory=dict)  # name -> (its mmap, the file size mapped)
    validated: bool = False  # every array checked (validate)
    rows_validated: bool = False  # the per-row arrays checked (validate(postings=False))
    dirty: set[str] = field(default_factory=set)  # arrays changed since loaded (never hard-linked)
    _views: dict[str, memoryview] = field(default_factory=dict, repr=False)
    # (found, wanted) of the graph's sampled recall at its build (graph.sampled_recall): what
    # index stats reports; kept in the header beside the shard's files, None when not measured
    graph_recall: tuple[int, int] | None = None
    # How many shards the graph in ``hnsw`` spans, this one first: 1, or every full shard of
    # the index (one graph over them searches faster than one per shard at equal recall); the
    # shards it spans after this one have no graph of their own. ``graph_rows``: their rows.
    graph_span: int = 1
    graph_rows: int = 0
    # ``hnsw``'s bytes are ones a build checked (graph.check): built in this process, or read
    # from a file the cache's stamp vouches for (unchanged since this package wrote it)
    graph_vouched: bool = False
    # the postings' id files likewise (build_shard checks what it writes): their ids are not
    # scanned again where every read of them checks each id (kernels.postings_reads_checked)
    postings_vouched: bool = False
    _graph: graph.OpenedGraph | None = field(default=None, repr=False)  # over ``hnsw``, once opened
    _graph_copied: bool = field(default=False, repr=False)  # moved to huge pages (or tried)
    _retired: list = field(default_factory=list, repr=False)  # what an earlier opened graph reads
    _copying: threading.Thread | None = field(default=None, repr=False)  # making the huge-page copy
    _graph_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _bound: BoundShard | None = field(default=None, repr=False)

    @property
    def rows(self) -> int:
        return int(self.arrays["seqs"].shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.arrays["csc_indptr"].shape[0]) - 1

    def validate(self, postings: bool = True) -> None:
        """Structure and id ranges, once per process: what makes the C kernels safe here.
        ``postings=False``: only what a dense search reads (vectors, strings, url flags); the
        postings (most of a cold shard's bytes) wait for the first search that scores them."""
        if self.validated or (not postings and self.rows_validated):
            return
        a, rows = self.arrays, self.rows
        try:
            if not self.rows_validated:
                self._validate_rows()
            if not postings:
                return
            ids = not (self.postings_vouched and postings_reads_checked())
            check_postings(a["csc_indptr"], a["csc_indices"], a["csc_data"], rows, ids)
            check_postings(a["csr_indptr"], a["csr_indices"], a["csr_data"], max(self.n_cols, 1), ids)
            if a["csr_indptr"].shape[0] != rows + 1:
                raise DamagedArrays("row pointers do not match the rows")
            if ("dense_terms" in a) != ("dense_columns" in a):
                raise DamagedArrays("dense columns without their terms")
            if "dense_terms" in a:
                terms = a["dense_terms"]
                if terms.ndim != 1 or a["dense_columns"].shape != (terms.shape[0], rows) or (
                    terms.size and (int(terms[0]) < 0 or int(terms[-1]) >= self.n_cols or np.any(terms[1:] <= terms[:-1]))
                ):
                    raise DamagedArrays("dense columns do not match the terms and rows")
        except (DamagedArrays, KeyError, IndexError) as exc:
            raise CacheUnusable(f"shard at row {self.start} is damaged: {exc}") from None
        self.validated = True

    def _validate_rows(self) -> None:
        """The per-row arrays a hit reads: vectors, url flags, string offsets. Raises DamagedArrays."""
        a, rows = self.arrays, self.rows
        if a["dense"].ndim != 2 or a["dense"].shape[0] != rows:
            raise DamagedArrays("dense vectors do not match the rows")
        if a["has_url"].shape[0] != rows:
            raise DamagedArrays("url flags do not match the rows")
        for name in STRING_FIELDS:
            offsets, blob = a[f"{name}_offsets"], a[f"{name}_blob"]
            if offsets.shape[0] != rows + 1 or offsets[0] != 0 or offsets[-1] != blob.shape[0] or (
                rows and np.any(offsets[1:] < offsets[:-1])
            ):
                raise DamagedArrays(f"{name} offsets do not match")
        self.rows_validated = True

    def bound_kernel(self) -> BoundShard | None:
        """The postings bound to the compiled kernel (None: not built, or arrays it cannot
        take), bound again whenever the shard's arrays were replaced. Call :meth:`validate` first."""
        a = self.arrays
        args = (a["csc_indptr"], a["csc_indices"], a["csc_data"], self.rows, a.get("dense_terms"), a.get("dense_columns"))
        if self._bound is None or not self._bound.bound_to(*args):
            self._bound = BoundShard.bind(*args)
        return self._bound

    def dense_rows(self) -> np.ndarray:
        """The dense vectors in row order (a view of the memory-mapped file)."""
        return np.asarray(self.arrays["dense"])

    def dense_graph(self) -> graph.OpenedGraph | None:
        """This shard's graph opened for search (None: none, or none can be searched here).
        Before faiss walks it, it is checked (neighbour ids, lists and levels: what keeps faiss
        inside the arrays); the compiled walk checks every read itself, so a graph it walks is
        checked only when its bytes are not known to be ones a build checked
        (:attr:`graph_vouched`). The first search walks the mapped file; the second starts
        moving the walk to a copy on huge pages (:func:`graph.huge_page_copy`), made in the
        background and swapped in when done (fewer TLB misses: docs/design-decisions.md, "Graphs
        over 8-bit copies"): a process that answers one query never makes it, and no search
        waits for it."""
        if "hnsw" not in self.arrays or not graph.searchable():
            return None
        with self._graph_lock:
            opened = self._graph
            if opened is None:
                opened = self._graph = self._opened_graph(self.arrays["hnsw"])
            elif not self._graph_copied:
                self._graph_copied = True
                self._copying = threading.Thread(target=self._move_to_huge_pages, args=(self.arrays["hnsw"], opened),
                                                 name="d2s-graph-copy", daemon=True)
                self._copying.start()
        return opened

    def _move_to_huge_pages(self, blob: np.ndarray, opened: graph.OpenedGraph) -> None:
        copy = graph.huge_page_copy(blob)
        if copy is None:
            return
        try:
            moved = self._opened_graph(copy)
        except CacheUnusable:  # changed under the copy: the searches' own checks report it
            return
        with self._graph_lock:
            if self._graph is not opened:  # replaced or dropped meanwhile
                return
            # a search in another thread may still walk the mapping: it stays referenced
            self._retired.append((blob, self.mapped.get("hnsw"), opened))
            self.mapped = {name: m for name, m in self.mapped.items() if name != "hnsw"}  # a new dict: others iterate it
            self.arrays["hnsw"], self._graph = copy, moved

    def _opened_graph(self, blob: np.ndarray) -> graph.OpenedGraph:
        rows, dim = self.graph_rows or self.rows, self.arrays["dense"].shape[1]
        try:
            where = graph.layout(blob, rows, dim)
            if not (self.graph_vouched and graph.compiled_walk()):
                graph.check(blob, where, rows)
        except DamagedArrays as exc:
            raise CacheUnusable(f"shard at row {self.start} is damaged: {exc}") from None
        try:
            return graph.OpenedGraph(blob, where, rows, dim)
        except RuntimeError as exc:  # faiss's own reader refused it
            raise CacheUnusable(f"shard at row {self.start} is damaged: {str(exc).splitlines()[-1]}") from None

    def attach_graph(self, blob: np.ndarray, dim: int, span: int = 1, rows: int | None = None) -> None:
        """Search the dense side through ``blob`` (a serialised graph over this shard's
        vectors, or over the ``rows`` of the ``span`` shards from this one on). Raises
        DamagedArrays when its layout does not fit them."""
        graph.layout(blob, rows if rows is not None else self.rows, dim)
        with self._graph_lock:
            self.arrays["hnsw"] = blob
            self.graph_span, self.graph_rows = span, (rows if span > 1 and rows is not None else 0)
            self._graph, self._graph_copied = None, False
            self.graph_vouched = True  # graph.build and graph.extend check what they return

    def detach_graph(self) -> None:
        """Back to scanning every vector (the graph's file goes)."""
        with self._graph_lock:
            del self.arrays["hnsw"]
            self._graph, self._graph_copied = None, False
        self.graph_recall = None
        self.graph_span, self.graph_rows = 1, 0

    def string(self, name: str, row: int) -> str:
        """One row's string, read with plain indexing (no array calls)."""
        offsets = self.arrays[f"{name}_offsets"]
        return str(self._view(name)[int(offsets[row]) : int(offsets[row + 1])], "utf-8", "surrogatepass")

    def strings(self, name: str, rows: np.ndarray) -> list[str]:
        """The strings of these rows. Many rows: their bytes copied out in one go as rows of
        the longest one's width (:func:`strided_strings`); few rows (where numpy's call costs
        more than it saves), or widths far apart: decoded one by one from a memoryview."""
        offsets = self.arrays[f"{name}_offsets"]
        starts, ends = offsets[rows], offsets[rows + 1]
        blob = self.arrays[f"{name}_blob"]
        if rows.size > STRIDED_FROM:
            gathered = strided_strings(blob, starts, ends - starts)
            if gathered is not None:
                return gathered
        view = self._view(name)
        return [str(view[lo:hi], "utf-8", "surrogatepass") for lo, hi in zip(starts.tolist(), ends.tolist())]

    def _view(self, name: str) -> memoryview:
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = memoryview(np.ascontiguousarray(self.arrays[f"{name}_blob"])).cast("B")
        return view

    def hit_source(self) -> tuple:
        """What the compiled hit builder (``_hits.c``) reads of this shard: (start, rows, ids
        blob, ids offsets, paths blob, paths offsets, urls blob, urls offsets, URL flags)."""
        a = self.arrays
        return (self.start, self.rows, a["ids_blob"], a["ids_offsets"], a["paths_blob"], a["paths_offsets"],
                a["urls_blob"], a["urls_offsets"], a["has_url"])

    def row_strings(self, row: int) -> tuple[str, str, str | None]:
        """The id, path and URL (None where there is none) of one row, read with plain indexing:
        for a few hits, cheaper than :meth:`strings`' array calls."""
        return self.string("ids", row), self.string("paths", row), self.url(row)

    def url(self, row: int) -> str | None:
        return self.string("urls", row) if self.arrays["has_url"][row] else None


def string_arrays(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as the cache keeps them: one UTF-8 blob (lone surrogates kept) and len + 1 offsets."""
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


# Above this many rows one strided copy beats decoding row by row (500 ids: 54 vs 109 us).
STRIDED_FROM = 32


def strided_strings(blob: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[str] | None:
    """UTF-8 strings at ``starts``/``lengths`` of ``blob`` (validated offsets), copied out as
    one block of fixed-width rows (the longest string's width; a row near the blob's end
    starts its window earlier), decoded once and cut. None when the block would be more than
    about twice the strings' bytes (one very long path among short ones)."""
    n = starts.size
    width = int(lengths.max()) if n else 0
    if width == 0:
        return [""] * n
    if blob.ndim != 1 or blob.strides[0] != 1 or width > blob.size or width * n > 2 * int(lengths.sum()) + 16 * n:
        return None
    windows = np.lib.stride_tricks.as_strided(blob, shape=(blob.size - width + 1, width), strides=(1, 1),
                                              writeable=False)
    first = np.minimum(starts, blob.size - width)  # numpy checks these indices against the windows
    block = windows[first]
    at = (np.arange(n, dtype=np.int64) * width + (starts - first)).tolist()
    # latin-1 maps each byte to one character: cut by byte positions, exact for ASCII rows.
    text = block.tobytes().decode("latin-1")
    out = [text[lo : lo + size] for lo, size in zip(at, lengths.tolist())]
    if int(block.max()) >= 128:  # some row (or a neighbour's bytes in its window) is not ASCII
        for i in np.flatnonzero(block.max(axis=1) >= 128).tolist():
            out[i] = out[i].encode("latin-1").decode("utf-8", "surrogatepass")
    return out


@dataclass
class Structures:
    """Every shard of one index generation."""

    index_id: str
    generation: int
    mutations: int
    max_seq: int
    dim: int
    shards: list[Shard]
    shard_rows: int  # every shard but the last holds exactly this many rows
    state_dir: Path | None = None  # None: in memory only (the cache could not be written)
    header_crc: int | None = None  # the CRC-32 of its header.json, as ``current`` names it
    _hit_sources: tuple | None = field(default=None, repr=False, compare=False)
    confirmed: np.ndarray | None = field(default=None, repr=False, compare=False)  # per row: strings SQLite confirmed
    _mapped: MappedFiles | None = field(default=None, repr=False, compare=False)
    # kernels.ShardTable of every shard once validated and bound (False: a shard the kernel does
    # not take), made by the backend's first small-k sparse search; the shards never change
    shard_table: object = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return sum(s.rows for s in self.shards)

    def hit_sources(self) -> tuple:
        """Every shard's :meth:`Shard.hit_source`, made once (the shards never change)."""
        if self._hit_sources is None:
            self._hit_sources = tuple(s.hit_source() for s in self.shards)
        return self._hit_sources

    def dense_units(self) -> list[tuple[int, int]]:
        """(first shard, shards) of each part the dense side searches as one: a graph and the
        shards it spans, or a shard of its own (graph or none)."""
        units, j = [], 0
        while j < len(self.shards):
            span = self.shards[j].graph_span if "hnsw" in self.shards[j].arrays else 1
            units.append((j, span))
            j += span
        return units

    def locate(self, row: int) -> tuple[Shard, int]:
        shard = self.shards[row // self.shard_rows]
        return shard, row - shard.start

    def mapped_intact(self) -> bool:
        """Whether no memory-mapped file was written or cut short since it was mapped (see
        :mod:`.mapped`): a file cut short under a mapping would kill the process on the first
        read past its new end."""
        if self._mapped is None:
            self._mapped = MappedFiles([
                (self.state_dir / f"shard-{j:05d}-{name}.npy" if self.state_dir else None, mapping, size,
                 shard.stats.get(name))
                for j, shard in enumerate(self.shards) for name, (mapping, size) in shard.mapped.items()
            ])
        return self._mapped.intact()

    def unchanged_on_disk(self) -> bool:
        """Whether every file of the state still has the ``stat`` it had when verified."""
        if self.state_dir is None:
            return True
        try:
            return all(
                _same_file(os.stat(self.state_dir / f"shard-{j:05d}-{name}.npy", follow_symlinks=False), st)
                for j, shard in enumerate(self.shards) for name, st in shard.stats.items()
            )
        except OSError:
            return False


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return cache_stamp.entry(a, 0) == cache_stamp.entry(b, 0)


# -- building shards from SQLite rows --------------------------------------------------------


def parse_rows(rows: list[tuple], n_cols: int, dim: int) -> tuple[list[tuple], list[int]]:
    """(seq, id, path, url, term_ids, weights, dense) SQLite rows with their blobs decoded,
    and the seqs of rows whose stored vectors are damaged (bad lengths, term ids out of
    range): those are left out, never handed to a kernel."""
    good, bad = [], []
    for row in rows:
        w, v = row_blobs.decode_floats(row[5]), row_blobs.decode_floats(row[6])
        t = row_blobs.decode_term_ids(row[4], w.nbytes) if w is not None else None
        if t is None or v is None:
            bad.append(row[0])
            continue
        if t.size != w.size or v.size != dim or (t.size and (int(t.min()) < 1 or int(t.max()) >= n_cols)):
            bad.append(row[0])
            continue
        good.append((row[0], row[1], row[2], row[3], t, w, v))
    return good, bad


def build_shard(start: int, parsed: list[tuple], n_cols: int, dim: int) -> Shard:
    """A shard from rows decoded by :func:`parse_rows`."""
    import scipy.sparse as sp

    n = len(parsed)
    lengths = np.fromiter((r[4].size for r in parsed), dtype=np.int64, count=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    csr = sp.csr_matrix(
        (np.concatenate([r[5] for r in parsed]) if n else np.zeros(0, np.float32),
         np.concatenate([r[4] for r in parsed]) if n else np.zeros(0, np.int32), indptr),
        shape=(n, n_cols),
    )
    csr.sort_indices()
    csc = csr.tocsc()
    csc.sort_indices()
    arrays = {
        "seqs": np.fromiter((r[0] for r in parsed), dtype=np.int64, count=n),
        "dense": np.vstack([r[6] for r in parsed]).astype(np.float32) if n else np.zeros((0, dim), np.float32),
        "csr_indptr": csr.indptr.astype(np.int64), "csr_indices": csr.indices.astype(csr_index_dtype(n_cols)),
        "csr_data": encode_weights(csr.data),
        "csc_indptr": csc.indptr.astype(np.int32), "csc_indices": csc.indices.astype(np.uint16),
        "csc_data": encode_weights(csc.data),
        "has_url": np.fromiter((r[3] is not None for r in parsed), dtype=np.bool_, count=n),
    }
    arrays["dense_terms"], arrays["dense_columns"] = dense_columns(arrays["csc_indptr"], arrays["csc_indices"],
                                                                   arrays["csc_data"], n)
    for name, column in (("ids", 1), ("paths", 2), ("urls", 3)):
        arrays[f"{name}_blob"], arrays[f"{name}_offsets"] = string_arrays([r[column] or "" for r in parsed])
    shard = Shard(start=start, arrays=arrays)
    shard.validate()
    return shard


def dense_columns(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(terms, their columns as a terms x rows array of ``data``'s type, 0 where a row lacks
    the term) for the terms whose posting lists cover at least :data:`DENSE_COLUMN_FRACTION`
    of the rows."""
    terms = np.flatnonzero(np.diff(indptr) >= max(1, DENSE_COLUMN_FRACTION * rows)).astype(np.int32)
    columns = np.zeros((terms.size, rows), dtype=data.dtype)
    for slot, col in enumerate(terms.tolist()):
        start, end = int(indptr[col]), int(indptr[col + 1])
        columns[slot, indices[start:end]] = data[start:end]
    return terms, columns


# -- writing ----------------------------------------------------------------------------------


def save(cache_dir: Path, structures: Structures, reuse: Structures | None) -> Path:
    """Write a new state (reusing ``reuse``'s unchanged shard files by hard link), point
    ``current`` at it and remove states nobody uses. Returns the state folder."""
    writer = StateWriter(cache_dir, reuse)
    try:
        for j, shard in enumerate(structures.shards):
            writer.add(j, shard, map_back=False)
        return writer.commit(structures)
    finally:
        writer.close()


class StateWriter:
    """A new state written shard by shard as a build makes them (:meth:`add`: a shard's files
    written, or hard-linked from ``reuse`` when unchanged, and its arrays swapped for mappings
    of them, so a build holds one shard in memory, not the index), its graphs written by
    :func:`graph.build` straight into :meth:`graph_file`, then :meth:`commit`: the header,
    the rename, ``current``. :meth:`close` removes a state never committed."""

    def __init__(self, cache_dir: Path, reuse: Structures | None) -> None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        remove_leftovers(cache_dir)
        pointer = cache_dir / POINTER
        if pointer.is_dir() and not pointer.is_symlink() and not any(pointer.iterdir()):
            pointer.rmdir()  # an empty folder where the pointer belongs holds nothing to lose
        self.cache_dir, self.reuse = cache_dir, reuse
        self.tmp = cache_dir / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._writing = writing(self.tmp.name)  # not a leftover to another writer of this process
        self._writing.__enter__()
        self.files: dict[int, dict[str, list[int]]] = {}  # shard -> file name -> [size, crc]
        self.known: dict[str, int] = {}  # file name -> CRC, for the files whose bytes are known to hold it
        self._maps: dict[tuple[int, str], object] = {}
        self.committed: Path | None = None
        try:
            self.tmp.mkdir()
        except BaseException:
            self._writing.__exit__(None, None, None)
            raise

    def add(self, j: int, shard: Shard, map_back: bool = True) -> None:
        """Shard ``j``'s arrays but its graph into the state; ``map_back``: the arrays written
        are replaced by read-only mappings of their files (their memory freed)."""
        old = _same_shard(self.reuse, j, shard)
        files = self.files.setdefault(j, {})
        for name, array in list(shard.arrays.items()):
            if name == "hnsw" or name in files:
                continue
            target = self.tmp / f"shard-{j:05d}-{name}.npy"
            if self._link(old, name, shard, target, files):
                continue
            files[name] = _write_array(target, array)
            self.known[target.name] = files[name][1]
            if map_back and array.nbytes > MAPPED_FROM:
                mapped = np.load(target, mmap_mode="r", allow_pickle=False)  # written just now by this process
                self._maps[(j, name)] = mapped._mmap
                shard.arrays[name] = np.asarray(mapped)

    def _link(self, old: Shard | None, name: str, shard: Shard, target: Path, files: dict) -> bool:
        if old is None or name not in old.files or name in shard.dirty:
            return False
        source = self.reuse.state_dir / target.name
        try:
            # still the file verified when it was opened: then its copy needs no reading
            verified = name in old.stats and _same_file(os.stat(source, follow_symlinks=False), old.stats[name])
            os.link(source, target)
        except OSError:
            return False
        files[name] = old.files[name]
        if verified:
            self.known[target.name] = files[name][1]
        return True

    def release(self, j: int, name: str) -> None:
        """Drop the pages of shard ``j``'s mapped ``name`` from this process (the page cache
        keeps them): a graph's build reads every vector once, and need not hold them all."""
        mapping = self._maps.get((j, name))
        if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapping.madvise(mmap.MADV_DONTNEED)

    def graph_file(self, j: int) -> Path:
        """Where shard ``j``'s graph is written (:func:`graph.build`'s ``out``); then :meth:`graph_written`."""
        return self.tmp / f"shard-{j:05d}-hnsw.npy"

    def graph_written(self, j: int) -> None:
        path = self.graph_file(j)
        self.files.setdefault(j, {})["hnsw"] = [path.stat().st_size, _crc_file(path)]
        self.known[path.name] = self.files[j]["hnsw"][1]

    def commit(self, structures: Structures) -> Path:
        """The state complete (every shard added; graphs not written yet are written or linked
        now), renamed into place and named by ``current``. Returns the state folder."""
        try:
            shards_meta = []
            for j, shard in enumerate(structures.shards):
                self.add(j, shard, map_back=False)  # any not added yet
                files = self.files[j]
                if "hnsw" in shard.arrays and "hnsw" not in files:
                    target = self.graph_file(j)
                    if not self._link(_same_shard(self.reuse, j, shard), "hnsw", shard, target, files):
                        files["hnsw"] = _write_array(target, shard.arrays["hnsw"])
                        self.known[target.name] = files["hnsw"][1]
                elif "hnsw" in files and "hnsw" not in shard.arrays:  # written, then dropped
                    self.graph_file(j).unlink()
                    del files["hnsw"]
                shard.files = dict(files)
                meta = {"start": shard.start, "rows": shard.rows, "files": shard.files}
                if shard.graph_recall is not None and "hnsw" in shard.arrays:
                    meta["graph_recall"] = list(shard.graph_recall)
                if shard.graph_span != 1 and "hnsw" in shard.arrays:
                    meta["graph_span"] = shard.graph_span
                shards_meta.append(meta)
            header = {
                "format": CACHE_FORMAT, "index_id": structures.index_id, "generation": structures.generation,
                "mutations": structures.mutations, "max_seq": structures.max_seq, "dim": structures.dim,
                "shard_rows": structures.shard_rows, "shards": shards_meta, "written_at": time.time(),
            }
            header_bytes = json.dumps(header).encode()
            with open(self.tmp / "header.json", "wb") as f:
                f.write(header_bytes)
                os.fsync(f.fileno())
            fsync_dir(self.tmp)
            final = self.cache_dir / f"state-{structures.generation}-{uuid.uuid4().hex[:8]}"
            os.rename(self.tmp, final)
            self.committed = final
        finally:
            self.close()
        fsync_dir(self.cache_dir)
        write_atomic(self.cache_dir / POINTER, f"{final.name} {zlib.crc32(header_bytes)}\n".encode())
        reuse = self.reuse
        remove_unused_states(self.cache_dir, keep={final.name, reuse.state_dir.name if reuse and reuse.state_dir else ""})
        _stamp_written(final, zlib.crc32(header_bytes), self.known)  # after the removals: they move shared files' ctime
        legacy = self.cache_dir / LEGACY_CACHE  # replaced by the shards just written
        if legacy.is_file() and not legacy.is_symlink():
            legacy.unlink()
        return final

    def close(self) -> None:
        """The temp folder removed unless committed (arrays mapped from it stay readable: the
        mappings hold the files); idempotent."""
        if self._writing is None:
            return
        if self.committed is None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self._writing.__exit__(None, None, None)
        self._writing = None


def _stamp_written(state_dir: Path, header_crc: int, known: dict[str, int]) -> None:
    """Stamp the files just written or linked (:mod:`.cache_stamp`), so that the next open
    reads none of them: past the file system clock's tick in which they last changed."""
    stamp = cache_stamp.Stamp(state_dir, header_crc)
    try:
        newest = max((os.stat(state_dir / name, follow_symlinks=False).st_ctime_ns for name in known), default=0)
        stamp.wait_past(newest)
        for name, crc in known.items():
            stamp.add(name, os.stat(state_dir / name, follow_symlinks=False), crc)
        stamp.commit()
    except OSError:
        stamp.discard()


def _current_header(pointer: Path) -> tuple[Path, str, dict]:
    """(state folder, header CRC as written, header) of the state ``pointer`` names, its
    checksum checked; raises CacheUnusable, OSError or ValueError."""
    name, crc = pointer.read_text(encoding="ascii").split()
    if not name.startswith("state-") or "/" in name:
        raise CacheUnusable(f"{pointer} names no cache state")
    state_dir = pointer.parent / name
    header_bytes = (state_dir / "header.json").read_bytes()
    if zlib.crc32(header_bytes) != int(crc):
        raise CacheUnusable("the cache header does not match its checksum")
    return state_dir, crc, json.loads(header_bytes)


def recorded_recalls(cache_dir: Path) -> list[tuple[int, int]]:
    """The valid (found, wanted) of the graphs in the current state, from its header alone
    (nothing else read or built: what index stats shows); [] when there is none."""
    try:
        _, _, header = _current_header(cache_dir / POINTER)
        if header.get("format") != CACHE_FORMAT:
            return []
        shards = header["shards"]
        values = [recorded_recall(meta.get("graph_recall")) for meta in shards if "hnsw" in meta["files"]]
    except (CacheUnusable, OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [v for v in values if v is not None]


def recorded_recall(value: object) -> tuple[int, int] | None:
    """A graph's (found, wanted) as read from a header: None unless two integers with
    0 <= found <= wanted and wanted at most what a build samples (a bad value is only unknown)."""
    if not isinstance(value, list) or len(value) != 2 or not all(type(x) is int for x in value):
        return None
    found, wanted = value
    if not 0 <= found <= wanted or not 0 < wanted <= graph.RECALL_SAMPLE * graph.RECALL_K:
        return None
    return found, wanted


def _same_shard(reuse: Structures | None, j: int, shard: Shard) -> Shard | None:
    if reuse is None or reuse.state_dir is None or j >= len(reuse.shards):
        return None
    old = reuse.shards[j]
    same = old.start == shard.start and old.rows == shard.rows and old.arrays["seqs"] is shard.arrays["seqs"]
    return old if same else None


def _write_array(path: Path, array: np.ndarray) -> list[int]:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return [path.stat().st_size, _crc_file(path)]


def _crc_file(path: Path) -> int:
    with open(path, "rb") as f:
        return _crc_open(f)


# -- reading ----------------------------------------------------------------------------------


def load(cache_dir: Path, verify: bool = True) -> Structures:
    """The state ``current`` points at, memory-mapped; CacheUnusable (with the reason) when
    it is missing or damaged. Never raises anything else for bad bytes. Every file's bytes
    are checked against their CRC unless a stamp vouches for them (``verify=False``: left to
    the caller, `index check`, which reads them all anyway)."""
    pointer = cache_dir / POINTER
    stamp: cache_stamp.Stamp | None = None
    try:
        if not pointer.exists() and not pointer.is_symlink():
            raise CacheUnusable("no cache yet")
        if not pointer.is_file() or pointer.is_symlink():
            raise CacheUnusable(f"{pointer} is not a regular file")
        state_dir, crc, header = _current_header(pointer)
        if header.get("format") != CACHE_FORMAT or header.get("shard_rows") != SHARD_ROWS:
            raise CacheUnusable("the cache was written in another format")
        stamped = cache_stamp.read(state_dir, int(crc)) if verify else None

        def begin_stamp() -> cache_stamp.Stamp:  # before the first file read is looked at (see cache_stamp)
            nonlocal stamp
            stamp = stamp or cache_stamp.Stamp(state_dir, int(crc))
            return stamp

        shards, start = [], 0
        for meta in header["shards"]:
            if meta["start"] != start:
                raise CacheUnusable("the cache's shards do not follow each other")
            shard = Shard(start=start, arrays={}, files=meta["files"])
            for name_, (size, crc_) in meta["files"].items():
                if name_ not in DTYPES:
                    raise CacheUnusable(f"unknown cache array {name_}")
                path = state_dir / f"shard-{len(shards):05d}-{name_}.npy"
                array, st, mapping = _open_array(path, size, DTYPES[name_], crc_, stamped, begin_stamp)
                shard.arrays[name_], shard.stats[name_] = array, st
                if mapping is not None:
                    shard.mapped[name_] = (mapping, size)
            missing = set(DTYPES) - OPTIONAL - set(shard.arrays)
            if missing:
                raise CacheUnusable(f"the cache lacks {sorted(missing)[0]}")
            ids, wanted = shard.arrays["csr_indices"].dtype, csr_index_dtype(shard.n_cols)
            if ids != wanted:  # exactly the width the shard's columns call for
                raise CacheUnusable(f"shard-{len(shards):05d}-csr_indices.npy holds {ids}, not {wanted}")
            vouched = {name_ for name_ in shard.arrays if stamped is not None and stamped.get(
                f"shard-{len(shards):05d}-{name_}.npy") == cache_stamp.entry(shard.stats[name_], shard.files[name_][1])}
            shard.postings_vouched = {"csc_indices", "csr_indices"} <= vouched
            if "hnsw" in shard.arrays:  # its layout is walked with its links, by the first search it serves
                shard.graph_recall = recorded_recall(meta.get("graph_recall"))
                shard.graph_vouched = "hnsw" in vouched
            if shard.rows != meta["rows"] or (shard.rows > SHARD_ROWS) or (
                shard.rows < SHARD_ROWS and meta is not header["shards"][-1]
            ):
                raise CacheUnusable("the cache's shard sizes are inconsistent")
            shards.append(shard)
            start += shard.rows
        _apply_spans(shards, header["shards"])
        if stamp is not None:  # every file now checked: the files read, and those the old stamp vouched for
            for j, shard in enumerate(shards):
                for name_, st in shard.stats.items():
                    file_name, crc_ = f"shard-{j:05d}-{name_}.npy", shard.files[name_][1]
                    if stamped.get(file_name) == cache_stamp.entry(st, crc_):
                        stamp.files[file_name] = stamped[file_name]
            stamp.commit()
            stamp = None
        return Structures(
            index_id=str(header["index_id"]), generation=int(header["generation"]),
            mutations=int(header["mutations"]), max_seq=int(header["max_seq"]), dim=int(header["dim"]),
            shards=shards, shard_rows=SHARD_ROWS, state_dir=state_dir, header_crc=int(crc),
        )
    except CacheUnusable:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise CacheUnusable(f"the cache is damaged ({type(exc).__name__}: {exc})") from None
    finally:
        if stamp is not None:
            stamp.discard()


def _apply_spans(shards: list[Shard], metas: list[dict]) -> None:
    """Each graph's span as the header gives it: a whole number of full shards from its own on,
    none of the others holding a graph; anything else is damage (CacheUnusable)."""
    for j, (shard, meta) in enumerate(zip(shards, metas)):
        if "hnsw" not in shard.arrays:
            if "graph_span" in meta:
                raise CacheUnusable("the cache gives a graph span to a shard without a graph")
            continue
        span = meta.get("graph_span", 1)
        if type(span) is not int or span < 1 or j + span > len(shards):
            raise CacheUnusable("the cache's graph span is out of range")
        if span > 1:
            spanned = shards[j : j + span]
            if any(s.rows != SHARD_ROWS for s in spanned) or any("hnsw" in s.arrays for s in spanned[1:]):
                raise CacheUnusable("the cache's graph spans shards it cannot")
            shard.graph_span, shard.graph_rows = span, span * SHARD_ROWS


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_array(path: Path, size: int, dtype, crc: int, stamped: dict | None,
                begin_stamp) -> tuple[np.ndarray, os.stat_result, object]:
    """The array stored in ``path`` (of ``dtype``, or of one of a tuple of them): read when
    small, memory-mapped otherwise (np.memmap cannot map an empty array), all through one
    descriptor; its file's stat; the mapping (None: read).
    Its bytes are checked against ``crc`` unless ``stamped`` (None: not here) vouches for the
    file in the state it has now; one that is read is added to the stamp ``begin_stamp()``
    gives (begun before the file's stat is taken again)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        if os.path.islink(path):
            raise CacheUnusable(f"{path.name} is not a regular file") from None
        raise
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(fd)
        read = stamped is not None and stamped.get(path.name) != cache_stamp.entry(st, crc)
        if read:
            stamp = begin_stamp()
            st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheUnusable(f"{path.name} is not a regular file")
        if st.st_size != size:
            raise CacheUnusable(f"{path.name} has {st.st_size} bytes, {size} were written")
        raw = file.read(size + 1) if size <= MAPPED_FROM else None
        if read and (zlib.crc32(raw) if raw is not None else _crc_open(file)) != crc:
            raise CacheUnusable(f"{path.name} does not match its checksum")
        if read:
            stamp.add(path.name, st, crc)
        source = io.BytesIO(raw) if raw is not None else file
        source.seek(0)
        shape, fortran, stored, offset = _array_header(source, path.name)
        allowed = [np.dtype(t) for t in (dtype if isinstance(dtype, tuple) else (dtype,))]
        if stored not in allowed:
            raise CacheUnusable(f"{path.name} holds {stored}, not {' or '.join(map(str, allowed))}")
        count = 1
        for n in shape:
            count *= n
        if (fortran and len(shape) > 1) or offset + count * stored.itemsize != size:
            raise CacheUnusable(f"{path.name} does not hold the array its header describes")
        if raw is not None or count == 0:
            return np.frombuffer(raw or b"", dtype=stored, count=count, offset=offset if raw else 0).reshape(shape), st, None
        # mapped directly (np.memmap's constructor costs ~40 us a file: 274 files open a 1M index),
        # read-only, the whole file as its size was checked
        mapping = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
        return np.frombuffer(mapping, dtype=stored, count=count, offset=offset).reshape(shape), st, mapping


# The header np.save writes, read without numpy's parser (ast.literal_eval: ~70 us a file);
# anything else goes to numpy's parser, which checks it as strictly.
# The shape is a tuple's repr: (), (n,) or (n, m, ...); "(n)" is an int to numpy's parser, refused.
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=]?[a-z][0-9]{1,2})', 'fortran_order': (False|True), "
                         rb"'shape': \(([0-9]{1,19},|[0-9]{1,19}(?:, [0-9]{1,19})+)?\), \} *\n")
_NPY_MAGIC = b"\x93NUMPY"


@functools.lru_cache(maxsize=64)
def _npy_dtype(descr: bytes) -> np.dtype:
    return np.dtype(descr.decode("ascii"))


def _array_header(source, name: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, offset of the data) of the .npy file ``source`` (at its
    start); CacheUnusable for a version this package does not write."""
    lead = source.read(12)
    if lead[:6] != _NPY_MAGIC or lead[6:8] not in (b"\x01\x00", b"\x02\x00"):
        raise CacheUnusable(f"{name} is not an array this package wrote")
    start = 10 if lead[6] == 1 else 12
    length = int.from_bytes(lead[8:start], "little")
    source.seek(start)
    text = source.read(length)
    found = _NPY_HEADER.fullmatch(text) if len(text) == length else None
    if found is None:  # another writer's spacing, or damage: numpy's own parser decides
        source.seek(8)
        read = np.lib.format.read_array_header_1_0 if start == 10 else np.lib.format.read_array_header_2_0
        shape, fortran, stored = read(source)
        return shape, fortran, stored, source.tell()
    shape = tuple(int(n) for n in found.group(3).split(b",") if n.strip()) if found.group(3) else ()
    return shape, found.group(2) == b"True", _npy_dtype(found.group(1)), start + length


def _crc_open(f) -> int:
    crc = 0
    f.seek(0)
    while chunk := f.read(1 << 22):
        crc = zlib.crc32(chunk, crc)
    return crc


def verify_all(structures: Structures) -> list[str]:
    """Every byte of every cached file against the CRC recorded at write (for `index check`);
    a sound state is stamped (:mod:`.cache_stamp`): the next open reads none of it."""
    problems = []
    assert structures.state_dir is not None
    stamp = cache_stamp.Stamp(structures.state_dir, structures.header_crc)
    for j, shard in enumerate(structures.shards):
        for name, (_size, crc) in shard.files.items():
            path = structures.state_dir / f"shard-{j:05d}-{name}.npy"
            try:
                st = os.stat(path, follow_symlinks=False)
                if _crc_file(path) != crc:
                    problems.append(f"{path.name} does not match its checksum")
                else:
                    stamp.add(path.name, st, crc)
            except OSError as exc:
                problems.append(f"{path.name}: {exc}")
        try:
            shard.validate()
            shard.dense_graph()
        except CacheUnusable as exc:
            problems.append(str(exc))
    if problems or structures.header_crc is None:
        stamp.discard()
    else:
        stamp.commit()
    return problems


# -- housekeeping -------------------------------------------------------------------------------


def remove_leftovers(folder: Path) -> list[str]:
    """Temp files and folders of writers that are gone (a crash mid-write; this process's own
    only when no writer of it is still writing them)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not is_temp_name(entry.name):
            continue
        try:
            pid = int(entry.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if (pid != os.getpid() and pid_alive(pid)) or being_written(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


def remove_unused_states(cache_dir: Path, keep: set[str]) -> None:
    """States no ``current`` names and nobody wrote recently (readers that still map one
    keep their pages: unlinked files live on until unmapped)."""
    now = time.time()
    for entry in os.scandir(cache_dir):
        if not entry.name.startswith("state-") or entry.name in keep or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_SECONDS:
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
