"""How a document's vectors are kept in its SQLite ``docs`` row: ``weights`` float32 (4 bytes a
term), ``term_ids`` in 16 bits when every id of the row fits (half the bytes: BERT's 30,522
WordPiece ids do) and in 32 bits otherwise, the weights' length telling a reader which;
``dense`` float32. Rows written with 32-bit ids read the same. Bytes read back are untrusted:
a length that fits neither width decodes as damage (None)."""

from __future__ import annotations

import numpy as np

SHORT_IDS_BELOW = 1 << 16  # ids below this take 16 bits (here, and in the search cache's postings)


def encode_term_ids(ids: np.ndarray) -> bytes:
    """A row's (sorted, positive) term ids as stored: 16-bit when all fit, else 32-bit."""
    if ids.size == 0 or int(ids.max()) < SHORT_IDS_BELOW:
        return ids.astype("<u2").tobytes()
    return ids.astype("<i4").tobytes()


def decode_term_ids(blob: object, weight_bytes: int) -> np.ndarray | None:
    """The term ids of a row whose weights take ``weight_bytes`` (int32; None: a blob of a
    length that fits neither width, or not bytes)."""
    try:
        size = len(blob)  # type: ignore[arg-type]
        if weight_bytes % 4:
            return None
        if size == weight_bytes:
            return np.frombuffer(blob, dtype="<i4")
        if 2 * size == weight_bytes:
            return np.frombuffer(blob, dtype="<u2").astype(np.int32)
    except (TypeError, ValueError):
        return None
    return None


def paired_term_ids(blob: object, weights: np.ndarray) -> np.ndarray:
    """As many of a row's term ids as can be read beside its weights: at the width their length
    says, else (lengths that do not pair up: damage) as 32-bit ids; empty when not bytes."""
    ids = decode_term_ids(blob, weights.nbytes)
    if ids is None and isinstance(blob, bytes):
        ids = decode_term_ids(blob, len(blob))
    return ids if ids is not None else np.zeros(0, dtype=np.int32)


def decode_floats(blob: object) -> np.ndarray | None:
    """A float32 blob (weights or the dense vector); None when it is not one."""
    try:
        return np.frombuffer(blob, dtype="<f4")  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
