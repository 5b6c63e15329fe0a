"""Fixtures for the training/evaluation tests (torch-side; skipped without torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from train_synthetic import make_dataset  # noqa: E402


@pytest.fixture(scope="session")
def synthetic():
    """((train split, tokens, words), (val split, tokens, words), word vectors)."""
    return make_dataset()


@pytest.fixture(autouse=True)
def _few_threads():
    # The machine is shared; two threads is what it has.
    old = torch.get_num_threads()
    torch.set_num_threads(min(old, 2))
    yield
    torch.set_num_threads(old)
