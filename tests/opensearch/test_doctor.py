"""``d2s-search doctor`` against osmem-server (core OpenSearch, no plugins)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from d2s_search.backends.opensearch.doctor import FAIL, OK, WARN, diagnose
from d2s_search.cli import cli


@pytest.fixture(autouse=True)
def no_bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("D2S_CONFIG_DIR", str(tmp_path / "config"))  # no bundle exported here
    monkeypatch.delenv("D2S_BUNDLE", raising=False)


def run(*args):
    return CliRunner().invoke(cli, ["doctor", *args], catch_exceptions=False)


def test_doctor_on_core_opensearch(backend, identity):
    report = diagnose(backend, identity)
    by = {c.name: c for c in report.checks}
    assert [c.name for c in report.checks] == ["reachable", "version", "distribution", "plugins", "plans",
                                               "request bodies", "max_clause_count", "ml-commons", "index"]
    assert by["reachable"].status == OK and by["distribution"].detail == "OpenSearch"
    assert by["version"].data["version"] == "3.8.0"  # what osmem reports
    plans = by["plans"].data["plans"]
    assert plans["sparse"] and plans["two-phase"] and not plans["dense"] and not plans["hybrid rrf"]
    assert by["plugins"].status == WARN and by["plans"].status == WARN
    assert "combination.rank_constant" in by["request bodies"].detail and "pagination_depth" in by["request bodies"].detail
    assert by["max_clause_count"].data["max_clause_count"] == 1024
    assert by["ml-commons"].status == "skip"
    assert by["index"].status == OK and "matches" in by["index"].detail and by["index"].data["documents"] == 0
    assert not report.failed


def test_doctor_flags_another_bundle(backend, identity):
    from dataclasses import replace

    other = replace(identity, fingerprint="0" * 32)
    check = diagnose(backend, other).get("index")
    assert check.status == FAIL and "filled with bundle ffffffffffff" in check.detail


def test_doctor_cli_lines_and_json(backend, osmem_url):
    res = run("--url", osmem_url, "--index-name", backend.index_name)
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 9 and lines[0].startswith("ok") and "reachable" in lines[0]
    res = run("--url", osmem_url, "--index-name", backend.index_name, "--json")
    payload = json.loads(res.output)
    assert payload["ok"] is True and {c["check"] for c in payload["checks"]} >= {"version", "plans", "index"}


def test_doctor_without_an_index_warns(osmem_url):
    res = run("--url", osmem_url, "--index-name", "nothing-here", "--json")
    index = next(c for c in json.loads(res.output)["checks"] if c["check"] == "index")
    assert index["status"] == WARN and "no index" in index["detail"] and res.exit_code == 0


def test_doctor_unreachable_is_a_one_line_error():
    from d2s_search.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["doctor", "--url", "http://127.0.0.1:9"])
    assert exit_.value.code == 1
