"""Fixtures for the Elasticsearch backend tests.

osmem-server (the ``osmem_url`` fixture of its pytest plugin) is the real HTTP server behind a
:class:`esproxy.CompatProxy`; see that module for why a proxy is needed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Helpers live next to the tests; load them under unique names (tests/ is not a package).
_load("d2s_os_faultproxy", HERE.parent / "opensearch" / "faultproxy.py")
_load("d2s_os_reference", HERE.parent / "opensearch" / "reference.py")
esproxy = _load("d2s_es_proxy", HERE / "esproxy.py")
es_spec = _load("d2s_es_spec", HERE / "spec.py")
_load("d2s_es_fake_kibana", HERE / "fake_kibana.py")


@pytest.fixture(scope="session")
def spec():
    """The Elasticsearch API specification (serverless OpenAPI + types.ts), strict."""
    try:
        return es_spec.ElasticsearchSpec.load()
    except FileNotFoundError as exc:
        pytest.skip(f"Elasticsearch API spec not available: {exc}")


@pytest.fixture
def sleeps() -> list[float]:
    """Back-off delays the backend asked for (recorded instead of slept)."""
    return []


@pytest.fixture
def es_proxy(osmem_url):
    p = esproxy.CompatProxy(osmem_url)
    yield p
    p.close()


@pytest.fixture
def make_backend(sleeps):
    from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend

    made = []

    def make(url: str, **options):
        options.setdefault("index_name", "d2s-test")
        options.setdefault("sleep", sleeps.append)
        options.setdefault("backoff", 0.01)
        options.setdefault("retries", 3)
        b = ElasticsearchBackend(url, **options)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def identity():
    from d2s_search.backends.base import IndexIdentity

    return IndexIdentity(fingerprint="e" * 32, dense_dim=8, model="synthetic")
