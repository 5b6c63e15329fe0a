"""The query's words on the search page can be weighed up or down and removed (and put back)
in a real browser (Chromium, headless): each edit rewrites the query text in its own syntax
(word^N, -word) and searches again, with the same results as the API for that text.

Screenshots land in test-artifacts/serve/.
"""

from __future__ import annotations

import httpx
import pytest

from tests.serve.conftest import shot as _shot

pytestmark = pytest.mark.usefixtures("live_server")

# The tiny random head weighs "herbs" and "meadow" among this query's strongest words
# (tests/serve/test_serve_api.py, test_query_terms_mark_the_typed_words).
QUERY = "herbs in a meadow"


def searches(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.searches || 0)"))


def shown(page) -> list[str]:
    return page.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.id)")


def api_ids(live_server, text: str) -> list[str]:
    reply = httpx.get(f"{live_server.url}/api/search", params={"q": text, "k": 20}, timeout=30).json()
    return [r["id"] for r in reply["results"]]


def edit(page, term: str, label: str) -> None:
    before = searches(page)
    page.click(f'#query-terms .qword[data-term="{term}"] button[aria-label^="{label}"]')
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {before}")
    page.wait_for_selector("#grid[data-state=done]")


def test_query_words_are_weighed_removed_and_put_back(page, live_server):
    page.goto(f"/?q={QUERY.replace(' ', '+')}")
    page.wait_for_selector("#grid[data-state=done]")
    plain = shown(page)
    assert page.locator('#query-terms .qword[data-term="herbs"] button').count() == 3
    assert page.locator('#query-terms .qword[data-term="##s"]').count() == 0  # word pieces are not edited

    edit(page, "herbs", "weigh herbs up")
    assert page.input_value("#q") == "herbs^2 in a meadow" and "q=herbs%5E2+in+a+meadow" in page.url
    assert shown(page) == api_ids(live_server, "herbs^2 in a meadow")
    weights = dict(page.eval_on_selector_all("#query-terms .chip", "cs => cs.map(c => [c.textContent, c.title])"))
    assert "herbs" in weights

    edit(page, "meadow", "remove meadow")
    assert page.input_value("#q") == "herbs^2 in a meadow -meadow"
    assert shown(page) == api_ids(live_server, "herbs^2 in a meadow -meadow")
    assert page.locator("#query-terms .chip.excluded").all_inner_texts() == ["meadow"]
    assert page.locator('#query-terms .chip.q:not(.excluded)', has_text="meadow").count() == 0
    _shot(page, "20-query-word-removed")

    edit(page, "meadow", "put meadow back")
    assert page.input_value("#q") == "herbs^2 in a meadow"
    edit(page, "herbs", "weigh herbs down")
    assert page.input_value("#q") == QUERY and shown(page) == plain
    edit(page, "herbs", "weigh herbs down")
    assert page.input_value("#q") == "herbs^0.5 in a meadow"

    before = searches(page)
    page.go_back()  # every edit is a step in the history
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {before}")
    assert page.input_value("#q") == QUERY and shown(page) == plain


@pytest.mark.parametrize(("text", "term", "action", "edited"), [
    ("dogs in a car", "car", "remove", "dogs in a car -car"),
    ("dog +car^2 beach", "car", "remove", "dog beach -car"),
    ("dog -car", "car", "remove", "dog -car"),
    ("dog -car", "car", "restore", "dog"),
    ("+dog beach", "dog", 2, "+dog^2 beach"),
    ("dog^3 beach", "dog", 0.5, "dog^1.5 beach"),
    ("Dog^2 beach", "dog", 0.5, "dog beach"),
    ("dog beach", "grass", 2, "dog beach grass^2"),
    ("dog^80 beach", "dog", 2, "dog^100 beach"),
])
def test_the_rewriting_rules(page, text, term, action, edited):
    page.goto("/")
    page.wait_for_selector("body[data-ready=true]")
    assert page.evaluate("([t, w, a]) => window.d2s.editedQuery(t, w, a)", [text, term, action]) == edited


def _answer_with_forms(text: str) -> dict:
    """A search answer whose query and hit hold two forms of one word (the tiny random head's
    strongest words rarely do), in the API's shape."""
    doc = "ab" * 32
    return {
        "query": {"kind": "text", "text": text}, "mode": "sparse", "k": 10, "encode_ms": 1.0, "search_ms": 1.0,
        "query_terms": [{"term": "dogs", "weight": 1.5, "own": True}, {"term": "car", "weight": 1.0, "own": False},
                        {"term": "dog", "weight": 0.5, "own": False}],
        "query_words": [{"word": "dogs", "weight": 1.5, "own": True, "terms": ["dogs", "dog"]},
                        {"word": "car", "weight": 1.0, "own": False, "terms": ["car"]}],
        "results": [{"rank": 1, "id": doc, "score": 2.25, "path": "/p/a.jpg", "name": "a.jpg", "url": None,
                     "matched": [{"term": "dogs", "contribution": 1.5}, {"term": "dog", "contribution": 0.5},
                                 {"term": "car", "contribution": 0.25}],
                     "words": [{"word": "dogs", "contribution": 2.0, "terms": ["dogs", "dog"]},
                               {"word": "car", "contribution": 0.25, "terms": ["car"]}],
                     "thumbnail": f"/api/documents/{doc}/thumbnail", "preview": f"/api/documents/{doc}/preview"}],
    }


def test_a_word_with_two_forms_is_one_chip_and_its_edits_take_both(page):
    import json
    from urllib.parse import parse_qs, urlparse

    def answer(route):
        text = parse_qs(urlparse(route.request.url).query)["q"][0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(_answer_with_forms(text)))

    page.route("**/api/search?*", answer)
    page.goto("/?q=two+dogs")
    page.wait_for_selector("#grid[data-state=done]")
    chips = page.locator("#query-terms .chip.q")
    assert chips.all_inner_texts() == ["dogs", "car"]  # dog and dogs: one chip, named by its strongest form
    assert "(dogs, dog)" in chips.first.get_attribute("title")
    card = page.locator(".card .chips .chip")
    assert card.all_inner_texts() == ["dogs", "car"]
    assert card.first.get_attribute("title") == "dogs (dogs, dog): adds 2.000"
    edit(page, "dogs", "remove dogs")
    assert page.input_value("#q") == "two dogs -dogs -dog"  # removing the word removes both forms
    page.goto("/?q=two+dogs")
    page.wait_for_selector("#grid[data-state=done]")
    edit(page, "dogs", "weigh dogs up")
    assert page.input_value("#q") == "two dogs^2 dog^2"  # each form weighed, the untyped one added
