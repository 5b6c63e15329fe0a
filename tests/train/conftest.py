"""Fixtures for the training/evaluation tests (torch-side; skipped without torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.train.train_synthetic import make_dataset  # noqa: E402


@pytest.fixture(scope="session")
def synthetic():
    """((train split, tokens, words), (val split, tokens, words), word vectors)."""
    return make_dataset()


@pytest.fixture(autouse=True)
def _one_thread():
    # The machine is shared: with other jobs running, OpenMP threads wait on each other and
    # small trainings get 10-30x slower; one thread keeps these tests' time predictable.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
