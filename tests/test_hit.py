"""The search result record: compared by value, its containers made on first use and never
shared between hits, and its JSON form."""

from __future__ import annotations

import pytest

from d2s_search.backends.base import Hit
from d2s_search.inflections import Word


def test_hits_compare_by_value_and_an_empty_container_equals_none_given():
    assert Hit("a", 1.5, "/p/a.jpg") == Hit("a", 1.5, "/p/a.jpg", None, [], {})
    assert Hit("a", 1.5, "/p/a.jpg") != Hit("a", 1.5, "/p/a.jpg", matched=[("dog", 0.5)])
    assert Hit("a", 1.5, "/p/a.jpg") != Hit("a", 1.5, "/p/b.jpg")
    assert Hit("a", 1.5, "/p/a.jpg") != ("a", 1.5, "/p/a.jpg")
    with pytest.raises(TypeError):  # mutable: not hashable, as a dataclass with eq
        hash(Hit("a", 1.5, "/p/a.jpg"))


def test_containers_are_made_on_first_use_and_belong_to_one_hit():
    first, second = Hit("a", 1.0, "a"), Hit("b", 2.0, "b")
    first.parts["sparse"] = 3.0
    first.matched.append(("dog", 1.25))
    assert first.parts == {"sparse": 3.0} and first.matched == [("dog", 1.25)]
    assert second.parts == {} and second.matched == []
    second.matched = [("car", 2.0)]
    assert second.matched == [("car", 2.0)] and first.matched == [("dog", 1.25)]
    with pytest.raises(AttributeError):  # slotted: a misspelt field is an error, not a new attribute
        first.scroe = 1.0


def test_json_form():
    hit = Hit("a", 1.5, "/p/a.jpg", "https://example.org/a.jpg", [("dog", 1.0), ("car", 0.5)])
    assert hit.to_json() == {
        "id": "a", "score": 1.5, "path": "/p/a.jpg", "url": "https://example.org/a.jpg",
        "matched": [{"term": "dog", "contribution": 1.0}, {"term": "car", "contribution": 0.5}],
        "words": [],
    }
    hit.words = [Word("dogs", 1.5, ("dogs", "dog"))]
    assert hit.to_json()["words"] == [{"word": "dogs", "contribution": 1.5, "terms": ["dogs", "dog"]}]
    hit.parts = {"sparse": 1.0, "dense": 0.25}
    assert hit.to_json()["parts"] == {"sparse": 1.0, "dense": 0.25}
    assert "parts" not in Hit("b", 0.0, "b").to_json()
    assert repr(Hit("b", 0.0, "b")) == "Hit(id='b', score=0.0, path='b', url=None, matched=[], parts={})"
