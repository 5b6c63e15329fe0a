"""``dashboards install`` against a local fake of the Dashboards saved-objects import API."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from d2s_dash_fake_dashboards import FakeDashboards

from d2s_search.backends.opensearch import dashboards_objects as so
from d2s_search.backends.opensearch.dashboards import (
    DashboardsClient,
    DashboardsError,
    install,
    load_objects,
)
from d2s_search.cli.cluster import dashboards
from d2s_search.errors import BackendUnavailableError


def client(url: str, **options) -> DashboardsClient:
    options.setdefault("sleep", lambda s: None)
    return DashboardsClient(url, **options)


def test_install_sends_what_dashboards_requires(dashboards_fake):
    with client(dashboards_fake.url) as c:
        result = install(c, load_objects())
    assert [(o["type"], o["id"]) for o in result.imported] == [(o["type"], o["id"]) for o in so.saved_objects()]
    (req,) = dashboards_fake.requests
    assert req["path"] == "/api/saved_objects/_import" and req["query"] == {"overwrite": ["true"]}
    assert req["headers"]["osd-xsrf"] == "true"
    assert req["headers"]["securitytenant"] == "global"
    assert req["headers"]["content-type"].startswith("multipart/form-data; boundary=")
    assert b'filename="d2s-search.ndjson"' in req["body"]
    assert len(dashboards_fake.objects) == 4


def test_install_twice_overwrites(dashboards_fake):
    with client(dashboards_fake.url) as c:
        install(c, load_objects())
        install(c, load_objects(index_name="pictures"))
    assert dashboards_fake.objects[("global", "index-pattern", so.INDEX_PATTERN_ID)]["attributes"]["title"] == "pictures"


def test_credentials_come_from_the_environment():
    fake = FakeDashboards(auth=("admin", "S3cret!pw"))
    try:
        env = {"D2S_OPENSEARCH_USER": "admin", "D2S_OPENSEARCH_PASSWORD": "S3cret!pw"}
        with DashboardsClient.from_env(fake.url, env=env) as c:
            assert len(install(c, load_objects()).imported) == 4
        # Dashboards' own variables win over the OpenSearch ones.
        env |= {"D2S_DASHBOARDS_USER": "admin", "D2S_DASHBOARDS_PASSWORD": "wrong-pw"}
        with DashboardsClient.from_env(fake.url, env=env, sleep=lambda s: None) as c, \
                pytest.raises(DashboardsError, match="refused the credentials") as err:
            install(c, load_objects())
        assert "wrong-pw" not in str(err.value) and "D2S_DASHBOARDS_USER" in str(err.value)
        assert "\n" not in str(err.value)
    finally:
        fake.close()


def test_waits_while_dashboards_starts():
    fake = FakeDashboards(not_ready=2)
    slept: list[float] = []
    try:
        with DashboardsClient(fake.url, sleep=slept.append) as c:
            install(c, load_objects())
        assert len(slept) == 2 and len(fake.objects) == 4
    finally:
        fake.close()


def test_missing_references_are_reported_in_one_line(dashboards_fake, tmp_path):
    only_dashboard = tmp_path / "dash.ndjson"
    only_dashboard.write_text(so.to_ndjson([so.dashboard()]))
    with client(dashboards_fake.url) as c, pytest.raises(DashboardsError) as err:
        install(c, load_objects([only_dashboard]))
    message = str(err.value)
    assert "dashboard/d2s-dashboard: missing references visualization/d2s-terms-tagcloud, search/d2s-images" in message
    assert "\n" not in message


def test_files_and_folders_can_be_imported(dashboards_fake, tmp_path):
    (tmp_path / "a.ndjson").write_text(so.to_ndjson(so.saved_objects()[:2]))
    (tmp_path / "b.ndjson").write_text(so.to_ndjson(so.saved_objects()[2:]))
    objects = load_objects([tmp_path], index_name="other")
    assert objects == so.saved_objects("other")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DashboardsError, match="no .ndjson files"):
        load_objects([tmp_path / "a.ndjson", tmp_path / "empty"])
    (tmp_path / "bad.ndjson").write_text("{oops\n")
    with pytest.raises(DashboardsError, match="bad.ndjson: line 1"):
        load_objects([tmp_path / "bad.ndjson"])


def test_opensearch_url_instead_of_dashboards_is_explained(osmem_url):
    with client(osmem_url, retries=0) as c, pytest.raises(DashboardsError, match="is this the Dashboards URL"):
        install(c, load_objects())


def test_unreachable_dashboards():
    with client("http://127.0.0.1:9", retries=1) as c, pytest.raises(BackendUnavailableError, match="cannot reach"):
        install(c, load_objects())


def test_no_tenant_header_when_asked(dashboards_fake):
    with client(dashboards_fake.url, tenant=None) as c:
        install(c, load_objects())
    assert "securitytenant" not in dashboards_fake.requests[0]["headers"]


def test_the_spec_does_not_cover_the_dashboards_api(spec):
    # Recorded here so a future spec that adds it makes this test ask for validation.
    with pytest.raises(KeyError):
        spec.operation("POST", "/api/saved_objects/_import")


# -- the command ---------------------------------------------------------------------------

def test_cli_install_json(dashboards_fake):
    result = CliRunner().invoke(dashboards, ["install", "--url", dashboards_fake.url, "--index-name", "pics",
                                             "--json"], standalone_mode=False)
    assert result.exception is None, result.output
    payload = json.loads(result.stdout)
    assert payload["tenant"] == "global" and len(payload["imported"]) == 4
    assert dashboards_fake.objects[("global", "index-pattern", so.INDEX_PATTERN_ID)]["attributes"]["title"] == "pics"


def test_cli_needs_a_url():
    result = CliRunner().invoke(dashboards, ["install"], env={"D2S_DASHBOARDS_URL": ""})
    assert result.exit_code == 2 and "D2S_DASHBOARDS_URL" in result.output
