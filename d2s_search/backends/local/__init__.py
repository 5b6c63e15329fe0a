"""The embedded local index: SQLite store (``store``), memory-mapped search structures in
doc-id shards (``cache``) and the scoring kernels (``kernels``), behind ``LocalBackend``."""

from __future__ import annotations

from .backend import FORMAT, LocalBackend
from .kernels import top_rows as _top_rows

__all__ = ["FORMAT", "LocalBackend", "_top_rows"]
