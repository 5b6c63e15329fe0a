"""Documents and queries shaped like the offline bundle's output on both sides, for the latency
table beside the synthetic collection (``bench_local_backend.py --collection real-shaped``).

A document's sparse vector is a perturbed copy of one flickr8k-800 photo's head output
(``sparse_shaped.tile``: 375 terms a photo, weights rising with a term's document frequency);
its dense vector a perturbed copy of one of the 15,600 offline-mini sources, photos and
Karpathy captions (``real_shaped.tile``: nearest-neighbour distances kept the real vectors').
The two sides are drawn independently: 800 photos alone as dense sources would put 1,250
near-copies of each at 1M, a harder graph than real photos make, while the sparse side has no
more photos to draw from. A query is a flickr8k-800 caption (one a photo) through the bundle's
text side and text encoder: sparse query and dense query of the same caption, as ``query``
makes them. Deterministic per seed.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator

import numpy as np
import real_shaped
import sparse_shaped
from _common import CACHE, DATA

from d2s_search.backends.base import Document, IndexIdentity
from d2s_search.search import QueryVectors

DIM = 384  # offline-mini
OWN_TERMS = 8  # a query's own words: its heaviest terms, as a caption of ~10 tokens gives


def identity(n_docs: int, seed: int) -> IndexIdentity:
    return IndexIdentity(fingerprint=f"real-shaped-{n_docs}-{seed}", dense_dim=DIM, model="real-shaped")


def documents(n_docs: int, seed: int, batch: int = 5000) -> Iterator[list[Document]]:
    """The collection's documents, ``batch`` at a time (the sources read and tiled before the
    first is asked for, so an ingest's clock starts at the first upsert)."""
    vocab, sources = sparse_shaped.read_index(sparse_shaped.PHOTOS / "index")
    sparse = sparse_shaped.tile(sources, n_docs, seed)
    dense_sources, _, _ = real_shaped.offline_mini_sources()
    dense = real_shaped.tile(dense_sources, n_docs, real_shaped.NOISE["offline-mini"], seed)

    def batches() -> Iterator[list[Document]]:
        for start in range(0, n_docs, batch):
            yield [Document(id=f"{i:064x}", path=f"/real-shaped/{i}.jpg", size_bytes=0, width=0, height=0,
                            sparse={vocab[t]: float(w) for t, w in zip(*(a.tolist() for a in sparse[i]))},
                            dense=dense[i])
                   for i in range(start, min(start + batch, n_docs))]

    return batches()


def queries(n: int) -> list[QueryVectors]:
    """Up to ``n`` of the 800 caption queries (one a photo, in the captions file's order)."""
    sparse = sparse_shaped.queries()  # the captions file's rows [::5]
    with open(DATA / "flickr8k-800" / "captions.txt", newline="") as f:
        captions = [r["caption"] for r in csv.DictReader(f)]
    dense = real_shaped._encode(captions, CACHE / "real-shaped" / "flickr8k-800-captions-offline-mini.npy")[::5]
    dense = dense / np.linalg.norm(dense, axis=1, keepdims=True)
    assert len(dense) == len(sparse)
    return [QueryVectors(full=q, own=dict(sorted(q.items(), key=lambda kv: -kv[1])[:OWN_TERMS]),
                         dense=dense[i].astype(np.float32))
            for i, q in enumerate(sparse[:n])]
