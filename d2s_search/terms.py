"""Which typed words a model's vocabulary recognises as words (torch-free).

A query like ``qwertyuiop`` or one in a script the vocabulary lacks still gets a sparse
vector (the head always answers something), but none of its words is known to the model, so
the results are guesses. :func:`recognised_words` tells the two apart from the tokenizer
alone: a typed word is *recognised* when the vocabulary holds it as one whole token, or when
its first piece is itself a whole word of four or more letters ("skateboarding" ->
``skate ##boarding``); a word split into short fragments (``q ##wer ##ty ##ui ##op``), an
unknown token or non-Latin characters are not. Stop words are neither: they carry no content.
Works with WordPiece (``##`` continuations) and CLIP's BPE (``</w>`` word ends).
"""

from __future__ import annotations

import re

# Function words carry no meaning for search (also the stop words of `output_terms: words`).
_STOPWORDS_TEXT = """
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
WORD = re.compile(r"^[a-z]{2,}$")
MIN_FIRST_PIECE = 4


def _piece(token: str) -> str:
    return token.removesuffix("</w>").removeprefix("##").lstrip("Ġ▁")


def is_content_word(token: str) -> bool:
    """A whole lower-case word of two or more ASCII letters that is not a stop word."""
    return bool(WORD.match(token)) and token not in STOPWORDS


def recognised_words(tokenizer, text: str) -> tuple[list[str], list[str]]:
    """(recognised content words, unrecognised words) of ``text``, in typed order.

    ``tokenizer`` is a ``tokenizers.Tokenizer``; stop words and bare punctuation or digits
    are in neither list.
    """
    enc = tokenizer.encode(text)
    groups: dict[int, list[int]] = {}
    for pos, word_id in enumerate(enc.word_ids):
        if word_id is not None:
            groups.setdefault(word_id, []).append(pos)
    known, unknown = [], []
    for positions in groups.values():
        start, end = enc.offsets[positions[0]][0], enc.offsets[positions[-1]][1]
        typed = text[start:end]
        pieces = [_piece(enc.tokens[p]) for p in positions]
        lower = typed.lower()
        if lower in STOPWORDS or not any(ch.isalpha() for ch in typed):
            continue
        whole = len(pieces) == 1 and is_content_word(pieces[0])
        stem = len(pieces) > 1 and is_content_word(pieces[0]) and len(pieces[0]) >= MIN_FIRST_PIECE
        (known if whole or stem else unknown).append(typed)
    return known, unknown
