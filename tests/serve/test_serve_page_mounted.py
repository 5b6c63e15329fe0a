"""The search page mounted under a prefix in another app (d2s_search.search_app), in a real
browser (Chromium, headless): searches, thumbnails, the picture view, "More like this" and Back
all stay under the prefix. Screenshots land in test-artifacts/serve/."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from tests.serve.conftest import shot

PREFIX = "/photos"


@pytest.fixture(scope="module")
def live_server(serve_index, thumbnail_dir):
    """A host app of its own, with the search page mounted at /photos (the ``page`` fixture
    opens this one)."""
    from fastapi import FastAPI

    import d2s_search
    from tests.serve.live import start_server

    host = FastAPI()

    @host.get("/")
    def home() -> dict:
        return {"app": "the host's own"}

    host.mount(PREFIX, d2s_search.search_app(serve_index, device="cpu", thumbnail_dir=thumbnail_dir))
    server = start_server(host)
    yield server
    server.stop()


def searches(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.searches || 0)"))


def search(page, text: str) -> None:
    before = searches(page)
    page.fill("#q", text)
    page.press("#q", "Enter")
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {before}")


def shown(page) -> list[str]:
    return page.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.id)")


def address(page) -> tuple[str, dict[str, str]]:
    """The page's path and query parameters."""
    url = urlsplit(page.url)
    return url.path, dict(parse_qsl(url.query))


def api(live_server, path: str, **params) -> dict:
    return httpx.get(f"{live_server.url}{PREFIX}{path}", params=params, timeout=30).json()


def test_the_mounted_page_searches_and_navigates_under_its_prefix(page, live_server):
    page.goto(f"{PREFIX}/")
    page.wait_for_selector("body[data-ready=true]")  # its status came from /photos/api/status
    search(page, "a dog in a car")
    page.wait_for_selector("#grid[data-images=loaded]")
    assert shown(page) == [r["id"] for r in api(live_server, "/api/search", q="a dog in a car", k=20)["results"]]
    images = page.locator(".card img")
    assert images.count() == 20
    for i in range(images.count()):
        assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0"), f"thumbnail {i} not shown"
    assert address(page) == (f"{PREFIX}/", {"mode": "sparse", "k": "20", "q": "a dog in a car"})
    shot(page, "mounted-01-results")
    first = page.locator(".card").first
    doc_id = first.get_attribute("data-id")
    first.locator(".thumb").click()
    page.wait_for_selector("#detail[open]")
    page.wait_for_function("document.querySelector('#d-img').complete && "
                           "document.querySelector('#d-img').naturalWidth > 0")
    assert page.inner_text("#d-name") == api(live_server, f"/api/documents/{doc_id}")["name"]
    before = searches(page)
    page.click("#d-more")
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {before}")
    assert shown(page) == [r["id"] for r in api(live_server, f"/api/documents/{doc_id}/similar", k=20)["results"]]
    assert address(page)[0] == f"{PREFIX}/" and address(page)[1]["like"] == doc_id
    before = searches(page)
    page.go_back()
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {before}")
    assert page.input_value("#q") == "a dog in a car" and address(page)[1]["q"] == "a dog in a car"
    assert shown(page)[0] == doc_id
    shot(page, "mounted-02-back")
    # The host keeps its own root.
    assert httpx.get(f"{live_server.url}/", timeout=30).json() == {"app": "the host's own"}
