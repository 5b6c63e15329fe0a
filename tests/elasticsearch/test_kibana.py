"""``d2s-search kibana install`` against a local fake Kibana (fake_kibana.py, modelled on
Kibana's own source) and the saved objects themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from d2s_es_fake_kibana import FakeKibana

from d2s_search.backends.elasticsearch import kibana_objects as ko
from d2s_search.backends.elasticsearch.kibana import (
    KibanaClient,
    KibanaError,
    install,
    load_objects,
)
from d2s_search.cli import cli
from d2s_search.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake():
    k = FakeKibana(users={"elastic": "pw-of-elastic"}, api_keys={"a2V5OnNlY3JldA=="}, spaces={"pictures"})
    yield k
    k.close()


def client(fake, **options) -> KibanaClient:
    options.setdefault("user", "elastic")
    options.setdefault("password", "pw-of-elastic")
    options.setdefault("sleep", lambda s: None)
    return KibanaClient(fake.url, **options)


def test_shipped_ndjson_is_the_builders_output():
    text = (ROOT / "mappings" / "kibana" / "d2s-search.ndjson").read_text(encoding="utf-8")
    assert text == ko.to_ndjson(ko.saved_objects())


def test_objects_reference_each_other_and_show_thumbnails():
    objects = {(o["type"], o["id"]): o for o in ko.saved_objects("pictures")}
    view = objects[("index-pattern", ko.DATA_VIEW_ID)]["attributes"]
    assert view["title"] == "pictures"
    fmt = json.loads(view["fieldFormatMap"])["url"]
    assert fmt["id"] == "url" and fmt["params"]["type"] == "img"
    search = objects[("search", ko.SEARCH_ID)]
    assert search["attributes"]["columns"] == ["url", "path", "terms"]
    cloud = json.loads(objects[("visualization", ko.TAGCLOUD_ID)]["attributes"]["visState"])
    assert cloud["type"] == "tagcloud"
    assert cloud["aggs"][1]["params"]["field"] == "terms"
    dash = objects[("dashboard", ko.DASHBOARD_ID)]
    panels = json.loads(dash["attributes"]["panelsJSON"])
    refs = {r["name"]: (r["type"], r["id"]) for r in dash["references"]}
    # Kibana resolves a panel's object as the reference whose name equals its panelRefName.
    assert {refs[p["panelRefName"]] for p in panels} == {("visualization", ko.TAGCLOUD_ID), ("search", ko.SEARCH_ID)}
    for o in objects.values():
        for r in o["references"]:
            assert (r["type"], r["id"]) in objects


def test_install_imports_everything_in_one_request(fake):
    with client(fake) as c:
        result = install(c, load_objects())
    assert [o["id"] for o in result.imported] == [o["id"] for o in ko.saved_objects()]
    (post,) = [s for s in fake.seen if s.method == "POST"]
    assert post.path == "/api/saved_objects/_import?overwrite=true"
    assert post.headers["kbn-xsrf"] == "true"
    assert post.filename.endswith(".ndjson")
    assert set(fake.stored["default"]) == {(o["type"], o["id"]) for o in ko.saved_objects()}
    # Again: overwrite makes it idempotent.
    with client(fake) as c:
        install(c, load_objects())
    assert len(fake.stored["default"]) == 4


def test_install_into_a_space(fake):
    with client(fake, space="pictures") as c:
        install(c, load_objects(index_name="photos"))
    assert fake.stored["default"] == {}
    view = fake.stored["pictures"][("index-pattern", ko.DATA_VIEW_ID)]
    assert view["attributes"]["title"] == "photos"
    assert any(s.path == "/s/pictures/api/saved_objects/_import?overwrite=true" for s in fake.seen)


def test_unknown_space_refused_before_importing(fake):
    with client(fake, space="nope") as c, pytest.raises(KibanaError, match="no Kibana space 'nope'"):
        install(c, load_objects())
    assert not [s for s in fake.seen if s.method == "POST"]


def test_api_key_auth(fake):
    with KibanaClient(fake.url, api_key="a2V5OnNlY3JldA==") as c:
        install(c, load_objects())
    assert fake.seen[-1].headers["authorization"] == "ApiKey a2V5OnNlY3JldA=="


def test_bad_credentials_are_one_line_without_the_password(fake):
    with client(fake, password="wrong-secret") as c, pytest.raises(KibanaError) as info:
        install(c, load_objects())
    assert "401" in str(info.value) and "wrong-secret" not in str(info.value)


def test_the_fake_refuses_what_kibana_refuses(fake):
    """The fake is only useful if it fails where Kibana fails."""
    import httpx

    auth = ("elastic", "pw-of-elastic")
    files = {"file": ("x.ndjson", ko.to_ndjson(ko.saved_objects()).encode(), "application/ndjson")}
    r = httpx.post(f"{fake.url}/api/saved_objects/_import", auth=auth, files=files)
    assert r.status_code == 400 and r.json()["message"] == "Request must contain a kbn-xsrf header."
    r = httpx.post(f"{fake.url}/api/saved_objects/_import", auth=auth, headers={"kbn-xsrf": "1"},
                   files={"file": ("x.json", b"{}", "application/json")})
    assert r.status_code == 400 and r.json()["message"] == "Invalid file extension .json"
    r = httpx.post(f"{fake.url}/api/saved_objects/_import?overwrite=true&createNewCopies=true", auth=auth,
                   headers={"kbn-xsrf": "1"}, files=files)
    assert r.status_code == 400


def test_missing_references_reported_per_object(fake, tmp_path):
    only_dashboard = [o for o in ko.saved_objects() if o["type"] == "dashboard"]
    file = tmp_path / "dash.ndjson"
    file.write_text(ko.to_ndjson(only_dashboard), encoding="utf-8")
    with client(fake) as c, pytest.raises(KibanaError, match="missing references visualization/d2s-kibana-terms"):
        install(c, load_objects([file]))


def test_retries_while_kibana_starts(fake):
    fake.not_ready = 2
    delays = []
    with client(fake, sleep=delays.append) as c:
        install(c, load_objects())
    assert len(delays) == 2


def test_unreachable_kibana(fake):
    with client(fake, retries=0) as c:
        c.url = "http://127.0.0.1:9"
        c._client.base_url = "http://127.0.0.1:9"
        with pytest.raises(BackendUnavailableError, match="cannot reach Kibana"):
            install(c, load_objects())


def test_bad_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"type": "search"}\n', encoding="utf-8")
    with pytest.raises(KibanaError, match="needs 'id'"):
        load_objects([bad])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KibanaError, match="no .ndjson files"):
        load_objects([empty])


def test_cli_install_json(fake, monkeypatch):
    monkeypatch.setenv("D2S_KIBANA_USER", "elastic")
    monkeypatch.setenv("D2S_KIBANA_PASSWORD", "pw-of-elastic")
    result = CliRunner().invoke(cli, ["kibana", "install", "--url", fake.url, "--space", "pictures", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["space"] == "pictures" and len(payload["imported"]) == 4
    assert "pw-of-elastic" not in result.output
