"""Approximate dense search of the local index: HNSW graphs (built by faiss), one spanning the
index's full shards and one for a shard of its own (the last, partial one; or each, in a small
index), read in place from the memory-mapped cache file (or from one copy of it on huge
pages, see :func:`huge_page_copy`), their candidates rescored with the float vectors (a
spanning graph's labels are the rows of its shards one after another: :class:`SpannedRows`).

Searching does not need faiss: ``_graph.c`` walks faiss's serialised graph in place (the same
candidates as faiss's own search on the graphs measured, in 0.79-0.91x its time), so a process
that only searches never imports faiss (35 ms, most of a first dense search). Where that extension
is not built, faiss reads the graph zero-copy and searches it (:class:`OpenedGraph`).

The graph keeps 8-bit copies of the vectors (faiss ``IndexHNSWSQ``, ``QT_8bit``: each dimension
quantised over its range in the shard, as Elasticsearch's default ``int8_hnsw`` does): walking it
reads a quarter of the bytes per visited vector, and visited vectors' memory latency is most of
a cold search's time. The ``max(ef, k)`` candidates it returns are then scored exactly with the
float32 vectors, so a hit's score is its exact inner product and the order among candidates is
exact (0.7-0.8x the time of a float graph cold; recall@10 the same on real embeddings, 0.02
lower on random vectors; docs/design-decisions.md, "Graphs over 8-bit copies of the vectors, rescored").

faiss serialises an ``IndexHNSWSQ`` as ``IHNs``, an index header, the graph
(``assign_probas``, ``cum_nneighbor_per_level``, ``levels``, ``offsets``, ``neighbors``, then
``entry_point``, ``max_level``, ``efConstruction``, ``efSearch``, ``upper_beam``) and its
storage (``IxSQ``, an index header, the quantiser: ``qtype``, ``rangestat``,
``rangestat_arg``, ``d``, ``code_size``, ``trained``: each dimension's minimum and range; then
the codes); see faiss
``impl/index_write.cpp`` (``write_HNSW``, ``write_index_header``, ``write_ScalarQuantizer``).
The cache keeps those bytes as one ``uint8`` array (``hnsw``), after a little-endian uint64
giving where they start (padding that puts the codes on a 64-byte boundary); faiss's
``ZeroCopyIOReader`` reads the neighbours and the codes as views of the mapping. The float
vectors are the shard's own ``dense`` array.

Bytes read back are untrusted: :func:`layout` walks the serialisation and checks every length
field against the shard's rows, the dimension and the file size (a wrong length would make
faiss allocate or read past the end); :func:`check` verifies the graph (neighbour ids inside
the shard, offsets and levels consistent) before faiss is handed it: with both, a damaged
file can cost recall but cannot make faiss read outside the shard's arrays, and a hit's score
always comes from the float vectors. The compiled walk checks every read itself (a bad one
raises DamagedArrays), so it skips :func:`check` for a graph known to be one a build checked
(``Shard.graph_vouched``).
"""

from __future__ import annotations

import functools
import mmap
import os
import queue
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .kernels import DamagedArrays, _c_graph, rows_at_least_kth, top_rows_any_sign

M = 32  # neighbours per node (64 on the bottom layer)
EF_CONSTRUCTION = 80  # 40 gave recall@10 0.90 at 64 candidates on the real-shaped CLIP set, 80 0.97 (validation)
EF_SEARCH = 64  # candidates kept while searching (at least k)
# A graph spanning many shards keeps more by default: at a fixed width recall falls as a graph
# grows (real-shaped 1M, one graph: recall@10 0.937 at 64 candidates, 0.972 at 128, 0.987 at 256
# in 1.97 ms; 16 graphs of a shard each 0.997 at 64 in 7.7 ms). default_ef gives 256 at 16 shards.
SPAN_EF_STEP = 4

# The recall a build reports (index stats): the exact top 10 neighbours of this many of the
# graph's vectors against what it finds with its default candidates (default_ef).
RECALL_SAMPLE = 50
RECALL_K = 10
_HEADER = struct.Struct("<iqqq?i")  # d, ntotal, dummy, dummy, is_trained, metric_type
_QUANTIZER = struct.Struct("<iifQQ")  # qtype, rangestat, rangestat_arg, d, code_size
_METRIC_INNER_PRODUCT = 0
_QT_8BIT = 0  # faiss ScalarQuantizer::QT_8bit


def default_ef(span: int) -> int:
    """Candidates a graph over ``span`` shards keeps when the search asks for no width:
    EF_SEARCH, once more per SPAN_EF_STEP shards it spans."""
    return EF_SEARCH * max(1, span // SPAN_EF_STEP)


@dataclass
class Layout:
    """Where the parts of a serialised graph sit in its bytes (offsets from the array's start)."""

    base: int  # where faiss's bytes start
    cum: tuple[int, int]  # (byte offset, count) of cum_nneighbor_per_level (int32)
    levels: tuple[int, int]  # int32
    offsets: tuple[int, int]  # uint64
    neighbors: tuple[int, int]  # int32
    entry_point: int
    max_level: int
    quantiser: int  # byte offset of the quantiser's fields (qtype first)
    ranges: int  # byte offset of each dimension's minimum, then of each one's range (float32, 2 x dim)
    codes: int  # byte offset of the 8-bit copies of the vectors (rows x dim)


def compiled_walk() -> bool:
    """Whether graphs are walked by ``_graph.c`` here (every read bounds-checked as it goes)."""
    return _c_graph is not None


def searchable() -> bool:
    """Whether graphs can be searched here: by the compiled walk, else by faiss (:func:`available`)."""
    return compiled_walk() or available()


@functools.cache
def available() -> bool:
    """faiss with zero-copy reading (1.11 and later): what builds graphs (and searches them
    where ``_graph.c`` is not built); without it none are built and dense search stays exact."""
    try:
        import faiss
    except ImportError:  # pragma: no cover
        return False
    return hasattr(faiss, "ZeroCopyIOReader") and hasattr(faiss, "IndexHNSWSQ") and (
        faiss.ScalarQuantizer.QT_8bit == _QT_8BIT
    )


def unavailable_note(graphs_from: int) -> str:
    """What an index of at least ``graphs_from`` documents says, once, when this install cannot
    build graphs: searches stay exact, only slower."""
    from d2s_search.extras import install_command

    return (f"dense search scans every vector (exact, but slower than the HNSW graphs faiss 1.11 or later builds "
            f"from {graphs_from:,} pictures on): {install_command('faiss')}")


def build(parts: Sequence[np.ndarray], out: Path | None = None,
          release: Callable[[int], None] | None = None) -> np.ndarray | None:
    """The serialised graph over the rows of ``parts`` one after another (a shard's vectors, or
    the shards' a graph spans: its labels are the rows so numbered; inner product, 8-bit copies
    of the vectors), or None when this faiss cannot be read back zero-copy (the dense side then
    stays exact). Each dimension's 8-bit range is measured on :func:`_range_sample` of them.
    ``out``: written there as the cache's ``.npy`` file and returned memory-mapped (no copy of
    the serialisation in memory); ``release(i)`` is called whenever part ``i``'s pages may leave
    the process (once sampled for the ranges; once its rows are added): a mapped part need not
    stay resident."""
    if not available():
        return None
    index = _trained(_range_sample(parts, release))
    for i, part in enumerate(parts):  # one shard at a time: the vectors are never all copied at once
        index.add(np.ascontiguousarray(part, dtype=np.float32))
        if release is not None:
            release(i)
    written, dim = _serialised(index, out)
    del index  # before the file is read back or the framed copy made: two copies of the graph at most
    return _as_kept(written, dim, out)


def _trained(sample: np.ndarray):
    """An empty graph (8-bit copies, inner product) whose per-dimension ranges are ``sample``'s."""
    import faiss

    index = faiss.IndexHNSWSQ(sample.shape[1], faiss.ScalarQuantizer.QT_8bit, M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    index.hnsw.efSearch = EF_SEARCH
    index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


def _serialised(index, out: Path | None) -> tuple:
    """``index`` written into ``out`` (the rows it holds) or serialised in memory, and its
    dimension: what :func:`_as_kept` reads once the caller has freed the index."""
    import faiss

    return (_write_framed(index, out) if out is not None else faiss.serialize_index(index)), int(index.d)


def _as_kept(written, dim: int, out: Path | None) -> np.ndarray | None:
    """The graph as the cache keeps it: ``out`` mapped back and checked, or framed in memory."""
    return _read_back(out, written, dim) if out is not None else _framed(written, dim)


class Builder:
    """A graph built while its rows are still being read: trained on ``sample`` (the 8-bit
    ranges: rows spread over all it will hold), each part added on a thread of its own as it
    is handed over, written by :meth:`finish`. faiss lets go of the GIL while it adds, so a
    build turning SQLite rows into shards on one core has faiss add the full ones beside it
    (docs/design-decisions.md, "A build writes the cache as it goes")."""

    def __init__(self, sample: np.ndarray) -> None:
        self._index = _trained(sample)
        self.parts = 0  # handed over so far
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._add_parts, name="d2s-search-graph", daemon=True)
        self._thread.start()

    def add(self, part: np.ndarray, done: Callable[[], None] | None = None) -> None:
        """Queue ``part``'s rows (numbered after those handed over before); ``done()`` is called
        on the graph's thread once they are in (their pages may then leave the process)."""
        self.parts += 1
        self._queue.put((part, done))

    def _add_parts(self) -> None:
        while (item := self._queue.get()) is not None:
            part, done = item
            if self._error is not None or self._index is None:
                continue  # failed or abandoned: the rest is drained, not added
            try:
                self._index.add(np.ascontiguousarray(part, dtype=np.float32))
                if done is not None:
                    done()
            except BaseException as exc:  # raised again by finish, on the caller's thread
                self._error = exc

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def finish(self, out: Path | None = None) -> np.ndarray | None:
        """The graph over every part handed over, serialised as :func:`build` returns it."""
        self._stop()
        index, self._index = self._index, None
        if self._error is not None:
            raise self._error
        if index is None:
            raise RuntimeError("graph builder already finished")
        written, dim = _serialised(index, out)
        del index  # before the file is read back or the framed copy made: two copies of the graph at most
        return _as_kept(written, dim, out)

    def abandon(self) -> None:
        """Stop and drop what was built (the build goes another way); idempotent."""
        self._index = None
        self._stop()


def extend(blob: np.ndarray, rows: int, dim: int, parts: Sequence[np.ndarray],
           out: Path | None = None) -> np.ndarray | None:
    """``blob`` (a graph over ``rows`` vectors) with the rows of ``parts`` added after them,
    serialised anew (None: this faiss cannot; ``out`` as for :func:`build`): what a graph
    spanning full shards does when another shard fills, instead of building over every vector
    again. The new rows are quantised with the ranges the graph was trained on (an outlier is
    clipped in the copy; candidates are rescored with the float vectors). Raises DamagedArrays
    for a blob that is not such a graph."""
    if not available():
        return None
    import faiss

    where = layout(blob, rows, dim)
    check(blob, where, rows)
    index = faiss.deserialize_index(np.ascontiguousarray(blob[where.base :]))  # an owned copy to add to
    index.hnsw.efConstruction = EF_CONSTRUCTION
    for part in parts:
        index.add(np.ascontiguousarray(part, dtype=np.float32))
    written, dim = _serialised(index, out)
    del index  # before the file is read back or the framed copy made: two copies of the graph at most
    return _as_kept(written, dim, out)


RANGE_SAMPLE = 65536  # rows the 8-bit ranges are measured on (a shard's worth)


def _range_sample(parts: Sequence[np.ndarray], release: Callable[[int], None] | None = None) -> np.ndarray:
    """Every row when they are few; else evenly spaced rows of every part (a graph spanning
    a million rows trains on 65,536 of them rather than on a copy of all), each part released
    once read (a sparse read of a mapping maps most of its pages)."""
    total = sum(p.shape[0] for p in parts)
    if len(parts) == 1 and total <= RANGE_SAMPLE:
        return parts[0]
    take = max(1, RANGE_SAMPLE // len(parts))
    rows = []
    for i, p in enumerate(parts):
        if p.shape[0]:
            rows.append(p[np.unique(np.linspace(0, p.shape[0] - 1, num=min(take, p.shape[0])).astype(np.int64))])
        if release is not None:
            release(i)
    return np.vstack(rows)


def _codes_start(codes: int) -> int:
    """Where faiss's bytes start in the cache's array: after the 8-byte start field, padded so
    that the codes (``codes`` bytes into faiss's) fall on a 64-byte boundary."""
    return 8 + (-(8 + codes)) % 64


def _framed(serialised: np.ndarray, dim: int) -> np.ndarray | None:
    """faiss's bytes of a graph behind the cache's 8-byte start field, its codes on a 64-byte
    boundary (None: a faiss that writes another layout)."""
    if serialised.size < 4 + _HEADER.size:
        return None
    rows = int(_HEADER.unpack(serialised[4 : 4 + _HEADER.size].tobytes())[1])
    try:
        where = _walk(serialised, 0, rows, dim)
    except DamagedArrays:
        return None
    base = _codes_start(where.codes)
    blob = np.zeros(base + serialised.size, dtype=np.uint8)
    blob[:8] = np.frombuffer(np.uint64(base).tobytes(), np.uint8)
    blob[base:] = serialised
    check(blob, layout(blob, rows, dim), rows)
    return blob


def _write_framed(index, out: Path) -> int:
    """``index`` serialised straight into ``out`` as :func:`_framed` frames it, inside a
    ``.npy`` file of ``uint8``: counted in a first pass (faiss writes the codes last, so they
    start ``ntotal * code_size`` bytes before its end), written in a second; no copy of the
    serialisation is held. Returns the rows it holds."""
    import faiss

    total = 0

    def count(chunk: bytes) -> None:
        nonlocal total
        total += len(chunk)

    faiss.write_index(index, faiss.PyCallbackIOWriter(count))
    rows, codes = int(index.ntotal), int(index.ntotal) * int(faiss.downcast_index(index.storage).code_size)
    base = _codes_start(total - codes)
    with open(out, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (base + total,)})
        f.write(np.uint64(base).tobytes() + bytes(base - 8))
        faiss.write_index(index, faiss.PyCallbackIOWriter(f.write))
        f.flush()
        os.fsync(f.fileno())
    return rows


def _read_back(out: Path, rows: int, dim: int) -> np.ndarray | None:
    """The graph :func:`_write_framed` wrote, memory-mapped and checked as a read-back graph is
    (its pages then dropped from this process: the page cache keeps them); None, and no
    file, when its layout is not the one this module reads (a faiss that writes another)."""
    mapped = np.load(out, mmap_mode="r", allow_pickle=False)
    blob = np.asarray(mapped)
    try:
        check(blob, layout(blob, rows, dim), rows)
    except DamagedArrays:
        del blob, mapped
        out.unlink()
        return None
    if hasattr(mmap, "MADV_DONTNEED"):
        mapped._mmap.madvise(mmap.MADV_DONTNEED)
    return blob


class SpannedRows:
    """The float vectors of consecutive shards read as one array of rows, as a graph spanning
    them numbers its labels: what :func:`search` and :func:`sampled_recall` rescore with."""

    def __init__(self, parts: Sequence[np.ndarray], release: Callable[[int], None] | None = None) -> None:
        self.parts = list(parts)
        self.release = release  # called with a part's number once a product has read all of it
        self.starts = np.zeros(len(self.parts) + 1, dtype=np.int64)
        np.cumsum([p.shape[0] for p in self.parts], out=self.starts[1:])
        self.shape = (int(self.starts[-1]), self.parts[0].shape[1])

    def __getitem__(self, rows):
        if np.ndim(rows) == 0:
            part = int(np.searchsorted(self.starts, rows, side="right")) - 1
            return self.parts[part][int(rows) - int(self.starts[part])]
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= self.shape[0]):
            raise IndexError(f"rows outside the {self.shape[0]:,} spanned")
        which = np.searchsorted(self.starts, rows, side="right") - 1
        order = None  # ascending rows (a scan's) are gathered in place, part after part
        if rows.size > 1 and not np.all(which[:-1] <= which[1:]):
            order = np.argsort(which, kind="stable")
            rows, which = rows[order], which[order]
        out = np.empty((rows.size, self.shape[1]), dtype=np.float32)
        bounds = np.searchsorted(which, np.arange(len(self.parts) + 1))
        for part in range(len(self.parts)):
            lo, hi = int(bounds[part]), int(bounds[part + 1])
            if hi > lo:
                gather(self.parts[part], rows[lo:hi] - self.starts[part], out[lo:hi])
        if order is None:
            return out
        back = np.empty_like(out)
        back[order] = out
        return back

    def __matmul__(self, query: np.ndarray) -> np.ndarray:
        scores = []
        for i, part in enumerate(self.parts):
            scores.append(part @ query)
            if self.release is not None:
                self.release(i)
        return np.concatenate(scores)


def gather(matrix: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``matrix[rows]`` (into ``out`` when given): copied by ``_graph.c`` with the rows ahead
    asked for first where it is built (thousands of rows anywhere in a mapping: a graph's
    candidates, a code scan's best), else by numpy. A row outside the matrix: IndexError."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if out is None:
        out = np.empty((rows.size,) + matrix.shape[1:], dtype=matrix.dtype)
    if (_c_graph is None or matrix.ndim != 2 or not matrix.flags.c_contiguous or not out.flags.c_contiguous
            or out.dtype != matrix.dtype):
        np.take(matrix, rows, axis=0, out=out)
        return out
    try:
        _c_graph.gather(matrix, matrix.shape[1] * matrix.itemsize, rows, out)
    except ValueError as exc:
        raise IndexError(str(exc)) from None
    return out


def _rows_of(vectors, rows: np.ndarray) -> np.ndarray:
    """The float vectors of ``rows`` of a shard's vectors or of :class:`SpannedRows`."""
    return vectors[rows] if isinstance(vectors, SpannedRows) else gather(vectors, rows)


def _vector_at(blob: np.ndarray, at: int, itemsize: int, limit: int) -> tuple[tuple[int, int], int]:
    if at + 8 > blob.size:
        raise DamagedArrays("graph file ends early")
    (count,) = struct.unpack("<Q", blob[at : at + 8].tobytes())
    end = at + 8 + count * itemsize
    if count > limit or end > blob.size:
        raise DamagedArrays("graph file has a wrong length field")
    return (at + 8, count), end


def _header_at(blob: np.ndarray, at: int, fourcc: bytes, rows: int, dim: int) -> int:
    end = at + 4 + _HEADER.size
    if end > blob.size or blob[at : at + 4].tobytes() != fourcc:
        raise DamagedArrays("graph file is not an HNSW index")
    d, ntotal, _, _, _, metric = _HEADER.unpack(blob[at + 4 : end].tobytes())
    if d != dim or ntotal != rows or metric != _METRIC_INNER_PRODUCT:
        raise DamagedArrays("graph file does not match the shard's vectors")
    return end


def layout(blob: np.ndarray, rows: int, dim: int) -> Layout:
    """Walk the serialised index, checking every length against ``rows`` and ``dim``."""
    if blob.dtype != np.uint8 or blob.ndim != 1 or blob.size < 8:
        raise DamagedArrays("graph file is not a byte array")
    (base,) = struct.unpack("<Q", blob[:8].tobytes())
    if not 8 <= base < 8 + 64:
        raise DamagedArrays("graph file has a wrong start")
    return _walk(blob, base, rows, dim)


def _walk(blob: np.ndarray, base: int, rows: int, dim: int) -> Layout:
    """:func:`layout` of faiss's bytes starting at ``base`` of ``blob``."""
    at = _header_at(blob, base, b"IHNs", rows, dim)
    _, at = _vector_at(blob, at, 8, 64)  # assign_probas
    cum, at = _vector_at(blob, at, 4, 65)
    levels, at = _vector_at(blob, at, 4, rows)
    offsets, at = _vector_at(blob, at, 8, rows + 1)
    neighbors, at = _vector_at(blob, at, 4, (blob.size - at) // 4)
    if levels[1] != rows or offsets[1] != rows + 1 or at + 20 > blob.size:
        raise DamagedArrays("graph file does not match the shard's rows")
    entry_point, max_level = struct.unpack("<ii", blob[at : at + 8].tobytes())
    at = _header_at(blob, at + 20, b"IxSQ", rows, dim)
    if at + _QUANTIZER.size > blob.size:
        raise DamagedArrays("graph file ends early")
    quantiser = at
    qtype, _, _, d, code_size = _QUANTIZER.unpack(blob[at : at + _QUANTIZER.size].tobytes())
    if qtype != _QT_8BIT or d != dim or code_size != dim:
        raise DamagedArrays("graph file's vector copies are not the shard's 8-bit vectors")
    (ranges_at, ranges), at = _vector_at(blob, at + _QUANTIZER.size, 4, 2 * dim)  # NaN ranges cost recall, not safety
    (codes, count), at = _vector_at(blob, at, 1, rows * code_size)
    if ranges != 2 * dim or count != rows * code_size or at != blob.size:
        raise DamagedArrays("graph file's vector copies do not match the shard")
    return Layout(base=base, cum=cum, levels=levels, offsets=offsets, neighbors=neighbors, entry_point=entry_point,
                  max_level=max_level, quantiser=quantiser, ranges=ranges_at, codes=codes)


def _view(blob: np.ndarray, part: tuple[int, int], dtype: str) -> np.ndarray:
    start, count = part
    return blob[start : start + count * np.dtype(dtype).itemsize].view(dtype)


def check(blob: np.ndarray, where: Layout, rows: int) -> None:
    """The graph is safe to search: every neighbour id lies in the shard (or is -1: none),
    every node's neighbour lists lie inside the neighbour array, levels and the entry point
    agree. Raises DamagedArrays."""
    cum = _view(blob, where.cum, "<i4")
    levels = _view(blob, where.levels, "<i4")
    offsets = _view(blob, where.offsets, "<u8")
    neighbors = _view(blob, where.neighbors, "<i4")
    if rows == 0:
        return
    if cum.size < 2 or cum[0] != 0 or np.any(np.diff(cum) < 0):
        raise DamagedArrays("graph layer sizes are inconsistent")
    top = int(levels.max())
    if int(levels.min()) < 1 or top >= cum.size or where.max_level != top - 1:
        raise DamagedArrays("graph levels are out of range")
    if not 0 <= where.entry_point < rows or int(levels[where.entry_point]) != top:
        raise DamagedArrays("graph entry point is out of range")
    if offsets[0] != 0 or not np.array_equal(np.diff(offsets), cum[levels].astype(np.uint64)) or (
        int(offsets[-1]) != neighbors.size
    ):
        raise DamagedArrays("graph neighbour lists do not match the levels")
    if neighbors.size and (int(neighbors.min()) < -1 or int(neighbors.max()) >= rows):
        raise DamagedArrays("a graph neighbour points outside the shard")
    # faiss walks a layer from node to neighbour on that layer: each must reach it, else it
    # would read another node's (or no node's) lists.
    for level in range(1, top):
        nodes = np.flatnonzero(levels > level)
        slots = (offsets[nodes].astype(np.int64) + int(cum[level]))[:, None] + np.arange(int(cum[level + 1] - cum[level]))
        linked = neighbors[slots.ravel()]
        linked = linked[linked >= 0]
        if linked.size and int(levels[linked].min()) <= level:
            raise DamagedArrays("a graph layer links a node that is not on it")


_HUGE_PAGE = 2 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_page_copy(blob: np.ndarray) -> np.ndarray | None:
    """``blob`` copied into anonymous memory that Linux backs with 2 MB pages (transparent huge
    pages, asked for with ``madvise``), or None where that is not on offer (not Linux, huge
    pages set to ``never``, ``D2S_GRAPH_HUGE_PAGES=0``).

    A graph walk touches a few thousand scattered nodes; on 4 kB pages most of them also miss
    the TLB, whose page-table entries a cold search fetches from memory as well. On 2 MB pages a
    shard's graph needs a few dozen entries: 0.89x the time of the two shards' cold searches
    at 123k documents. The copy is private to the process
    (the file's pages are shared); searches read only the copy, so the mapping's pages leave
    the process once it is dropped."""
    import mmap
    import os

    if os.environ.get("D2S_GRAPH_HUGE_PAGES", "1") == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        with open(_THP_SETTING) as f:
            if "[never]" in f.read():
                return None
    except OSError:
        return None
    size = blob.nbytes
    try:
        memory = mmap.mmap(-1, -(-max(size, 1) // _HUGE_PAGE) * _HUGE_PAGE,
                           flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        memory.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        return None
    copy = np.frombuffer(memory, dtype=np.uint8, count=size)
    copy[:] = blob.reshape(-1).view(np.uint8)
    copy.flags.writeable = False
    return copy


def open_index(blob: np.ndarray, where: Layout):
    """A faiss index reading the (checked) bytes in place: neighbours and vectors are views."""
    import faiss

    reader = faiss.ZeroCopyIOReader(faiss.swig_ptr(blob[where.base :]), blob.size - where.base)
    return faiss.read_index(reader)


class OpenedGraph:
    """A graph ready to search, its layout walked (and :func:`check` passed, unless the
    compiled walk reads bytes known to be a build's): walked in place by ``_graph.c``, or read
    by faiss (:func:`open_index`) where that is not built or ``compiled=False``. Raises
    RuntimeError when faiss's reader refuses the bytes."""

    def __init__(self, blob: np.ndarray, where: Layout, rows: int, dim: int, compiled: bool = True) -> None:
        self.blob = blob
        self._walker = _c_graph if compiled else None
        self._faiss = None if self._walker is not None else open_index(blob, where)
        self._fields = (where.cum[0], where.cum[1], where.levels[0], where.offsets[0], where.neighbors[0],
                        where.neighbors[1], where.entry_point, where.max_level, where.ranges, where.codes, rows, dim)

    @property
    def compiled(self) -> bool:
        return self._walker is not None

    def candidates(self, query: np.ndarray, wanted: int, allowed: np.ndarray | None = None) -> np.ndarray:
        """Up to ``wanted`` rows the graph finds nearest ``query`` by its 8-bit copies, in no
        order (``allowed``: one bool per row; only those are returned). Raises DamagedArrays
        when the graph's bytes no longer hold together (changed since checked)."""
        if self._walker is not None:
            found = np.empty(wanted, dtype=np.int64)
            bitmap = None if allowed is None else np.packbits(allowed, bitorder="little")
            try:
                n = self._walker.search(self.blob, self._fields, np.ascontiguousarray(query, dtype=np.float32),
                                        wanted, bitmap, found)
            except ValueError as exc:
                raise DamagedArrays(str(exc)) from None
            return found[:n]
        return self._faiss_candidates(query, wanted, allowed)

    def code_scores(self, query: np.ndarray) -> np.ndarray | None:
        """Every row's 8-bit copy scored against ``query`` (the walk's scores: the inner
        product as faiss decodes the codes, less a constant part the same for every row), read
        in order by ``_graph.c`` (a quarter of the float vectors' bytes); None without it."""
        if self._walker is None:
            return None
        scores = np.empty(self._fields[10], dtype=np.float32)
        try:
            self._walker.scan(self.blob, self._fields, np.ascontiguousarray(query, dtype=np.float32), scores)
        except ValueError as exc:
            raise DamagedArrays(str(exc)) from None
        return scores

    def _faiss_candidates(self, query: np.ndarray, wanted: int, allowed: np.ndarray | None) -> np.ndarray:
        if allowed is None:
            _, found = self._faiss.search(query.reshape(1, -1), wanted, params=_search_parameters(wanted))
            return found[0][found[0] >= 0]
        import faiss

        bitmap = np.packbits(allowed, bitorder="little")  # faiss reads bit i of byte i // 8
        params = faiss.SearchParametersHNSW()
        params.efSearch = wanted
        selector = faiss.IDSelectorBitmap(allowed.size, faiss.swig_ptr(bitmap))
        params.sel = selector
        _, found = self._faiss.search(query.reshape(1, -1), wanted, params=params)
        del selector, bitmap  # kept alive until here: faiss holds only the pointer
        rows = found[0]
        return rows[(rows >= 0) & (rows < allowed.size)]


def sampled_recall(opened: OpenedGraph, vectors: np.ndarray, ef: int, sample: int = RECALL_SAMPLE,
                   k: int = RECALL_K) -> tuple[int, int]:
    """(found, wanted): how many of the exact top ``k`` neighbours of ``sample`` of the shard's
    own vectors (evenly spaced rows; the row itself left out of both lists) :func:`search`
    finds with ``ef`` candidates. Cheap enough for every build (one scan per sampled row)."""
    rows = vectors.shape[0]
    picked = np.unique(np.linspace(0, rows - 1, num=min(sample, rows)).astype(np.int64)) if rows else []
    found = wanted = 0
    for row in picked:
        query = np.asarray(vectors[row], dtype=np.float32)
        exact = _top_without(vectors @ query, row, k)
        got, _ = search(opened, vectors, query, k + 1, ef)
        found += len(set(exact.tolist()) & set(got[got != row][:k].tolist()))
        wanted += exact.size
    return found, wanted


def _top_without(scores: np.ndarray, row: int, k: int) -> np.ndarray:
    scores[row] = -np.inf  # a fresh array: the product of the vectors and the query
    return top_rows_any_sign(scores, min(k, scores.size - 1))


def search(opened: OpenedGraph, vectors: np.ndarray, query: np.ndarray, k: int, ef: int,
           allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rows, exact inner products) of the approximate top-k of one query, best first, ties by
    row: the graph's ``max(ef, k)`` candidates scored with ``vectors`` (the shard's float32
    vectors, as the exact plan scores them). With ``allowed`` (one bool per row) only those
    rows: the walk goes through every row as usual and keeps only allowed ones as candidates,
    so a filter that keeps most rows costs about what no filter does."""
    # ascending: the vectors are read in one sweep, part after part, with no copy back into the
    # walk's order (the ranking below does not depend on it)
    rows = np.sort(opened.candidates(query, max(ef, k), allowed))
    if allowed is not None:
        rows = rows[allowed[rows]]  # what the walk kept is checked, not trusted
    scores = _rows_of(vectors, rows) @ query
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]


SCAN_MARGIN = 0.2  # codes' top k and this share more rescored: the exact top 10,000 of 983,040 random vectors all among them
SCAN_FROM_SHARE = 4  # scanned when the rows rescored are at most a quarter of the graph's


def scanned(opened: OpenedGraph, vectors: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows, exact inner products) of about the top-k of one query by a scan of the graph's
    8-bit codes: the ``k * (1 + SCAN_MARGIN)`` best codes rescored with ``vectors``, every row
    at least the k-th exact score among them (unranked, ties kept: :func:`kernels.select_top`
    ranks). For a pool of thousands (a hybrid's), where walking the graph costs more than
    reading every code; None where the codes cannot be scanned here (then scan the floats)."""
    wanted = int(k * (1 + SCAN_MARGIN))
    if wanted * SCAN_FROM_SHARE > vectors.shape[0]:  # rescoring most rows: the float scan is as cheap
        return None
    codes = opened.code_scores(query)
    if codes is None:
        return None
    rows = np.sort(rows_at_least_kth(codes, wanted))
    scores = _rows_of(vectors, rows) @ query
    keep = rows_at_least_kth(scores, k)
    return rows[keep], scores[keep]


@functools.lru_cache(maxsize=64)
def _search_parameters(ef: int):
    """faiss's search parameters for a width, made once (a SWIG object: 0.07 ms to make cold,
    a tenth of a shard's search); faiss only reads them, so threads can share one."""
    import faiss

    params = faiss.SearchParametersHNSW()
    params.efSearch = ef
    return params
