"""Elasticsearch: an answer that is not the cluster's (a login wall or a proxy's HTML page with
status 200) is one line naming what answered, never a traceback, its reflected credentials hidden."""

from __future__ import annotations

import base64

import pytest

from tests.helpers import run_cli, write_image

PASSWORD = "hunter2-Pa55"
BASIC = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()


@pytest.fixture
def photos(tmp_path):
    for i in range(3):
        write_image(tmp_path / "photos" / f"p{i}.jpg", 720 + i)
    return tmp_path / "photos"


def error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [x for x in err.strip().splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, err
    assert PASSWORD not in err and BASIC not in err and "admin:" not in err
    return lines[0]


@pytest.mark.parametrize("where", ["/_bulk", "/_search"])
def test_an_html_page_instead_of_elasticsearch_is_one_line(
    where, photos, tiny_blip_bundle, es_proxy, capsys
):
    common = ["--bundle", tiny_blip_bundle, "--backend", "elasticsearch", "--index-name", "pages"]
    if where == "/_search":
        code, _, err = run_cli(["ingest", photos, "--url", es_proxy.url, *common], capsys)
        assert code == 0, err
    es_proxy.add("POST", where, "page", code=200)
    url = es_proxy.url.replace("http://", f"http://admin:{PASSWORD}@")
    args = ["ingest", photos] if where == "/_bulk" else ["query", "a photo"]
    code, out, err = run_cli([*args, "--url", url, *common], capsys)
    assert code == 1
    line = error_line(err)
    assert f"{es_proxy.url} answered POST " in line and "with 200 text/html" in line, line
    assert "not JSON: is this the Elasticsearch URL" in line, line


def test_debug_traceback_hides_the_credentials_a_500_page_echoes(
    photos, tiny_blip_bundle, es_proxy, capsys
):
    es_proxy.add("POST", "/_bulk", "page", code=500)
    url = es_proxy.url.replace("http://", f"http://admin:{PASSWORD}@")
    code, out, err = run_cli(
        [
            "--debug",
            "ingest",
            photos,
            "--bundle",
            tiny_blip_bundle,
            "--backend",
            "elasticsearch",
            "--url",
            url,
            "--index-name",
            "pages",
        ],
        capsys,
    )
    assert code == 1
    assert (
        "Traceback (most recent call last)" in err and "IndexStoreError" in err
    )  # --debug shows where
    assert "Authorization: ***" in err  # the page did echo it
    assert PASSWORD not in out + err and BASIC not in out + err and BASIC[:12] not in out + err
    assert err.strip().splitlines()[-1].startswith("error: bulk write to 'pages' failed")
