"""Closed-form ridge regression from image features to caption vectors.

Ridge from EfficientNet-Lite0's pooled features to the mean MiniLM vector of each photo's
captions beats the InfoNCE alignment on held-out dense R@1 (0.236 vs 0.211 on flickr8k-800;
docs/design-decisions.md), and the D2S head trained on top of it keeps more of it. This module holds
the solver, the lambda choice on validation photos and :func:`fit_ridge_alignment`, the
``d2s-search align --solver ridge`` path: the text side stays MiniLM's own space (identity), the
image side is one linear map with the feature standardisation folded into its weights, so it
ships as an ordinary no-bridge :class:`~d2s_onnx_export.offline_mini.parts.ImageProjection`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict

import numpy as np
import torch

from d2s_search.errors import ModelError

# Wide enough that the choice is interior on flickr8k-800 (best 1e4; docs/design-decisions.md).
RIDGE_LAMBDAS = (1e2, 1e3, 3e3, 1e4, 3e4, 1e5, 1e6)


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
    lams: Sequence[float], allow_edge: bool = False,
) -> tuple[float, np.ndarray, dict[float, float]]:
    """Fit every lambda, keep the one whose weights score highest on validation.

    Raises when the best lies at an edge of the grid (then the grid was too narrow), unless
    ``allow_edge`` (the caller reports it instead).
    """
    scores: dict[float, float] = {}
    best = None
    for lam in sorted(lams):
        w = ridge_fit(x_train, y_train, lam)
        scores[lam] = float(score(w))
        if best is None or scores[lam] > scores[best[0]]:
            best = (lam, w)
    ordered = sorted(lams)
    if not allow_edge and len(ordered) >= 3 and best[0] in (ordered[0], ordered[-1]):
        raise ValueError(f"best ridge lambda {best[0]} is at the edge of the grid {ordered}; widen it")
    return best[0], best[1], scores


def fit_ridge_alignment(train, val, config, lams: Sequence[float] = RIDGE_LAMBDAS):
    """(AlignModel, summary) of the closed-form alignment of ``train`` (an ``align.TrainSet``:
    every view of a photo is a row, its target the mean of its captions' text vectors),
    lambda chosen by the InfoNCE path's own selection score on ``val``."""
    from d2s_onnx_export.offline_mini.align import AlignModel, evaluate_dense

    text_dim = train.text.shape[1]
    if config.dim != text_dim:
        raise ModelError(f"ridge alignment keeps the text side as it is: --dim must be {text_dim}, not {config.dim}")
    n_images = train.pooled.shape[0]
    counts = np.bincount(train.caption_image, minlength=n_images)
    if np.any(counts == 0):
        raise ModelError("every training photo needs at least one caption")
    targets = np.zeros((n_images, text_dim))
    np.add.at(targets, train.caption_image, train.text)
    targets /= counts[:, None]
    image_of, view_of = np.nonzero(np.arange(train.pooled.shape[1])[None, :] < train.n_views[:, None])
    features = train.pooled[image_of, view_of].astype(np.float64)
    mean, std = features.mean(axis=0), features.std(axis=0) + 1e-6
    x = np.hstack([(features - mean) / std, np.ones((features.shape[0], 1))])
    y = targets[image_of]
    ridge_config = type(config)(**{**asdict(config), "bridge": False, "solver": "ridge"})

    def model_for(w: np.ndarray) -> AlignModel:
        model = AlignModel(ridge_config, None, train.pooled.shape[-1])
        with torch.no_grad():  # (x - mean) / std @ W + b  ==  x @ (W / std) + (b - mean / std @ W)
            model.image.linear.weight.copy_(torch.from_numpy((w[:-1] / std[:, None]).T))
            model.image.linear.bias.copy_(torch.from_numpy(w[-1] - (mean / std) @ w[:-1]))
        return model.eval()

    # Few validation photos can tie every lambda (the first wins): reported, not refused.
    lam, w, scores = choose_lambda(x, y, lambda w: evaluate_dense(model_for(w), val)["score"], lams, allow_edge=True)
    model = model_for(w)
    summary = {
        "solver": "ridge", "lambda": lam, "val_score_by_lambda": {f"{k:g}": round(v, 4) for k, v in scores.items()},
        "lambda_at_grid_edge": lam in (min(lams), max(lams)),
        "best_epoch": 0, "best_val": evaluate_dense(model, val), "history": [], "config": asdict(ridge_config),
    }
    return model, summary
