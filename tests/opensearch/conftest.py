"""Fixtures for the OpenSearch backend tests.

The osmem-server pytest plugin (installed with the ``test`` extra) provides ``osmem_url``: a
fresh clone of an in-memory OpenSearch-compatible server per test.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _load(name: str, file: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Helpers live next to the tests; load them under unique names (tests/ is not a package).
os_spec = _load("d2s_os_spec", "spec.py")
faultproxy = _load("d2s_os_faultproxy", "faultproxy.py")
reference = _load("d2s_os_reference", "reference.py")
plugins = _load("d2s_os_plugins", "plugins.py")


@pytest.fixture(scope="session")
def spec():
    """The OpenSearch API specification, strict: unknown keys are errors too."""
    try:
        return os_spec.OpenSearchSpec.load(strict=True)
    except FileNotFoundError as exc:
        pytest.skip(f"OpenSearch API spec not available: {exc}")


@pytest.fixture
def sleeps() -> list[float]:
    """Back-off delays the client asked for (recorded instead of slept)."""
    return []


@pytest.fixture
def make_backend(sleeps):
    from d2s_search.backends.opensearch.backend import OpenSearchBackend

    made = []

    def make(url: str, **options):
        options.setdefault("index_name", "d2s-test")
        options.setdefault("sleep", sleeps.append)
        options.setdefault("backoff", 0.01)
        b = OpenSearchBackend(url, **options)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def identity():
    from d2s_search.backends.base import IndexIdentity

    return IndexIdentity(fingerprint="f" * 32, dense_dim=8, model="synthetic")


@pytest.fixture
def backend(make_backend, osmem_url, identity):
    b = make_backend(osmem_url)
    b.open(identity)
    return b


@pytest.fixture
def proxy(osmem_url):
    p = faultproxy.FaultProxy(osmem_url)
    yield p
    p.close()
