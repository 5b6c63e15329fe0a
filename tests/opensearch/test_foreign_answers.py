"""An answer that is not OpenSearch's (a login wall or a proxy's HTML page with status 200) is
one line naming what answered, never a traceback; the page's reflected credentials stay hidden."""

from __future__ import annotations

import base64

import pytest

from tests.helpers import run_cli, write_image

PASSWORD = "hunter2-Pa55"
BASIC = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()


@pytest.fixture
def photos(tmp_path):
    for i in range(3):
        write_image(tmp_path / "photos" / f"p{i}.jpg", 700 + i)
    return tmp_path / "photos"


def assert_one_line_about_the_page(err: str, proxy_url: str, method_path: str) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len([x for x in lines if x.startswith("error: ")]) == 1, err
    (line,) = [x for x in lines if x.startswith("error: ")]
    assert f"{proxy_url} answered {method_path} with 200 text/html, not JSON" in line, line
    assert PASSWORD not in err and BASIC not in err and "admin:" not in err


def test_bulk_answered_with_an_html_page_is_one_line(photos, tiny_blip_bundle, proxy, capsys):
    proxy.add("POST", "/_bulk", "page", code=200)
    url = proxy.url.replace("http://", f"http://admin:{PASSWORD}@")
    code, out, err = run_cli(
        ["ingest", photos, "--bundle", tiny_blip_bundle, "--url", url, "--index-name", "pages"],
        capsys,
    )
    assert code == 1
    assert_one_line_about_the_page(err, proxy.url, "POST /_bulk")


def test_search_and_reads_answered_with_an_html_page_are_one_line(
    photos, tiny_blip_bundle, proxy, osmem_url, capsys
):
    common = ["--bundle", tiny_blip_bundle, "--index-name", "pages"]
    code, _, err = run_cli(["ingest", photos, "--url", osmem_url, *common], capsys)
    assert code == 0, err
    url = proxy.url.replace("http://", f"http://admin:{PASSWORD}@")
    proxy.add("POST", "/_search", "page", code=200)
    code, out, err = run_cli(["query", "a photo", "--url", url, *common], capsys)
    assert code == 1 and out == ""
    assert_one_line_about_the_page(err, proxy.url, "POST /pages/_search")
    proxy.add(
        "GET", "/", "page", code=200, times=100
    )  # every read: the mapping, the cluster's settings
    code, out, err = run_cli(["index", "stats", "--url", url, "--index-name", "pages"], capsys)
    assert code == 1 and out == ""
    assert_one_line_about_the_page(err, proxy.url, "GET /pages/_mapping")
