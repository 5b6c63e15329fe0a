"""The embedded local index behind ``LocalBackend``: the SQLite store and the files the
index owns (``store``), memory-mapped search structures in doc-id shards (``cache``), the
scoring kernels (``kernels``), the per-shard HNSW graphs of approximate dense search
(``graph``) and ``index check`` / repair (``integrity``)."""

from __future__ import annotations

from .backend import FORMAT, LocalBackend
from .kernels import top_rows as _top_rows

__all__ = ["FORMAT", "LocalBackend", "_top_rows"]
