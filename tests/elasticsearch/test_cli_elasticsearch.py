"""The CLI with ``--backend elasticsearch`` against osmem behind the compatibility proxy
(esproxy.py explains the proxy): index create / stats / delete, ingest and query."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from d2s_search.backends.base import IndexIdentity
from d2s_search.cli import cli
from d2s_search.cli import index as cli_module
from d2s_search.cli.index import index_create, index_delete, index_stats
from tests.helpers import write_image


class FakeBundle:
    def __init__(self, fingerprint: str, dim: int = 8) -> None:
        self._id = IndexIdentity(fingerprint, dim, "fake")

    def identity(self) -> IndexIdentity:
        return self._id


def test_index_create_stats_delete(es_proxy, monkeypatch):
    monkeypatch.setattr(cli_module, "load_bundle", lambda path, verify=False: FakeBundle("e" * 32))
    monkeypatch.setenv("D2S_ELASTICSEARCH_USER", "elastic")
    monkeypatch.setenv("D2S_ELASTICSEARCH_PASSWORD", "cli-s3cret")
    runner = CliRunner()
    res = runner.invoke(index_create, ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", "cli",
                                       "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["created"] and out["indices"] == ["cli-000001"] and out["sparse_type"] == "rank_features"
    assert "cli-s3cret" not in res.output
    assert es_proxy.log[0].auth.startswith("Basic ")  # credentials from the environment reached the server

    again = runner.invoke(index_create, ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", "cli",
                                         "--json"])
    assert again.exit_code == 0 and not json.loads(again.output)["created"]

    stats = runner.invoke(index_stats, ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", "cli",
                                        "--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.output)["documents"] == 0

    gone = runner.invoke(index_delete, ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", "cli",
                                        "--yes", "--json"])
    assert gone.exit_code == 0, gone.output
    assert json.loads(gone.output)["deleted"] == f"{es_proxy.url}/cli"


def test_newer_mappings_refused_on_an_old_server(es_proxy, monkeypatch):
    monkeypatch.setattr(cli_module, "load_bundle", lambda path, verify=False: FakeBundle("e" * 32))
    res = CliRunner().invoke(index_create, ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", "new",
                                            "--dense-index", "int8_hnsw"])
    assert res.exit_code != 0
    assert "int8_hnsw needs Elasticsearch 8.12" in str(res.exception)


def test_url_from_environment_and_missing_url(es_proxy, monkeypatch):
    monkeypatch.setattr(cli_module, "load_bundle", lambda path, verify=False: FakeBundle("e" * 32))
    monkeypatch.setenv("D2S_ELASTICSEARCH_URL", es_proxy.url)
    res = CliRunner().invoke(index_create, ["--backend", "elasticsearch", "--index-name", "env", "--json"])
    assert res.exit_code == 0, res.output
    monkeypatch.delenv("D2S_ELASTICSEARCH_URL")
    res = CliRunner().invoke(index_create, ["--backend", "elasticsearch", "--index-name", "env"])
    assert res.exit_code == 2 and "D2S_ELASTICSEARCH_URL" in res.output


def test_ingest_and_query(tmp_path, es_proxy, tiny_blip_bundle):
    photos = tmp_path / "photos"
    for i in range(12):
        write_image(photos / f"{i:02d}.jpg", seed=i)
    runner = CliRunner()
    common = ["--bundle", str(tiny_blip_bundle), "--backend", "elasticsearch", "--url", es_proxy.url,
              "--index-name", "pics"]
    res = runner.invoke(cli, ["ingest", str(photos), *common, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["stored"] == 12
    for mode in ("sparse", "two-phase"):
        res = runner.invoke(cli, ["query", "a red pattern", "--mode", mode, "-k", "5", *common, "--json"])
        assert res.exit_code == 0, res.output
        hits = json.loads(res.output)["results"]
        assert 1 <= len(hits) <= 5
        assert all(h["path"].startswith(str(photos)) for h in hits)
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


@pytest.mark.parametrize("args", [["--backend", "elasticsearch"]])
def test_query_without_url_is_a_usage_error(args, tiny_blip_bundle):
    res = CliRunner().invoke(cli, ["query", "dog", "--bundle", str(tiny_blip_bundle), *args])
    assert res.exit_code == 2 and "D2S_ELASTICSEARCH_URL" in res.output


def test_elasticsearch_options_need_the_elasticsearch_backend(monkeypatch):
    monkeypatch.setattr(cli_module, "load_bundle", lambda path, verify=False: FakeBundle("e" * 32))
    res = CliRunner().invoke(index_create, ["--url", "http://127.0.0.1:9", "--sparse-type", "sparse_vector"])
    assert res.exit_code == 2 and "--sparse-type only apply with --backend elasticsearch" in res.output
