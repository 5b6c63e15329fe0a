import numpy as np
import pytest
from d2s_onnx_export.offline_mini.ridge import choose_lambda, ridge_fit


def test_ridge_matches_lstsq_on_augmented_system():
    rng = np.random.default_rng(0)
    x, y, lam = rng.normal(size=(30, 5)), rng.normal(size=(30, 3)), 2.5
    xa = np.vstack([x, np.sqrt(lam) * np.eye(5)])
    ya = np.vstack([y, np.zeros((5, 3))])
    np.testing.assert_allclose(ridge_fit(x, y, lam), np.linalg.lstsq(xa, ya, rcond=None)[0], atol=1e-10)


def test_ridge_hand_computed_one_feature():
    # w = sum(x*y) / (sum(x^2) + lam) = (1*2 + 2*4) / (1 + 4 + 5) = 1.0
    assert ridge_fit(np.array([[1.0], [2.0]]), np.array([[2.0], [4.0]]), 5.0)[0, 0] == pytest.approx(1.0)


def test_lambda_choice_finds_planted_optimum_and_rejects_edge():
    x = np.array([[1.0], [2.0]])
    y = np.array([[2.0], [4.0]])
    # validation prefers w = 1.0, which lambda = 5 gives exactly (w = 10 / (5 + lam))
    score = lambda w: -abs(w[0, 0] - 1.0)  # noqa: E731
    lam, w, scores = choose_lambda(x, y, score, [0.0, 1.0, 5.0, 20.0, 100.0])
    assert lam == 5.0 and w[0, 0] == pytest.approx(1.0) and len(scores) == 5
    with pytest.raises(ValueError, match="edge"):
        choose_lambda(x, y, score, [20.0, 100.0, 1000.0])
    with pytest.raises(ValueError):
        ridge_fit(x, y, -1.0)
