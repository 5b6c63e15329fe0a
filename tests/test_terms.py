"""Recognised words of a query (d2s_search.terms) with the real bert-base-uncased tokenizer."""

from __future__ import annotations

import pytest

from d2s_search.terms import STOPWORDS, is_content_word, recognised_words
from d2s_search.train.vocab import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.mark.parametrize(
    ("text", "known", "unknown"),
    [
        ("dogs in a car", ["dogs", "car"], []),
        ("a man riding a horse!", ["man", "riding", "horse"], []),
        ("qwertyuiop", [], ["qwertyuiop"]),  # q ##wer ##ty ##ui ##op: fragments only
        ("zxcvbn asdfgh", [], ["zxcvbn", "asdfgh"]),
        ("собака в машине", [], ["собака", "в", "машине"]),  # a script the vocabulary lacks
        ("skateboarding dog", ["skateboarding", "dog"], []),  # skate ##boarding: a word stem
        ("of the", [], []),  # stop words only: no content, but nothing unknown either
        ("Dogs 42 ...", ["Dogs"], []),  # as typed; digits and punctuation are neither
    ],
)
def test_recognised_words(tok, text, known, unknown):
    assert recognised_words(tok, text) == (known, unknown)


def test_content_words():
    assert is_content_word("dog") and not is_content_word("the") and not is_content_word("##s")
    assert not is_content_word(".") and not is_content_word("x") and "with" in STOPWORDS
