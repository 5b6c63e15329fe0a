"""``d2s-search doctor --backend elasticsearch`` on the Elasticsearch stand-in (osmem behind the
compatibility proxy, answering as a given version): the plans that version offers, the bodies it
gets, and the index (a sparse_vector field that does not prune)."""

from __future__ import annotations

import json

import httpx
import pytest
from click.testing import CliRunner
from d2s_es_proxy import CompatProxy

from d2s_search.backends.elasticsearch import queries as q
from d2s_search.backends.elasticsearch.doctor import OK, WARN, diagnose
from d2s_search.backends.elasticsearch.queries import VectorMapping


@pytest.fixture
def es_at(osmem_url):
    made = []

    def make(version: str) -> CompatProxy:
        proxy = CompatProxy(osmem_url, pretend_version=version)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def test_doctor_on_elasticsearch_9(es_at, make_backend, identity):
    proxy = es_at("9.1.0")
    b = make_backend(proxy.url, index_name="sv", mapping=VectorMapping(sparse_type="sparse_vector"))
    b.open(identity)
    by = {c.name: c for c in diagnose(b, identity).checks}
    assert by["version"].detail == "Elasticsearch 9.1"
    plans = by["plans"].data["plans"]
    assert plans["sparse_vector"] and plans["dense"] and plans["hybrid (fused here)"]
    assert not plans["hybrid (rrf retriever)"]  # no Enterprise or trial license
    assert "needs an Enterprise or trial license" in by["plans"].detail
    assert (
        "prune: false" in by["request bodies"].detail
        and by["request bodies"].data["sparse_index_options"]
    )
    assert by["index"].status == OK and "index_options prune false" in by["index"].detail


def test_doctor_warns_of_a_field_left_pruning(es_at, make_backend, identity):
    proxy = es_at("9.1.0")
    plain = q.index_body(identity, VectorMapping(sparse_type="sparse_vector"), shards=1, replicas=0)
    assert httpx.put(f"{proxy.url}/plain", json=plain).status_code == 200
    b = make_backend(proxy.url, index_name="plain")
    index = {c.name: c for c in diagnose(b, identity).checks}["index"]
    assert index.status == WARN and "may prune query tokens by default" in index.detail


@pytest.mark.parametrize(
    ("version", "sparse_vector", "prunes"),
    [
        ("8.11.0", False, False),
        ("8.15.0", True, False),
        ("8.19.2", True, True),
        ("9.0.1", True, False),
    ],
)
def test_plans_and_bodies_follow_the_version(es_at, make_backend, version, sparse_vector, prunes):
    b = make_backend(es_at(version).url, index_name="none")
    by = {c.name: c for c in diagnose(b).checks}
    assert by["plans"].data["plans"]["sparse_vector"] is sparse_vector
    assert by["request bodies"].data["sparse_index_options"] is prunes
    assert by["index"].status == WARN and "no index" in by["index"].detail


def test_doctor_cli_with_the_elasticsearch_backend(es_at, monkeypatch, tmp_path):
    monkeypatch.setenv("D2S_CONFIG_DIR", str(tmp_path / "config"))
    from d2s_search.cli import cli

    proxy = es_at("9.1.0")
    res = CliRunner().invoke(
        cli,
        [
            "doctor",
            "--backend",
            "elasticsearch",
            "--url",
            proxy.url,
            "--index-name",
            "nothing",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    checks = {c["check"]: c for c in json.loads(res.output)["checks"]}
    assert checks["plans"]["data"]["plans"]["sparse_vector"] is True
