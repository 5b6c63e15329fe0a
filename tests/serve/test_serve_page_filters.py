"""The library and the filters on the search page, in a real browser (Chromium, headless)
against a real server over photos with EXIF and a sidecar (conftest.make_library).

Screenshots land in test-artifacts/serve/.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.serve.conftest import make_app, make_library
from tests.serve.conftest import shot as _shot

NEWEST_FIRST = ["h2", "h1", "n2", "n1", "p3", "p2", "p1", "scan"]


@pytest.fixture(scope="module")
def live_server(tmp_path_factory, tiny_blip_bundle):
    from tests.serve.live import start_server

    root = tmp_path_factory.mktemp("page-filters")
    server = start_server(make_app(tiny_blip_bundle, make_library(root, tiny_blip_bundle), root / "thumbnails"))
    yield server
    server.stop()


def counter(page, name: str) -> int:
    return int(page.evaluate(f"Number(document.body.dataset.{name} || 0)"))


def after_step(page, act) -> None:
    """Do ``act`` and wait until one more search has ended and the facets are counted again."""
    searches, facets = counter(page, "searches"), counter(page, "facets")
    act()
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {searches}")
    page.wait_for_function(f"Number(document.body.dataset.facets || 0) > {facets}")


def open_page(page, address: str = "/") -> None:
    page.goto(address)
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_function("Number(document.body.dataset.facets || 0) > 0")


def shown(page) -> list[str]:
    return page.eval_on_selector_all(".card", "cards => cards.map(c => c.querySelector('.name').title)")


def stems(paths) -> list[str]:
    return [Path(p).stem for p in paths]


def api(live_server, path: str, **params) -> dict:
    return httpx.get(f"{live_server.url}{path}", params=params, timeout=30).json()


def address(page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


def facet(page, field: str, value: str):
    return page.locator(f'.facet[data-field="{field}"] .facet-value').filter(has_text=value)


def chips(page) -> list[str]:
    return page.locator("#active-filters .chip").all_inner_texts()


def shot(page, name: str) -> None:
    if page.locator(".card").count():
        page.wait_for_selector("#grid[data-images=loaded]")
    _shot(page, name)


def test_the_page_opens_on_the_library_newest_first(page, live_server):
    open_page(page)
    assert page.get_attribute("#grid", "data-mode") == "library" and page.is_hidden("#hello")
    assert stems(shown(page)) == NEWEST_FIRST
    assert [r["path"] for r in api(live_server, "/api/library", k=20)["results"]] == shown(page)
    days = page.locator(".card .taken").all_inner_texts()
    assert days[0] == "2023-01-01" and days[-1] == "2010-01-01" and days == sorted(days, reverse=True)
    assert "8 pictures" in page.inner_text("#summary") and "newest first" in page.inner_text("#summary")
    # facets with their counts; the place box because some pictures have a position
    assert facet(page, "camera", "Google Pixel 7").inner_text().split() == ["Google", "Pixel", "7", "3"]
    assert page.locator('.facet[data-field="folder"] .facet-value').all_inner_texts() == [
        "home 3", "trips/paris 3", "trips/nyc 2"]
    assert page.is_visible("#f-place") and page.is_visible("#f-from") and page.is_visible("#f-to")
    # a field value is the user's text, shown as text: never markup
    assert facet(page, "who", "<b>bob</b>").count() == 1 and page.locator("#facets b").count() == 0
    assert not page.is_visible("#more")  # all eight on one page
    shot(page, "filters-01-library")
    # the picture view says when, with what and the user's fields (as text)
    page.locator(".card").nth(5).locator(".thumb").click()
    page.wait_for_selector("#detail[open]")
    caption = page.inner_text("#d-caption")
    assert caption.startswith("taken 2019-06-20 18:00:00 UTC · Canon EOS 5D · 96 × 72 px"), caption
    assert "who: <b>bob</b>" in caption and "rating: 3" in caption and page.locator("#d-caption b").count() == 0


def test_a_camera_facet_narrows_and_its_chip_removes_it(page, live_server):
    open_page(page)
    after_step(page, lambda: facet(page, "camera", "Canon EOS 5D").click())
    want = api(live_server, "/api/library", k=20, where="camera=Canon EOS 5D")["results"]
    assert shown(page) == [r["path"] for r in want] and stems(shown(page)) == ["p2", "p1"]
    assert chips(page) == ["camera = Canon EOS 5D"] and address(page)["where"] == ["camera=Canon EOS 5D"]
    assert facet(page, "camera", "Canon EOS 5D").get_attribute("aria-pressed") == "true"
    assert facet(page, "who", "ann").inner_text() == "ann 1"  # counted within the filter
    assert page.inner_text("#summary").startswith("2 pictures · the library, newest first · only camera = Canon EOS 5D")
    # the other cameras stay offered, as alternatives: Canon or Pixel
    assert facet(page, "camera", "Google Pixel 7").inner_text() == "Google Pixel 7 3"
    assert facet(page, "camera", "Google Pixel 7").get_attribute("aria-pressed") == "false"
    shot(page, "filters-02-camera")
    after_step(page, lambda: facet(page, "camera", "Google Pixel 7").click())
    assert stems(shown(page)) == ["n2", "n1", "p3", "p2", "p1"]
    assert chips(page) == ["camera = Canon EOS 5D", "camera = Google Pixel 7"]

    # a second field, from the keyboard: both hold
    button = facet(page, "favourite", "true")
    after_step(page, lambda: (button.focus(), page.keyboard.press("Enter")))
    assert stems(shown(page)) == ["n1", "p1"]
    assert chips(page) == ["camera = Canon EOS 5D", "camera = Google Pixel 7", "favourite = true"]

    # a reload keeps the filters, their chips and the facets' state
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_function("Number(document.body.dataset.facets || 0) > 0")
    assert stems(shown(page)) == ["n1", "p1"] and len(chips(page)) == 3
    assert facet(page, "camera", "Canon EOS 5D").get_attribute("aria-pressed") == "true"

    # removing a chip widens or narrows again; Back puts it back
    remove = page.get_by_role("button", name="remove the filter camera = Google Pixel 7")
    after_step(page, remove.click)
    assert stems(shown(page)) == ["p1"] and chips(page) == ["camera = Canon EOS 5D", "favourite = true"]
    after_step(page, page.go_back)
    assert stems(shown(page)) == ["n1", "p1"] and len(chips(page)) == 3
    after_step(page, lambda: page.click("#active-filters .clear-filters"))
    assert stems(shown(page)) == NEWEST_FIRST and chips(page) == [] and "where" not in address(page)


def test_a_date_range_narrows_a_search(page, live_server):
    open_page(page, "/?q=a+photo&k=8")
    assert page.get_attribute("#grid", "data-mode") == "sparse" and len(shown(page)) == 8
    after_step(page, lambda: page.fill("#f-from", "2019-06-01"))
    assert set(stems(shown(page))) == {"p1", "p2", "p3", "n1", "n2", "h1", "h2"}
    after_step(page, lambda: page.fill("#f-to", "2019-06-30"))  # the last day included
    want = api(live_server, "/api/search", q="a photo", k=8, after="2019-06-01", before="2019-07-01")["results"]
    assert shown(page) == [r["path"] for r in want] and set(stems(shown(page))) == {"p1", "p2"}
    assert address(page)["after"] == ["2019-06-01"] and address(page)["before"] == ["2019-07-01"]
    assert address(page)["q"] == ["a photo"] and page.input_value("#q") == "a photo"
    assert chips(page) == ["taken from 2019-06-01 to 2019-06-30"]
    shot(page, "filters-03-dates")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.input_value("#f-from") == "2019-06-01" and page.input_value("#f-to") == "2019-06-30"
    assert shown(page) == [r["path"] for r in want] and chips(page) == ["taken from 2019-06-01 to 2019-06-30"]


def test_a_place_narrows_and_a_bad_one_is_said(page, live_server):
    open_page(page)
    after_step(page, lambda: (page.fill("#f-near", "48.8566,2.3522,5"), page.press("#f-near", "Enter")))
    assert stems(shown(page)) == ["p3", "p2", "p1"] and chips(page) == ["within 5 km of 48.8566,2.3522"]
    searches = counter(page, "searches")
    page.fill("#f-near", "Paris")
    page.press("#f-near", "Enter")
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {searches}")
    assert "near='Paris'" in page.inner_text("#message.error") and page.locator(".card").count() == 0


def test_more_of_the_library(page, live_server):
    open_page(page, "/?k=3")
    assert stems(shown(page)) == NEWEST_FIRST[:3] and page.is_visible("#more")
    page.click("#more")
    page.wait_for_function("document.querySelectorAll('.card').length === 6")
    page.click("#more")
    page.wait_for_function("document.querySelectorAll('.card').length === 8")
    assert stems(shown(page)) == NEWEST_FIRST and page.is_hidden("#more")
    assert page.eval_on_selector_all(".card", "cs => cs.map(c => c.dataset.rank)") == [str(n) for n in range(1, 9)]
