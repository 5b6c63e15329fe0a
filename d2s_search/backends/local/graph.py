"""Approximate dense search of the local index: one HNSW graph per shard (faiss), holding the
shard's vectors, read in place from the memory-mapped cache file.

faiss serialises an ``IndexHNSWFlat`` as ``IHNf``, an index header, the graph
(``assign_probas``, ``cum_nneighbor_per_level``, ``levels``, ``offsets``, ``neighbors``, then
``entry_point``, ``max_level``, ``efConstruction``, ``efSearch``, ``upper_beam``) and its
storage (``IxFI``, an index header, the vectors); see faiss ``impl/index_write.cpp``
(``write_HNSW``, ``write_index_header``). The cache keeps those bytes as one ``uint8`` array
(``hnsw``), after a little-endian uint64 giving where they start (padding that puts the
vectors on a 64-byte boundary: numpy and BLAS read them in place at full speed); faiss's ``ZeroCopyIOReader`` reads the neighbours and the vectors as views of the
mapping, and the shard's ``dense`` array is a numpy view of the same vectors: one copy on disk
and in memory, whichever side reads them.

Bytes read back are untrusted: :func:`layout` walks the serialisation and checks every length
field against the shard's rows, the dimension and the file size (a wrong length would make
faiss allocate or read past the end); :func:`check` verifies the graph (neighbour ids inside
the shard, offsets and levels consistent) before faiss is handed it: with both, a damaged
file can cost recall but cannot make faiss read outside the shard's arrays.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import numpy as np

from .kernels import DamagedArrays

M = 32  # neighbours per node (64 on the bottom layer)
EF_CONSTRUCTION = 40
EF_SEARCH = 64  # candidates kept while searching (at least k)
_HEADER = struct.Struct("<iqqq?i")  # d, ntotal, dummy, dummy, is_trained, metric_type
_METRIC_INNER_PRODUCT = 0


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
    vectors: int  # byte offset of the float32 vectors (rows x dim)


@functools.cache
def available() -> bool:
    """faiss with zero-copy reading (1.11 and later); without it graphs written by another
    install are not read (their shards are scanned) and none are built."""
    try:
        import faiss
    except ImportError:  # pragma: no cover
        return False
    return hasattr(faiss, "ZeroCopyIOReader") and hasattr(faiss, "IndexHNSWFlat")


def build(vectors: np.ndarray) -> np.ndarray | None:
    """The serialised graph over these vectors (inner product, rows = labels), or None when
    this faiss cannot be read back zero-copy (the dense side then stays exact)."""
    if not available():
        return None
    import faiss

    rows, dim = vectors.shape
    index = faiss.IndexHNSWFlat(dim, M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    index.hnsw.efSearch = EF_SEARCH
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    serialised = faiss.serialize_index(index)
    del index
    try:
        where = layout(np.concatenate([np.frombuffer(np.uint64(8).tobytes(), np.uint8), serialised]), rows, dim)
    except DamagedArrays:  # a faiss that writes another layout
        return None
    base = 8 + (-where.vectors) % 64
    blob = np.zeros(base + serialised.size, dtype=np.uint8)
    blob[:8] = np.frombuffer(np.uint64(base).tobytes(), np.uint8)
    blob[base:] = serialised
    check(blob, layout(blob, rows, dim), rows)
    return blob


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
    at = _header_at(blob, base, b"IHNf", rows, dim)
    _, at = _vector_at(blob, at, 8, 64)  # assign_probas
    cum, at = _vector_at(blob, at, 4, 65)
    levels, at = _vector_at(blob, at, 4, rows)
    offsets, at = _vector_at(blob, at, 8, rows + 1)
    neighbors, at = _vector_at(blob, at, 4, (blob.size - at) // 4)
    if levels[1] != rows or offsets[1] != rows + 1 or at + 20 > blob.size:
        raise DamagedArrays("graph file does not match the shard's rows")
    entry_point, max_level = struct.unpack("<ii", blob[at : at + 8].tobytes())
    at = _header_at(blob, at + 20, b"IxFI", rows, dim)
    if at + 8 > blob.size:
        raise DamagedArrays("graph file ends early")
    (floats,) = struct.unpack("<Q", blob[at : at + 8].tobytes())
    at += 8
    if floats != rows * dim or at + 4 * rows * dim != blob.size:
        raise DamagedArrays("graph file's vectors do not match the shard")
    return Layout(base=base, cum=cum, levels=levels, offsets=offsets, neighbors=neighbors, entry_point=entry_point,
                  max_level=max_level, vectors=at)


def _view(blob: np.ndarray, part: tuple[int, int], dtype: str) -> np.ndarray:
    start, count = part
    return blob[start : start + count * np.dtype(dtype).itemsize].view(dtype)


def vectors(blob: np.ndarray, where: Layout, rows: int, dim: int) -> np.ndarray:
    """The shard's vectors: a (rows, dim) float32 view of the graph's storage, no copy."""
    return blob[where.vectors :].view("<f4").reshape(rows, dim)


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


def open_index(blob: np.ndarray, where: Layout):
    """A faiss index reading the (checked) bytes in place: neighbours and vectors are views."""
    import faiss

    reader = faiss.ZeroCopyIOReader(faiss.swig_ptr(blob[where.base :]), blob.size - where.base)
    return faiss.read_index(reader)


def search(index, query: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, inner products) of the approximate top-k of one query, best first."""
    import faiss

    params = faiss.SearchParametersHNSW()
    params.efSearch = max(ef, k)
    scores, rows = index.search(query.reshape(1, -1), k, params=params)
    keep = rows[0] >= 0
    return rows[0][keep].astype(np.int64), scores[0][keep]
