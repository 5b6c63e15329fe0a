"""`d2s-search index create | reindex` (cli_opensearch) against osmem."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from d2s_os_reference import synthetic_docs

from d2s_search.backends.base import IndexIdentity
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.cli import index as cli_module
from d2s_search.cli.index import index_create, index_reindex


class FakeBundle:
    def __init__(self, fingerprint: str, dim: int = 8) -> None:
        self._id = IndexIdentity(fingerprint, dim, "fake")

    def identity(self) -> IndexIdentity:
        return self._id


@pytest.fixture
def bundle(monkeypatch):
    fake = FakeBundle("e" * 32)
    monkeypatch.setattr(cli_module, "load_bundle", lambda path, verify=False: fake)
    return fake


def test_create_then_reindex(osmem_url, bundle, monkeypatch):
    monkeypatch.setenv("D2S_OPENSEARCH_PASSWORD", "cli-s3cret")
    monkeypatch.setenv("D2S_OPENSEARCH_USER", "admin")
    runner = CliRunner()
    res = runner.invoke(index_create, ["--url", osmem_url, "--index-name", "cli", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["created"] and out["indices"] == ["cli-000001"] and out["dense_dim"] == 8
    assert out["pipelines"] == [] and out["warnings"]  # osmem has no search pipelines: a warning, not a failure
    assert "cli-s3cret" not in res.output

    again = runner.invoke(index_create, ["--url", osmem_url, "--index-name", "cli", "--json"])
    assert again.exit_code == 0 and not json.loads(again.output)["created"]

    b = OpenSearchBackend(osmem_url, index_name="cli")
    b.open(bundle.identity())
    b.upsert(synthetic_docs(30, dim=8))
    res = runner.invoke(index_reindex, ["--url", osmem_url, "--index-name", "cli", "--engine", "lucene", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"from": "cli-000001", "to": "cli-000002", "documents": 30, "kept_old": False}
    assert b.stats()["documents"] == 30
    b.close()


def test_create_refuses_other_bundle(osmem_url, bundle, monkeypatch):
    runner = CliRunner()
    assert runner.invoke(index_create, ["--url", osmem_url, "--index-name", "cli2"]).exit_code == 0
    monkeypatch.setattr(cli_module, "load_bundle", lambda path, verify=False: FakeBundle("0" * 32))
    res = runner.invoke(index_create, ["--url", osmem_url, "--index-name", "cli2"])
    assert res.exit_code != 0
    assert type(res.exception).__name__ == "BundleMismatchError"


def test_create_needs_url(bundle):
    res = CliRunner().invoke(index_create, [], env={"D2S_OPENSEARCH_URL": ""})
    assert res.exit_code == 2 and "D2S_OPENSEARCH_URL" in res.output


@pytest.fixture
def cluster_at(osmem_url):
    from d2s_os_faultproxy import FaultProxy
    from d2s_os_plugins import PluginStandIn

    made = []

    def make(version: str, serverless: bool = False):
        proxy = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, version, serverless=serverless))
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def test_create_seismic_says_where_the_dense_vectors_are(cluster_at, bundle):
    from d2s_os_reference import vocabulary

    bundle.terms = vocabulary()
    proxy = cluster_at("3.3.0")
    runner = CliRunner()
    res = runner.invoke(index_create, ["--url", proxy.url, "--index-name", "cli", "--sparse-index", "seismic", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["indices"] == ["cli-000001"] and out["pipelines"] == []  # hybrid is fused here
    assert "dense vectors in cli-dense" in out["layout"] and "fuses them here" in out["layout"]
    text = runner.invoke(index_create, ["--url", proxy.url, "--index-name", "cli", "--sparse-index", "seismic"])
    assert text.exit_code == 0 and "layout: SEISMIC sparse vectors in cli-000001" in text.output


def test_create_lucene_before_2_13_is_refused_in_one_line(cluster_at, bundle):
    from d2s_search.errors import IndexStoreError

    proxy = cluster_at("2.12.0")
    res = CliRunner().invoke(index_create, ["--url", proxy.url, "--index-name", "cli", "--engine", "lucene"])
    assert isinstance(res.exception, IndexStoreError)
    assert "2.13" in str(res.exception) and "--engine faiss" in str(res.exception)
    assert not [s for s in proxy.log if s.method == "PUT" and s.path.startswith("/cli")]


def test_create_on_serverless_says_how_documents_are_found(cluster_at, bundle, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("D2S_OPENSEARCH_AWS_SERVICE", "aoss")
    monkeypatch.setenv("D2S_OPENSEARCH_AWS_REGION", "eu-west-1")
    proxy = cluster_at("2.17.0", serverless=True)
    res = CliRunner().invoke(index_create, ["--url", proxy.url, "--index-name", "cli", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["indices"] == ["cli"] and "content_id" in out["layout"] and "no reindex" in out["layout"]
