"""Inflections collapsed when words are shown: ``dog``/``dogs``, ``sit``/``sits``/``sitting``/``sat``.

The model scores every vocabulary term on its own, and a picture often carries several forms
of one word (on Flickr8k inflected forms took 15% of a picture's ten strongest words). What a
person reads gets one entry per *lemma group*; the scores never change (a match's entries add
up to the same dot product, the raw terms stay in every output beside them).

**The table** (``data/inflections.json``, package data) is made once by
``tools/make_inflection_table.py`` from lemminflect's dictionary over the whole-word tokens of
bert-base-uncased (the script says how to run it again); nothing at run time needs a
lemmatiser. A wrong merge misleads more than a missing one, so the rules are conservative:

- A word joins a group only when the dictionary gives it exactly one lemma, as a noun or a
  verb, and that lemma is itself a whole word of the vocabulary (the group's anchor). A word
  with two readings stays alone: ``saw`` (saw or see), ``leaves`` (leaf or leave),
  ``glasses`` (glasses or glass), ``left``. Adjective degrees (``older``) stay apart.
- An ``-ing`` word that is a noun of its own as well joins its verb (``sitting`` -> ``sit``)
  only when its plural is not a vocabulary word: ``buildings`` keeps ``building`` apart from
  ``build``, ``paintings`` ``painting`` from ``paint``. ``standing``, ``holding`` and
  ``reading`` join their verbs all the same (in a description of a picture they are verbs).
- A hand-checked list keeps apart what the dictionary would merge but a picture's words do
  not mean the same: ``shorts``/``short``, ``pants``, ``woods``, ``arms``, ``whites``,
  ``parked``/``park``, ``trained``/``train``, ``boxing``/``box``, ``parking``, ``fishing``...
  (the commonest words of Flickr8k captions, checked group by group).

**Shown as**: a group is named by its strongest form *here* (the largest contribution to this
match, the largest weight in this query or picture), not by its lemma: the form the model
leant on reads as the query or the picture does (``dogs`` for "dogs in a car"), and a lemma may
be a form neither holds (``sit`` for a picture with ``sitting`` and ``sits``). Ties go to the
alphabetically first form.

**Weights**: a match's entry is the *sum* of its forms' contributions (query weight x picture
weight), so the entries of a match still add up to its sparse score exactly. A vector's own
words (a query's, a picture's) take the *max* of their forms' weights: two forms are two
readings of one piece of evidence, and summing them would lift every inflected word above
words the vocabulary has in one form only; the max keeps each entry on the scale of one weight.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import NamedTuple

from .compiled import load_extension
from .errors import D2SError

TABLE = Path(__file__).resolve().parent / "data" / "inflections.json"
FORMAT = "d2s-inflections"
_WORD = re.compile(r"^[a-z]{2,}$")


_c_words = load_extension(__name__.rpartition(".")[0] + "._words", __file__)  # the collapse in C (_words.c)


class InflectionTableError(D2SError):
    """The shipped table of inflections is missing or not of its shape (a damaged install)."""


class Word(NamedTuple):
    """One entry shown: ``word`` (the group's strongest form here), ``weight`` (a match: the sum
    of its forms' contributions; a vector: the largest of its forms' weights) and ``terms`` (the
    vocabulary terms it stands for, strongest first)."""

    word: str
    weight: float
    terms: tuple[str, ...]


@dataclass(frozen=True)
class Inflections:
    """term -> lemma of every term in a group of two or more forms."""

    lemma: Mapping[str, str]

    def key(self, term: str) -> str:
        return self.lemma.get(term, term)

    def groups_several(self, terms: Iterable[str]) -> bool:
        """Whether two of ``terms`` are forms of one word (then collapsing changes something)."""
        seen: set[str] = set()
        for term in terms:
            lemma = self.lemma.get(term)
            if lemma is not None:
                if lemma in seen:
                    return True
                seen.add(lemma)
        return False

    def summed(self, pairs: Iterable[tuple[str, float]], n: int | None = None) -> list[Word]:
        """Contributions of a match, one entry per group: the sum of its forms, largest first."""
        return self._collapse(pairs, n, add=True)

    def matches(self, query: Iterable[str]) -> MatchWords:
        """What collapses the matches of one query (made once, used for every hit)."""
        return MatchWords(self, query)

    def strongest(self, pairs: Iterable[tuple[str, float]], n: int | None = None) -> list[Word]:
        """A vector's own words, one entry per group: its strongest form's weight, largest first."""
        return self._collapse(pairs, n, add=False)

    def _collapse(self, pairs: Iterable[tuple[str, float]], n: int | None, add: bool) -> list[Word]:
        groups: dict[str, list[tuple[str, float]]] = {}
        for term, weight in pairs:
            groups.setdefault(self.lemma.get(term, term), []).append((term, float(weight)))
        words = []
        for forms in groups.values():
            forms.sort(key=lambda tw: (-tw[1], tw[0]))
            total = math.fsum(w for _, w in forms) if add else forms[0][1]
            words.append(Word(forms[0][0], total, tuple(t for t, _ in forms)))
        words.sort(key=lambda w: (-w.weight, w.word))
        return words if n is None else words[:n]


# Word(...) runs a generated Python __new__; tuple.__new__ makes the same object in C (0.25
# against 0.40 us a word, five words a hit).
_word = partial(tuple.__new__, Word)


def _strongest_first(pair: tuple[str, float]) -> tuple[float, str]:
    return -pair[1], pair[0]


class MatchWords:
    """:meth:`Inflections.summed` for the matches of one query, in a few lookups a hit: a match
    holds only the query's terms, so only the query's groups of two or more forms are summed;
    every other term is its own word, taken in the match's order (largest first) until ``n``
    are found (a k=10 search with its words: 0.15 ms, against 0.37 ms with the general loop)."""

    def __init__(self, table: Inflections, query: Iterable[str]) -> None:
        groups: dict[str, list[str]] = {}
        for term in query:
            lemma = table.lemma.get(term)
            if lemma is not None:
                groups.setdefault(lemma, []).append(term)
        self.groups = [tuple(forms) for forms in groups.values() if len(forms) > 1]
        # For _words.c: each grouped term's number, group by group, and where each group's numbers end.
        self._form_number = {t: i for i, t in enumerate(t for forms in self.groups for t in forms)}
        self.grouped = frozenset(self._form_number)
        self._group_ends = tuple(itertools.accumulate(len(forms) for forms in self.groups))

    def compiled(self, n: int) -> tuple:
        """What a compiled search takes to collapse its hits' words as ``self(matched, n)`` does
        (``_query.c``'s ``collapse``): n, each grouped term's form number, the groups' ends, Word
        and math.fsum."""
        return n, self._form_number, self._group_ends, Word, math.fsum

    def many(self, raws: list[list[tuple[str, float]]], n: int) -> list[list[Word]]:
        """``self(raw, n)`` for each of ``raws`` (one per hit), in one call to ``_words.c`` when it
        was built (a hit's pairs of another shape are left to the Python path)."""
        if _c_words is None or n < 1 or type(raws) is not list:
            return [self(raw, n) for raw in raws]
        return _c_words.collapse(raws, n, self._form_number, self._group_ends, Word, math.fsum, self)

    def __call__(self, matched: list[tuple[str, float]], n: int) -> list[Word]:
        """``matched``: (term, contribution) pairs, largest first."""
        # Plain (-weight, word, terms) tuples compare in C; only the n kept become Words.
        entries = []
        if self.groups:
            get = dict(matched).get
            for forms in self.groups:
                present = [(t, c) for t in forms if (c := get(t)) is not None]
                if len(present) == 1:
                    term, contribution = present[0]
                    entries.append((-contribution, term, (term,)))
                elif present:
                    present.sort(key=_strongest_first)
                    entries.append((-math.fsum(c for _, c in present), present[0][0], tuple(t for t, _ in present)))
        taken, last = 0, math.inf
        grouped = self.grouped
        for term, contribution in matched:
            if term in grouped:
                continue
            if taken >= n and contribution < last:
                break  # ties with the n-th are kept: the sort below breaks them by word
            entries.append((-contribution, term, (term,)))
            taken, last = taken + 1, contribution
        entries.sort()
        return [_word((word, -float(weight), terms)) for weight, word, terms in entries[:n]]


def parse(raw: bytes, where: str = "the table") -> Inflections:
    """The table from its file's bytes; InflectionTableError (one line) when they are not of its
    shape: JSON object, ``format``, ``version`` 1, ``groups`` lemma -> two or more distinct
    lower-case words that include the lemma, no word in two groups."""
    def bad(why: str) -> InflectionTableError:
        return InflectionTableError(f"{where} is damaged ({why}): reinstall d2s-search")

    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"not JSON: {str(exc).splitlines()[0][:80]}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("version") != 1:
        raise bad(f"not a {FORMAT} file of version 1")
    groups = body.get("groups")
    if not isinstance(groups, dict):
        raise bad("no groups")
    lemma_of: dict[str, str] = {}
    for lemma, forms in groups.items():
        if not isinstance(forms, list) or len(forms) < 2 or len(set(forms)) != len(forms) \
                or not all(isinstance(f, str) and _WORD.match(f) for f in forms) or lemma not in forms:
            raise bad(f"group {str(lemma)[:40]!r} is not two or more distinct words with its lemma")
        for form in forms:
            if form in lemma_of:
                raise bad(f"{form!r} is in the groups of {lemma_of[form]!r} and {lemma!r}")
            lemma_of[form] = lemma
    return Inflections(lemma_of)


def load(path: Path = TABLE) -> Inflections:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InflectionTableError(f"the table of inflections {path} cannot be read ({exc.strerror}): "
                                   "reinstall d2s-search") from None
    return parse(raw, f"the table of inflections {path}")


@lru_cache(maxsize=1)
def inflections() -> Inflections:
    """The shipped table, read once per process."""
    return load(TABLE)


def idf(n_docs: int, df: int) -> float:
    """log(N / df) of a term the index's documents carry (df at least 1: the picture shown)."""
    return math.log(max(n_docs, 1) / max(df, 1))


class PictureWord(NamedTuple):
    """A picture's own word: ``weight`` (its strongest form's), ``idf`` of that form (None when
    the index gives no document frequencies) and ``terms``, strongest first."""

    word: str
    weight: float
    idf: float | None
    terms: tuple[str, ...]

    @property
    def specificity(self) -> float:
        """Weight x IDF (the weight alone without IDF): how much the word sets this picture apart."""
        return self.weight * self.idf if self.idf is not None else self.weight


def picture_words(sparse: Mapping[str, float], frequencies: tuple[int, Mapping[str, int]] | None = None,
                  table: Inflections | None = None) -> list[PictureWord]:
    """A picture's words, one entry per group, strongest first (then by word), each with its IDF
    log(N / df) when ``frequencies`` = (N, term -> df) are given. A group's IDF is its strongest
    form's. Weight, not weight x IDF, orders them: of a picture's first ten words, 0.36 are words
    of its captions by weight and 0.18 by weight x IDF on the caption benchmark (0.26 and 0.09
    on the offline model's photos), docs/design-decisions.md "Words shown"."""
    table = table or inflections()
    words = []
    for word in table.strongest(sparse.items()):
        value = None
        if frequencies is not None:
            n_docs, df = frequencies
            value = idf(n_docs, int(df.get(word.word, 1)))
        words.append(PictureWord(word.word, word.weight, value, word.terms))
    words.sort(key=lambda w: (-w.weight, w.word))
    return words
