"""Brute-force references: synthetic documents and the scores Lucene must give them."""

from __future__ import annotations

import math
import time

import numpy as np

from d2s_search.backends.base import Document
from d2s_search.backends.opensearch.features import lucene_feature_value

# Vocabulary tokens that break naive feature naming: dots, escapes, word pieces, punctuation,
# non-ASCII, and a literal that looks like our own escape sequence.
TRICKY_TERMS = [
    ".", "..", "...", "a.m.", "u.s", "%", "100%", "%2E", "%25", "%2e", "##s", "##.", "#", "$", "&",
    "'", "(", ")", "*", "+", ",", "-", "/", ":", ";", "<", "=", ">", "?", "@", "[", "\\", "]", "^",
    "_", "`", "{", "|", "}", "~", '"', "é", "ß", "日本", "の", "ü", "##ï", "—", "…", "°", "€", "😀",
    "[unused0]", "sparse", "_id", "dog", "car", "seat",
]


def vocabulary(n: int = 300) -> list[str]:
    words = [f"w{i:03d}" for i in range(n - len(TRICKY_TERMS))]
    return TRICKY_TERMS + words


def synthetic_docs(n: int, dim: int = 8, vocab: list[str] | None = None, seed: int = 0,
                   terms_per_doc: int = 25, prefix: str = "photos") -> list[Document]:
    """Random documents: a Zipf-ish term choice so queries share terms with many documents."""
    rng = np.random.default_rng(seed)
    vocab = vocab or vocabulary()
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 0.8
    p /= p.sum()
    docs = []
    for i in range(n):
        chosen = rng.choice(len(vocab), size=terms_per_doc, replace=False, p=p)
        weights = rng.gamma(1.5, 0.6, size=terms_per_doc)
        sparse = {vocab[c]: float(w) for c, w in zip(chosen, weights, strict=True)}
        dense = rng.normal(size=dim).astype(np.float32)
        dense /= np.linalg.norm(dense)
        sub = "cats" if i % 3 == 0 else "dogs"
        docs.append(Document(
            id=f"{i:064x}", path=f"{prefix}/{sub}/{i:04d}.jpg", size_bytes=1000 + i, width=64, height=48,
            sparse=sparse, dense=dense, url=None, ingested_at=time.time(),
        ))
    return docs


def random_query(vocab: list[str], rng: np.random.Generator, n_terms: int = 12) -> dict[str, float]:
    chosen = rng.choice(min(len(vocab), 120), size=n_terms, replace=False)
    return {vocab[c]: float(rng.uniform(0.05, 2.5)) for c in chosen}


def lucene_score(query: dict[str, float], doc: dict[str, float]) -> float | None:
    """What OpenSearch scores for bool.should[rank_feature linear, boost=q]: None if no term matches.

    Each stored value is a float32 truncated to 9 significant bits; the boost is a float32;
    Lucene multiplies them in float32 and sums the clauses in double, then casts to float32.
    """
    parts = [
        float(np.float32(np.float32(w) * np.float32(lucene_feature_value(doc[t]))))
        for t, w in query.items() if t in doc and w > 0
    ]
    return float(np.float32(math.fsum(parts))) if parts else None


def exact_dot(query: dict[str, float], doc: dict[str, float]) -> float:
    return math.fsum(w * doc[t] for t, w in query.items() if t in doc)


def ulps(a: float, b: float) -> int:
    """Distance between two float32 values in units in the last place."""
    ia = int(np.array([a], dtype=np.float32).view(np.int32)[0])
    ib = int(np.array([b], dtype=np.float32).view(np.int32)[0])
    return abs(ia - ib)


def ranking(query: dict[str, float], docs: list[Document], only=None) -> list[tuple[str, float]]:
    """(id, expected score) of every matching document, best first."""
    out = []
    for d in docs:
        if only is not None and not only(d):
            continue
        s = lucene_score(query, d.sparse)
        if s is not None:
            out.append((d.id, s))
    out.sort(key=lambda x: -x[1])
    return out
