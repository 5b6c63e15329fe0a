"""Stored ``_source`` <-> :class:`Document`, the same for both engines (their mappings agree)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from d2s_search.backends.base import Document
from d2s_search.backends.engine.narrowing import document_metadata, metadata_source

SPARSE_FIELD = "sparse"
DENSE_FIELD = "dense"
PATH_FIELD = "path"


def stored_paths(paths: list[str]) -> str | list[str]:
    """The ``path`` field: one path as a string (as every document without copies has it),
    several as a list (a keyword field takes either; a ``term`` query matches any of them)."""
    return paths[0] if len(paths) == 1 else list(paths)


def paths_from_source(value: Any) -> list[str]:
    """Every path of a stored ``path`` field, the shown one first."""
    if isinstance(value, list):
        return [str(p) for p in value if isinstance(p, str)]
    return [value] if isinstance(value, str) and value else []


def shown_path(value: Any) -> str:
    """The path a hit shows: the first of the stored ones."""
    paths = paths_from_source(value)
    return paths[0] if paths else ""


def checked_dense(doc: Document) -> np.ndarray:
    """The document's dense vector as float32; ValueError for NaN or infinite values."""
    dense = np.asarray(doc.dense, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(dense)):
        raise ValueError("dense vector has NaN or infinite values")
    return dense


def source_from_document(doc: Document, sparse: Mapping[str, float], dense: np.ndarray,
                         top_terms: int = 20, types: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``_source`` stored for ``doc``: ``sparse`` and ``dense`` as the engine sends them,
    its metadata (``types``: the user's fields the index knows; ValueError for another)."""
    src: dict[str, Any] = {
        PATH_FIELD: stored_paths(doc.paths),
        "size_bytes": int(doc.size_bytes),
        "width": int(doc.width),
        "height": int(doc.height),
        SPARSE_FIELD: dict(sparse),
        DENSE_FIELD: [float(x) for x in dense],
        "terms": doc.top_terms(top_terms),
    }
    if doc.url:
        src["url"] = doc.url
    if doc.ingested_at:
        src["ingested_at"] = int(round(doc.ingested_at * 1000))
    src.update(metadata_source(doc.id, doc.paths, doc.metadata, types or {}))
    return src


def document_from_source(doc_id: str, src: Mapping[str, Any],
                         decode: Callable[[Mapping[str, float] | None], dict[str, float]],
                         types: Mapping[str, str] | None = None) -> Document:
    """``decode`` turns the stored sparse field back into term weights (each engine escapes
    keys); ``types``: the user's fields (a date's stored epoch millis become seconds)."""
    ingested = src.get("ingested_at")
    paths = paths_from_source(src.get(PATH_FIELD)) or [""]
    return Document(
        id=doc_id,
        path=paths[0],
        copies=tuple(paths[1:]),
        size_bytes=int(src.get("size_bytes", 0) or 0),
        width=int(src.get("width", 0) or 0),
        height=int(src.get("height", 0) or 0),
        sparse=decode(src.get(SPARSE_FIELD)),
        dense=np.asarray(src.get(DENSE_FIELD, []), dtype=np.float32),
        url=src.get("url"),
        ingested_at=float(ingested) / 1000.0 if ingested is not None else 0.0,
        metadata=document_metadata(src, types or {}),
    )
