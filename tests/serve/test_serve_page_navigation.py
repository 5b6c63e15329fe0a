"""Moving around the search page in a real browser (Chromium, headless): Back and Forward step
through searches (back to the library the page opened on), "/" goes to the search box, ← and → step through results in the picture view,
which links the full picture; on a phone the query's words keep to one row; file names wrap
between words; a word the model does not know is said beside the results.

Screenshots land in test-artifacts/serve/.
"""

from __future__ import annotations

import io

import httpx
import pytest
from PIL import Image

from tests.helpers import pattern_image
from tests.serve.conftest import make_app, make_index
from tests.serve.conftest import shot as _shot

LONG_NAME = "holiday_2024-06-01_the-long-beach-walk_with-grandparents_IMG_20240601_183455.jpg"


@pytest.fixture(scope="module")
def live_server(tmp_path_factory, tiny_blip_bundle, image_folder):
    """The 40 generated photos and one large photo with a long name."""
    from tests.serve.live import start_server

    root = tmp_path_factory.mktemp("navigation")
    big = root / "photos" / LONG_NAME
    big.parent.mkdir(parents=True)
    pattern_image(99, size=(1600, 1200)).save(big, "JPEG", quality=90)
    index = make_index(root / "index", tiny_blip_bundle, [image_folder, big.parent])
    server = start_server(make_app(tiny_blip_bundle, index, root / "thumbnails"))
    yield server
    server.stop()


def searches(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.searches || 0)"))


def wait_for_search(page, before: int) -> None:
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {before}")


def search(page, text: str) -> None:
    before = searches(page)
    page.fill("#q", text)
    page.press("#q", "Enter")
    wait_for_search(page, before)


def shown(page) -> list[str]:
    return page.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.id)")


def api(live_server, path: str, **params) -> dict:
    return httpx.get(f"{live_server.url}{path}", params=params, timeout=30).json()


def shot(page, name: str) -> None:
    if page.locator(".card").count():
        page.wait_for_selector("#grid[data-images=loaded]")
    _shot(page, name)


def test_back_and_forward_step_through_searches(page, live_server, image_folder):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    search(page, "a dog")
    search(page, "a red car")
    before = searches(page)
    page.click(".modes label:has(input[value=dense])")
    wait_for_search(page, before)
    dense_car = shown(page)

    def back_or_forward(step) -> None:
        before = searches(page)
        step()
        wait_for_search(page, before)

    back_or_forward(page.go_back)  # the sparse search for "a red car"
    assert page.input_value("#q") == "a red car" and "mode=sparse" in page.url
    assert page.is_checked("input[name=mode][value=sparse]")
    assert shown(page) == [
        r["id"] for r in api(live_server, "/api/search", q="a red car", k=20)["results"]
    ]
    back_or_forward(page.go_back)
    assert page.input_value("#q") == "a dog" and "q=a+dog&" in page.url + "&"
    assert shown(page) == [
        r["id"] for r in api(live_server, "/api/search", q="a dog", k=20)["results"]
    ]
    back_or_forward(page.go_forward)
    back_or_forward(page.go_forward)
    assert page.input_value("#q") == "a red car" and shown(page) == dense_car
    # a picture search is a step too: Back leaves it, Forward searches by the same picture again
    before = searches(page)
    page.set_input_files("#file", str(sorted(image_folder.rglob("*.jpg"))[5]))
    wait_for_search(page, before)
    by_picture = shown(page)
    back_or_forward(page.go_back)
    assert page.input_value("#q") == "a red car"
    back_or_forward(page.go_forward)
    assert "the picture" in page.inner_text("#summary") and shown(page) == by_picture
    # Back to where the page opened: the library again (newest first), the search box empty
    for _ in range(4):
        page.go_back()
    page.wait_for_function("document.querySelector('#grid').dataset.mode === 'library'")
    assert page.input_value("#q") == "" and page.is_hidden("#hello")
    assert shown(page) == [r["id"] for r in api(live_server, "/api/library", k=20)["results"]]
    shot(page, "10-back-to-start")


def test_slash_goes_to_the_search_box(page):
    page.goto("/?q=a+dog&k=5")
    page.wait_for_selector("#grid[data-state=done]")
    page.locator(".card .thumb").first.focus()
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "q"
    assert page.input_value("#q") == "a dog"  # "/" moved the cursor, it typed nothing
    page.keyboard.type("gs in a car")  # the old words were selected: typing replaces them
    assert page.input_value("#q") == "gs in a car"
    page.fill("#q", "cats/dogs")  # in the box, "/" is a character like any other
    page.press("#q", "End")
    page.keyboard.press("/")
    assert page.input_value("#q") == "cats/dogs/"


def test_arrow_keys_step_through_results_in_the_picture_view(page, live_server):
    page.goto("/?q=a+dog+on+the+beach&k=6")
    page.wait_for_selector("#grid[data-state=done]")
    want = api(live_server, "/api/search", q="a dog on the beach", k=6)["results"]
    page.locator(".card .thumb").first.click()
    page.wait_for_selector("#detail[open]")
    assert page.inner_text("#d-position") == "1 of 6" and page.is_disabled("#d-prev")
    for n in range(1, 6):
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            f"document.querySelector('#detail').dataset.id === '{want[n]['id']}'"
        )
        assert (
            page.inner_text("#d-name") == want[n]["name"]
            and page.inner_text("#d-position") == f"{n + 1} of 6"
        )
    assert page.is_disabled("#d-next")
    page.keyboard.press("ArrowRight")  # the last one: stays
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"document.querySelector('#detail').dataset.id === '{want[4]['id']}'")
    page.click("#d-prev")
    page.wait_for_function(f"document.querySelector('#detail').dataset.id === '{want[3]['id']}'")
    assert page.is_visible("#detail")
    shot(page, "11-detail-stepping")


def test_the_picture_view_links_the_full_picture(page, live_server):
    found = api(live_server, "/api/search", q="holiday beach walk", k=41)["results"]
    doc = next(r for r in found if r["name"] == LONG_NAME)
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    page.evaluate(f"openDetail('{doc['id']}')")
    page.wait_for_selector("#detail[open]")
    link = page.locator("#d-original")
    assert link.is_visible() and link.get_attribute("target") == "_blank"
    response = page.request.get(link.get_attribute("href"))
    assert response.status == 200 and response.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(response.body())).size == (1600, 1200)  # not the 1024 px preview
    preview = Image.open(io.BytesIO(page.request.get(f"/api/documents/{doc['id']}/preview").body()))
    assert max(preview.size) == 1024


def test_long_file_names_wrap_between_words(browser, live_server):
    found = api(live_server, "/api/search", q="holiday beach walk", k=41)["results"]
    doc = next(r for r in found if r["name"] == LONG_NAME)
    context = browser.new_context(viewport={"width": 390, "height": 844}, base_url=live_server.url)
    page = context.new_page()
    try:
        page.goto("/")
        page.wait_for_selector("body[data-ready=true]")
        page.evaluate(f"openDetail('{doc['id']}')")
        page.wait_for_selector("#detail[open]")
        assert page.inner_text("#d-name") == LONG_NAME  # the break opportunities add no characters
        for box in ("#d-name", "#d-path"):
            # the character before each line break: a separator, never a letter or digit
            before_breaks = page.evaluate(
                """(sel) => {
                const node = document.querySelector(sel);
                const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
                const chars = [];
                for (let t = walker.nextNode(); t; t = walker.nextNode()) {
                    for (let i = 0; i < t.length; i++) {
                        const r = document.createRange(); r.setStart(t, i); r.setEnd(t, i + 1);
                        const rect = r.getClientRects()[0];
                        if (rect) chars.push([t.data[i], rect.top]);
                    }
                }
                const out = [];
                for (let i = 1; i < chars.length; i++) if (chars[i][1] > chars[i - 1][1] + 2) out.push(chars[i - 1][0]);
                return out;
            }""",
                box,
            )
            assert before_breaks, f"{box} fits on one line: the test needs a narrower view"
            assert set(before_breaks) <= set("/_-. "), (box, before_breaks)
        _shot(page, "12-long-name-phone")
    finally:
        context.close()


def test_a_phone_keeps_the_query_words_to_one_row(browser, live_server):
    context = browser.new_context(
        viewport={"width": 390, "height": 844},
        base_url=live_server.url,
        is_mobile=True,
        has_touch=True,
        device_scale_factor=2,
    )
    page = context.new_page()
    try:
        page.goto("/?q=two+children+playing+with+a+dog+on+the+beach+at+sunset&k=20")
        page.wait_for_selector("#grid[data-state=done]")
        chips = page.locator("#query-terms .chip")
        assert chips.count() == 24
        tops = {
            round(box["y"])
            for box in (chips.nth(i).bounding_box() for i in range(chips.count()))
            if box
        }
        box = page.locator("#query-terms").bounding_box()
        row = chips.first.bounding_box()["height"]
        assert box["height"] <= row + 8, "the query's words take more than one row"
        assert len(tops) > 1  # they would wrap: the collapse is what keeps them to one row
        first = page.locator(".card img").first.bounding_box()
        assert first["y"] + first["height"] <= 844, "the first picture is below the fold"
        _shot(page, "13-phone")
        page.click("#query-terms-more")
        assert page.locator("#query-terms").bounding_box()["height"] > 2 * row
        assert page.inner_text("#query-terms-more") == "fewer words"
        page.click("#query-terms-more")
        page.set_viewport_size(
            {"width": 1280, "height": 900}
        )  # a wide screen: every word, no button
        page.wait_for_function("document.querySelector('#query-terms-more').hidden")
        assert chips.nth(23).is_visible()
    finally:
        context.close()


def test_a_word_the_model_does_not_know_is_said_beside_the_results(page, live_server):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    search(page, "giraffe zebra")
    assert page.is_visible("#notice")
    assert "does not know the word 'giraffe'" in page.inner_text("#notice")
    assert page.locator(".card").count() > 0
    own = page.locator("#query-terms .chip.own").all_inner_texts()
    assert set(own) <= {"zebra"}  # "gi", a fragment of giraffe, is not a typed word
    terms = api(live_server, "/api/search", q="giraffe zebra", k=1)["query_terms"]
    assert {t["term"] for t in terms if t["own"]} <= {"zebra"}
    shot(page, "14-unknown-word")
    search(page, "a dog in a car")
    assert not page.is_visible("#notice")
