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

import numpy as np

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


# --- typed words: tokens that are whole words ------------------------------------------
#
# A typed word split into several tokens ("giraffe" -> ``gi ##raf ##fe``) is not a word the
# model knows, and none of its fragments is a word the user typed: only tokens that are whole
# words are a query's own words (boosted, shown as typed, the two-phase first pass). The text
# graph decides it from the input ids alone (so a graph served from a cluster does too), with
# two flags per vocabulary id that these functions derive from the tokenizer.


def split_word_flags(tokenizer, size: int | None = None, only=None) -> tuple[np.ndarray, np.ndarray]:
    """Per vocabulary id: (it continues the token before it: WordPiece ``##``; it leaves its
    word open for the next token: BPE without ``</w>``). Special tokens are neither. ``only``:
    just these ids (the others read False), for a query's few tokens instead of the vocabulary."""
    size = size or tokenizer.get_vocab_size()
    prefix = getattr(tokenizer.model, "continuing_subword_prefix", None) or ""
    suffix = getattr(tokenizer.model, "end_of_word_suffix", None) or ""
    special = set(tokenizer.get_added_tokens_decoder())
    joins, opens = np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)
    pairs = (tokenizer.get_vocab().items() if only is None
             else ((tokenizer.id_to_token(int(i)), int(i)) for i in set(np.asarray(only).ravel().tolist())))
    for token, i in pairs:
        if token is None or not 0 <= i < size or i in special:
            continue
        joins[i] = bool(prefix) and token.startswith(prefix)
        opens[i] = bool(suffix) and not token.endswith(suffix)
    return joins, opens


def whole_word_positions(ids, mask, joins, opens):
    """(B, T) bools: True where a real token (``mask``) is a whole word: it neither joins the
    token before it nor is joined by the one after (:func:`split_word_flags`)."""
    real = np.asarray(mask).astype(bool)
    ids = np.asarray(ids)
    join, open_ = joins[ids] & real, opens[ids] & real
    joined_next, open_before = np.zeros_like(join), np.zeros_like(open_)
    joined_next[:, :-1] = join[:, 1:]
    open_before[:, 1:] = open_[:, :-1]
    return real & ~join & ~open_ & ~joined_next & ~open_before
