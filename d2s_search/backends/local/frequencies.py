"""Document frequencies from the search structures: a term's df is the length of its posting
list (CSC column), summed over the shards; the structures hold exactly the stored documents."""

from __future__ import annotations

import numpy as np

from .cache import Structures


def document_frequencies(state: Structures, columns: np.ndarray) -> np.ndarray:
    """df (int64) of each vocabulary column id in ``columns`` (0 for a column no shard has)."""
    columns = np.asarray(columns, dtype=np.int64)
    out = np.zeros(columns.size, dtype=np.int64)
    for shard in state.shards:
        indptr = shard.arrays["csc_indptr"]
        inside = (columns >= 0) & (columns < indptr.size - 1)
        cols = columns[inside]
        out[inside] += indptr[cols + 1].astype(np.int64) - indptr[cols]
    return out
