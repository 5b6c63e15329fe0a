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
    """n sparse vectors as (term ids sorted, float32 weights), each with exactly its drawn
    length (low..high) of distinct terms: never empty, however many vectors one call asks for."""
    rng = np.random.default_rng(seed)
    vocab = len(probs)
    lengths = rng.integers(low, high + 1, size=n)
    pool = _DrawPool(rng, probs, int(lengths.sum() * 1.6) + 1000)
    out = []
    for length in lengths.tolist():
        length = min(length, vocab)
        # Sampling without replacement from a Zipf law: draw extra, top up until enough distinct.
        terms = np.unique(pool.take(int(length * 1.6) + 8))
        while terms.size < length:
            terms = np.union1d(terms, pool.take(length))
        terms = np.sort(rng.permutation(terms)[:length])
        weights = np.log1p(rng.gamma(1.5, 0.8, size=len(terms))).astype(np.float32) + np.float32(0.01)
        out.append((terms.astype(np.int32), weights))
    return out


class _DrawPool:
    """Zipf draws made in bulk (one ``rng.choice`` per refill, not per vector)."""

    def __init__(self, rng: np.random.Generator, probs: np.ndarray, size: int) -> None:
        self.rng, self.probs, self.size = rng, probs, max(size, 1000)
        self.draws, self.pos = rng.choice(len(probs), size=self.size, p=probs), 0

    def take(self, count: int) -> np.ndarray:
        if self.pos + count > self.draws.size:
            self.draws, self.pos = self.rng.choice(len(self.probs), size=max(self.size, count), p=self.probs), 0
        chunk = self.draws[self.pos : self.pos + count]
        self.pos += count
        return chunk


def dense_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)
