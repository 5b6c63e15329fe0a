"""Closed-form ridge regression from image features to caption vectors (issue 12).

The DINOv2 experiment found that ridge from EfficientNet-Lite0 features to MiniLM caption
vectors beats the trained alignment on held-out dense R@1; this module holds the solver and
the lambda choice on validation photos, so the alignment can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def ridge_fit(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """W minimising ||x W - y||^2 + lam ||W||^2 (no bias: centre x and y first if needed)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if lam < 0:
        raise ValueError(f"ridge lambda must be >= 0, got {lam}")
    gram = x.T @ x + lam * np.eye(x.shape[1])
    return np.linalg.solve(gram, x.T @ y)


def choose_lambda(
    x_train: np.ndarray, y_train: np.ndarray, score: Callable[[np.ndarray], float],
    lams: Sequence[float],
) -> tuple[float, np.ndarray, dict[float, float]]:
    """Fit every lambda, keep the one whose weights score highest on validation.

    Raises when the best lies at an edge of the grid, because then the grid was too narrow.
    """
    scores: dict[float, float] = {}
    best = None
    for lam in sorted(lams):
        w = ridge_fit(x_train, y_train, lam)
        scores[lam] = float(score(w))
        if best is None or scores[lam] > scores[best[0]]:
            best = (lam, w)
    ordered = sorted(lams)
    if len(ordered) >= 3 and best[0] in (ordered[0], ordered[-1]):
        raise ValueError(f"best ridge lambda {best[0]} is at the edge of the grid {ordered}; widen it")
    return best[0], best[1], scores
