"""A synthetic collection shaped like the paper's COCO setting (123k images).

Documents have 20-200 terms, queries 10-40, term choice is Zipf-like over a 30,522-word
vocabulary, weights are log(1 + relu(x))-shaped positive values. Deterministic per seed.
"""

from __future__ import annotations

import numpy as np

VOCAB = 30522


def zipf_probabilities(vocab: int = VOCAB, exponent: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    probs = ranks**-exponent
    probs /= probs.sum()
    return probs[rng.permutation(vocab)]  # frequent terms are spread over the vocabulary


def sample_vectors(n: int, low: int, high: int, probs: np.ndarray, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """n sparse vectors as (term ids sorted, float32 weights)."""
    rng = np.random.default_rng(seed)
    vocab = len(probs)
    lengths = rng.integers(low, high + 1, size=n)
    out = []
    # Sampling without replacement from a Zipf law: draw extra, keep the first unique ones.
    draws = rng.choice(vocab, size=int(lengths.sum() * 1.6) + 1000, p=probs)
    pos = 0
    for length in lengths:
        chunk = draws[pos : pos + int(length * 1.6) + 8]
        pos += len(chunk)
        terms = np.unique(chunk)[:length] if len(np.unique(chunk)) >= length else np.unique(chunk)
        rng.shuffle(terms)
        terms = np.sort(terms[:length])
        weights = np.log1p(rng.gamma(1.5, 0.8, size=len(terms))).astype(np.float32) + np.float32(0.01)
        out.append((terms.astype(np.int32), weights))
    return out


def dense_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)
