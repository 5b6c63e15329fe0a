"""The search page in a real browser (Chromium, headless) against a real server.

Screenshots of every step land in test-artifacts/serve/.
"""

from __future__ import annotations

import httpx
import pytest

from tests.serve.conftest import shot as _shot

pytestmark = pytest.mark.usefixtures("live_server")


def shot(page, name: str) -> None:
    """A screenshot once every thumbnail on the page has loaded (or failed)."""
    if page.locator(".card").count():
        page.wait_for_selector("#grid[data-images=loaded]")
    _shot(page, name)


def searches(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.searches || 0)"))


def wait_for_search(page, before: int) -> None:
    """Until the page has finished one more search (rendered, or showing its error)."""
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {before}")


def search(page, text: str) -> None:
    before = searches(page)
    page.fill("#q", text)
    page.press("#q", "Enter")
    wait_for_search(page, before)


def shown(page) -> list[tuple[str, str]]:
    """(id, score text) of the cards on the page, in order."""
    return page.eval_on_selector_all(".card", "cards => cards.map(c => [c.dataset.id, c.querySelector('.score').textContent])")


def api(live_server, path: str, **params) -> dict:
    return httpx.get(f"{live_server.url}{path}", params=params, timeout=30).json()


def test_a_search_renders_thumbnails_with_their_words(page, live_server):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    shot(page, "01-start")
    search(page, "a dog in a car")
    page.wait_for_selector("#grid[data-images=loaded]")
    cards = page.locator(".card")
    assert cards.count() == 20
    want = api(live_server, "/api/search", q="a dog in a car", k=20)
    assert [i for i, _ in shown(page)] == [r["id"] for r in want["results"]]
    for i in range(cards.count()):
        card = cards.nth(i)
        assert card.locator("img").evaluate("img => img.complete && img.naturalWidth > 0"), f"thumbnail {i} not shown"
        chips = card.locator(".chip").all_inner_texts()
        assert chips == [m["term"] for m in want["results"][i]["matched"]]
    # Chips are sized by contribution: the strongest word of the page is the biggest.
    sizes = page.eval_on_selector_all(".card .chip", "cs => cs.map(c => parseFloat(getComputedStyle(c).fontSize))")
    assert max(sizes) > min(sizes)
    assert "20 results" in page.inner_text("#summary") and "sparse" in page.inner_text("#summary")
    assert page.locator("#query-terms .chip").count() > 0
    assert "q=a+dog+in+a+car" in page.url  # the search is in the address, so reloading keeps it
    shot(page, "02-results-sparse")


def test_the_mode_switch_changes_results(page, live_server):
    page.goto("/?q=a+dog+in+a+car&k=12")
    page.wait_for_selector("#grid[data-state=done]")
    sparse = shown(page)
    for mode in ("dense", "hybrid", "two-phase"):
        before = searches(page)
        page.click(f".modes label:has(input[value={mode}])")
        wait_for_search(page, before)
        assert page.get_attribute("#grid", "data-mode") == mode
        assert mode in page.inner_text("#summary .mode-label")
        now = shown(page)
        assert now != sparse, f"{mode} shows the same results as sparse"
        want = api(live_server, "/api/search", q="a dog in a car", k=12, mode=mode)
        assert [i for i, _ in now] == [r["id"] for r in want["results"]]
        assert f"mode={mode}" in page.url
        if mode == "hybrid":
            assert page.is_visible("#hybrid-options")
            shot(page, "03-results-hybrid")
        if mode == "dense":
            shot(page, "03-results-dense")
    assert not page.is_visible("#hybrid-options")


def test_detail_view_and_more_like_this(page, live_server):
    page.goto("/?q=two+children+playing+on+the+beach&k=8")
    page.wait_for_selector("#grid[data-state=done]")
    first = page.locator(".card").first
    doc_id = first.get_attribute("data-id")
    first.locator(".thumb").click()
    page.wait_for_selector("#detail[open]")
    page.wait_for_function("document.querySelector('#d-img').complete && document.querySelector('#d-img').naturalWidth > 0")
    detail = api(live_server, f"/api/documents/{doc_id}")
    assert page.inner_text("#d-name") == detail["name"]
    bars = page.locator("#d-bars .bar-row")
    # One bar per word (its 64 terms, inflections collapsed), in the API's order (strongest first):
    # the strongest 40, then "show more".
    words = detail["words"]
    assert 40 < len(words) <= 64 and sum(len(w["terms"]) for w in words) == 64
    assert bars.count() == 40 and page.inner_text("#d-count") == f"({len(words)})"
    assert [bars.nth(i).locator(".term").inner_text() for i in range(5)] == [w["word"] for w in words[:5]]
    # The query's words: those with a form the picture has too are highlighted.
    query_chips = page.locator("#d-query-terms .chip")
    assert query_chips.count() > 0
    carried = {t["term"] for t in detail["terms"]}
    chip_terms = [set(c.split()) for c in query_chips.evaluate_all("cs => cs.map(c => c.dataset.terms)")]
    hits = [c.get_attribute("class").endswith(" hit") for c in query_chips.all()]
    assert hits == [bool(terms & carried) for terms in chip_terms]
    assert page.locator("#d-bars .bar-row.in-query").count() > 0
    shot(page, "04-detail")
    page.click("#d-all")
    assert bars.count() == len(words)
    before = searches(page)
    page.click("#d-more")
    wait_for_search(page, before)
    assert not page.is_visible("#detail")
    ids = [i for i, _ in shown(page)]
    want = api(live_server, f"/api/documents/{doc_id}/similar", k=8)
    assert ids == [r["id"] for r in want["results"]] and doc_id not in ids
    assert "more like" in page.inner_text("#summary") and page.input_value("#q") == ""
    assert f"like={doc_id}" in page.url
    shot(page, "05-more-like-this")
    # The mode switch re-runs "more like this", not an old text query.
    before = searches(page)
    page.click(".modes label:has(input[value=dense])")
    wait_for_search(page, before)
    assert "more like" in page.inner_text("#summary") and page.get_attribute("#grid", "data-mode") == "dense"


def test_empty_and_bad_queries_show_a_message(page):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    page.click("button[type=submit]")
    assert page.is_visible("#message")
    assert "Type some words" in page.inner_text("#message")
    shot(page, "06-empty-query")
    page.fill("#k", "0")
    search(page, "a dog")
    assert "k:" in page.inner_text("#message") and "greater than or equal to 1" in page.inner_text("#message")
    assert page.locator("#message.error").count() == 1 and page.locator(".card").count() == 0
    shot(page, "07-bad-k")
    page.fill("#k", "500")
    search(page, "a dog")
    assert "less than or equal to 200" in page.inner_text("#message.error")
    # A good search clears the message.
    page.fill("#k", "5")
    page.evaluate("document.querySelector('input[name=mode][value=sparse]').checked = true")
    search(page, "a dog")
    assert not page.is_visible("#message") and page.locator(".card").count() == 5


def test_a_weak_query_shows_a_notice_beside_its_results(page):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    search(page, "qwertyuiop")
    assert page.is_visible("#notice") and "no word the model knows" in page.inner_text("#notice")
    assert page.locator(".card").count() > 0  # the guesses are still shown, marked as such
    shot(page, "07b-weak-query")
    search(page, "a dog in a car")
    assert not page.is_visible("#notice")


def test_search_by_dropped_or_chosen_picture(page, image_folder, live_server):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    path = sorted(image_folder.rglob("*.jpg"))[5]
    before = searches(page)
    page.set_input_files("#file", str(path))
    wait_for_search(page, before)
    assert "the picture" in page.inner_text("#summary") and page.locator(".card").count() == 20
    shot(page, "08-picture-query")
    # Drag and drop: a DataTransfer holding the file, dropped on the page.
    before = searches(page)
    page.evaluate(
        """async (bytes) => {
            const file = new File([new Uint8Array(bytes)], "dropped.jpg", {type: "image/jpeg"});
            const dt = new DataTransfer();
            dt.items.add(file);
            window.dispatchEvent(new DragEvent("dragenter", {dataTransfer: dt, bubbles: true}));
            window.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
        }""",
        list(path.read_bytes()),
    )
    wait_for_search(page, before)
    assert "dropped.jpg" in page.inner_text("#summary") and not page.is_visible("#drop")
    # Dense mode: the picture's own stored copy comes first.
    before = searches(page)
    page.click(".modes label:has(input[value=dense])")
    wait_for_search(page, before)
    from d2s_search.images import content_id

    assert shown(page)[0][0] == content_id(path.read_bytes())
    # Something that is not a picture gets a message, not a broken grid.
    before = searches(page)
    page.set_input_files("#file", files=[{"name": "notes.png", "mimeType": "image/png", "buffer": b"not a png"}])
    wait_for_search(page, before)
    assert "cannot search by this file" in page.inner_text("#message.error")


def test_status_view(page, serve_index):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_function("document.querySelector('#footer').textContent.includes('pictures')")
    assert page.inner_text("#footer").startswith("40 pictures · tiny-blip · local")
    page.click("#status-button")
    page.wait_for_selector("#status[open]")
    rows = dict(zip(page.locator("#s-list dt").all_inner_texts(), page.locator("#s-list dd").all_inner_texts()))
    assert rows["Pictures"] == "40" and rows["Backend"] == "local" and rows["Location"] == str(serve_index)
    assert rows["Model"] == "tiny-blip" and rows["Head"].startswith("untrained") and rows["Last ingest"].endswith("Z")
    shot(page, "09-status")
