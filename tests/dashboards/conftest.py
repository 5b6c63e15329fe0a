"""Fixtures for the Dashboards / ml-commons / image-URL tests.

Local fakes on 127.0.0.1 stand in for what osmem-server does not implement (Dashboards'
saved-objects API, ml-commons, stored scripts, neural_sparse); everything else goes to a
fresh osmem-server clone. Real-cluster tests live in test_real_cluster.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Helpers live next to the tests; unique module names (the test folders are not packages).
# The spec validator is the one the OpenSearch backend tests use, loaded the same way.
os_spec = _load("d2s_os_spec", HERE.parent / "opensearch" / "spec.py")
mustache = _load("d2s_dash_mustache", HERE / "mustache.py")
os_plugins = _load("d2s_os_plugins", HERE.parent / "opensearch" / "plugins.py")
fake_cluster = _load("d2s_dash_fake_cluster", HERE / "fake_cluster.py")
fake_dashboards = _load("d2s_dash_fake_dashboards", HERE / "fake_dashboards.py")
wire = _load("d2s_dash_wire", HERE / "wire.py")
corpus = _load("d2s_dash_corpus", HERE / "corpus.py")


@pytest.fixture(scope="session")
def spec():
    """The OpenSearch API specification, strict: unknown keys are errors too."""
    try:
        return os_spec.OpenSearchSpec.load(strict=True)
    except FileNotFoundError as exc:
        pytest.skip(f"OpenSearch API spec not available: {exc}")


@pytest.fixture(scope="session")
def index_mapping() -> dict:
    return json.loads((REPO / "mappings" / "index.json").read_text())


@pytest.fixture(scope="session")
def tiny_bundle(tiny_blip_bundle):
    from d2s_search.bundle import Bundle

    return Bundle.load(tiny_blip_bundle)


@pytest.fixture(scope="session")
def model_package(tiny_bundle, tmp_path_factory):
    from d2s_search.backends.opensearch.ml_package import package_model

    return package_model(tiny_bundle, tmp_path_factory.mktemp("ml") / "model.zip")


@pytest.fixture(scope="session")
def encoder(tiny_bundle):
    from d2s_search.encoder import Encoder

    return Encoder(tiny_bundle, device="cpu")


@pytest.fixture(scope="session")
def package(tiny_bundle, tmp_path_factory):
    """A model zip keeping few query terms (fast searches on osmem)."""
    from d2s_search.backends.opensearch.ml_package import package_model

    return package_model(tiny_bundle, tmp_path_factory.mktemp("ml-small") / "model.zip", max_terms=corpus.QUERY_TERMS)


@pytest.fixture(scope="session")
def documents(encoder, tmp_path_factory):
    return corpus.make_documents(encoder, tmp_path_factory.mktemp("pictures"))


@pytest.fixture
def dashboards_fake():
    fake = fake_dashboards.FakeDashboards()
    yield fake
    fake.close()


@pytest.fixture
def cluster(osmem_url):
    """ml-commons fake over osmem, uploads from local files allowed."""
    fake = fake_cluster.FakeCluster(osmem_url, settings={fake_cluster.LOCAL_FILE: True})
    yield fake
    fake.close()


@pytest.fixture
def make_cluster(osmem_url):
    made = []

    def make(**options):
        fake = fake_cluster.FakeCluster(osmem_url, **options)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.close()
