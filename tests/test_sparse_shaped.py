"""The real-shaped sparse generator (benchmarks/sparse_shaped.py) keeps its source's shape."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sparse_shaped  # noqa: E402


def _sources(n: int, sign: float, seed: int = 7) -> list[sparse_shaped.Sparse]:
    """``n`` sparse vectors over 3,000 terms drawn by a Zipf law, 200-400 terms each; a term's
    weight rises (sign +1) or falls (sign -1) with its frequency rank, as a head's do."""
    rng = np.random.default_rng(seed)
    vocab = 3000
    probs = 1.0 / np.arange(1, vocab + 1)
    probs /= probs.sum()
    level = sign * -np.log(np.arange(1, vocab + 1))  # frequent terms (low id) weigh more when sign > 0
    level = (level - level.min()) / np.ptp(level)
    out = []
    for length in rng.integers(200, 401, size=n).tolist():
        terms = np.sort(rng.choice(vocab, size=length, replace=False, p=probs)).astype(np.int32)
        weights = (0.2 + level[terms]) * np.exp(0.3 * rng.standard_normal(length))
        out.append((terms, weights.astype(np.float32)))
    return out


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_tiled_collection_keeps_terms_per_document_and_weight_df_correlation(sign: float) -> None:
    sources = _sources(60, sign)
    source, tiled = sparse_shaped.shape(sources), sparse_shaped.shape(sparse_shaped.tile(sources, 3000, seed=1))
    assert tiled.docs == 3000
    assert abs(tiled.terms_per_doc - source.terms_per_doc) <= 0.05 * source.terms_per_doc
    assert abs(source.weight_df_spearman) > 0.3
    assert np.sign(tiled.weight_df_spearman) == np.sign(source.weight_df_spearman)
    assert abs(tiled.weight_df_spearman - source.weight_df_spearman) < 0.15
    # The df distribution as a share of the collection: the most frequent terms hold as much.
    assert abs(tiled.top100_posting_share - source.top100_posting_share) < 0.05
    assert abs(tiled.df_share_p50_p99_max[1] - source.df_share_p50_p99_max[1]) < 0.1


def test_copies_are_perturbed_not_identical() -> None:
    sources = _sources(20, 1.0)
    tiled = sparse_shaped.tile(sources, 200, seed=3)
    of = sparse_shaped.source_of(len(sources), 200, seed=3)
    same = [np.array_equal(tiled[i][0], sources[of[i]][0]) for i in range(200)]
    assert not any(same)
    overlap = [np.intersect1d(tiled[i][0], sources[of[i]][0]).size / sources[of[i]][0].size for i in range(200)]
    assert 0.8 < float(np.mean(overlap)) < 0.95  # about CHURN of each copy's terms are dropped


def test_deterministic_for_a_seed() -> None:
    sources = _sources(20, 1.0)
    a, b, c = (sparse_shaped.tile(sources, 100, seed=s) for s in (5, 5, 6))
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, c))
