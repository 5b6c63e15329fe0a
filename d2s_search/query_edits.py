"""Edits typed into a query: ``-word`` removes a word, ``+word`` requires it, ``word^2`` weighs it.

``dogs in a car -car`` searches "dogs in a car" without the word ``car`` and leaves out the
pictures that carry it; ``dog +beach`` returns only pictures that carry ``beach``; ``dog^2
beach`` doubles ``dog``'s weight. A picture *carries* a word when its stored weight for it is
at least :data:`~d2s_search.backends.base.CARRIES_WORD_FROM` (docs/design-decisions.md,
"Editing a query"). An operator counts only at the start of a word (``t-shirt`` and
``black-and-white`` are words), and an edited word must be one whole vocabulary word: one the
vocabulary splits (``giraffe`` -> ``gi ##raf ##fe``) is named as unknown, as in a plain query.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .backends.base import SparseVector, WordFilter
from .errors import QueryError

# +word, -word, word^2, +word^0.5: the operator, the word, the weight
_EDIT = re.compile(r"^(?P<op>[+-]?)(?P<word>[^\W_][^\s^]*?)(?:\^(?P<weight>\S*))?$")
MAX_WEIGHT = 100.0


@dataclass
class QueryEdits:
    """What a typed query asks besides its words, before the vocabulary is consulted."""

    text: str  # what the text encoder reads: the query without its ``-word``s and operators
    required: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)  # word -> factor

    def __bool__(self) -> bool:
        return bool(self.required or self.excluded or self.weights)


def parse_query(text: str) -> QueryEdits:
    """Split a typed query into the text to encode and its edits (one-line QueryError for a
    bad weight)."""
    kept: list[str] = []
    edits = QueryEdits(text="")
    for token in text.split():
        match = _EDIT.match(token)
        if match is None or not (match["op"] or match["weight"] is not None):
            kept.append(token)
            continue
        word, op = match["word"], match["op"]
        if op == "-":
            edits.excluded.append(word)
            continue
        if op == "+":
            edits.required.append(word)
        if match["weight"] is not None:
            edits.weights[word] = _weight(token, match["weight"])
        kept.append(word)
    edits.text = " ".join(kept)
    if not edits.text and edits.excluded:
        raise QueryError("the query only removes words: add a word to search for")
    return edits


def _weight(token: str, value: str) -> float:
    try:
        weight = float(value)
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise QueryError(f"bad weight in {token!r}: use word^N with N above 0 and up to {MAX_WEIGHT:g} "
                         "(-word removes a word)")
    return weight


@dataclass
class AppliedEdits:
    """The edits in vocabulary terms, as every output shows them."""

    required: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # edited words the vocabulary does not hold whole

    @property
    def words(self) -> WordFilter:
        return WordFilter(required=tuple(self.required), excluded=tuple(self.excluded))

    def __bool__(self) -> bool:
        return bool(self.required or self.excluded or self.weights)

    def to_json(self) -> dict:
        return {"required": self.required, "excluded": self.excluded,
                "weighted": [{"term": t, "factor": w} for t, w in self.weights.items()]}

    def describe(self) -> str:
        """One line: ``-car +beach dog^2``."""
        return " ".join([*(f"-{t}" for t in self.excluded), *(f"+{t}" for t in self.required),
                         *(f"{t}^{w:g}" for t, w in self.weights.items())])


def vocabulary_term(encoder, word: str) -> str | None:
    """The vocabulary term a typed word is, when the tokenizer keeps it whole; else None."""
    enc = encoder.tokenizer.encode(word, add_special_tokens=False)
    if len(enc.ids) != 1:
        return None
    (term,) = encoder.own_terms(enc.ids)
    return term


def apply_edits(encoder, edits: QueryEdits, full: SparseVector, own: SparseVector) -> AppliedEdits:
    """Remove the excluded terms from ``full`` and ``own`` and weigh the weighted ones, in
    place; the terms to require or exclude, and the edited words the vocabulary lacks."""
    applied = AppliedEdits()

    def term_of(word: str) -> str | None:
        term = vocabulary_term(encoder, word)
        if term is None and word not in applied.unknown:
            applied.unknown.append(word)
        return term

    for word in edits.excluded:
        term = term_of(word)
        if term is not None and term not in applied.excluded:
            applied.excluded.append(term)
            full.pop(term, None)
            own.pop(term, None)
    for word in edits.required:
        term = term_of(word)
        if term is not None and term not in applied.required:
            applied.required.append(term)
    for word, factor in edits.weights.items():
        term = term_of(word)
        if term is None or term in applied.excluded:
            continue
        applied.weights[term] = factor
        for vector in (full, own):
            if term in vector:
                vector[term] *= factor
    clash = set(applied.required) & set(applied.excluded)
    if clash:
        raise QueryError(f"the query both requires and removes {', '.join(sorted(clash))}: keep one")
    return applied
