"""Stored ``_source`` -> :class:`Document`, the same for both engines (their mappings agree)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from d2s_search.backends.base import Document

SPARSE_FIELD = "sparse"
DENSE_FIELD = "dense"


def document_from_source(doc_id: str, src: Mapping[str, Any],
                         decode: Callable[[Mapping[str, float] | None], dict[str, float]]) -> Document:
    """``decode`` turns the stored sparse field back into term weights (each engine escapes keys)."""
    ingested = src.get("ingested_at")
    return Document(
        id=doc_id,
        path=src.get("path", ""),
        size_bytes=int(src.get("size_bytes", 0) or 0),
        width=int(src.get("width", 0) or 0),
        height=int(src.get("height", 0) or 0),
        sparse=decode(src.get(SPARSE_FIELD)),
        dense=np.asarray(src.get(DENSE_FIELD, []), dtype=np.float32),
        url=src.get("url"),
        ingested_at=float(ingested) / 1000.0 if ingested is not None else 0.0,
    )
