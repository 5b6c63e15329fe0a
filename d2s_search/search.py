"""Query plans: sparse, two-phase, dense and hybrid (fusion of sparse and dense runs).

A query (text or image) is first encoded into :class:`QueryVectors`; a plan then asks the
backend for one or two runs and, for hybrid, fuses them here (weighted min-max or RRF), so
every backend gets fusion for free.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from .backends.base import Backend, Hit, Narrowing, SparseVector, WordFilter
from .errors import QueryError
from .filters import SearchFilter
from .inflections import Word, inflections
from .query_edits import AppliedEdits, apply_edits, parse_query
from .terms import recognised_words

MODES = ("sparse", "two-phase", "dense", "hybrid")
FUSIONS = ("minmax", "rrf")


@dataclass
class QueryVectors:
    full: SparseVector  # every term the head gave the query
    own: SparseVector  # the subset that are the query's own words (two-phase first pass)
    dense: np.ndarray
    # Text queries: typed words the vocabulary knows / does not know (d2s_search.terms).
    recognised: list[str] | None = None
    unrecognised: list[str] = field(default_factory=list)
    typed: set[str] = field(default_factory=set)  # the query's terms that are words it typed whole
    edits: AppliedEdits | None = None  # -word, +word, word^2 (d2s_search.query_edits)

    @property
    def words(self) -> WordFilter:
        return self.edits.words if self.edits else WordFilter()

    @property
    def weak(self) -> bool:
        """A text query none of whose words the model recognises: its results are guesses."""
        return self.recognised is not None and not self.recognised


@dataclass
class SearchOptions:
    mode: str = "sparse"
    k: int = 10
    window: int | None = None  # candidates rescored (two-phase) or fused per side (hybrid): see candidates
    fusion: str = "minmax"
    alpha: float = 0.5  # weight of the dense run in min-max fusion
    rrf_k: int = 60
    explain: int = 5  # matched terms shown per hit
    filters: SearchFilter | None = None  # date, folder, fields, place (d2s_search.filters)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise QueryError(f"unknown mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.fusion not in FUSIONS:
            raise QueryError(f"unknown fusion {self.fusion!r}: use one of {', '.join(FUSIONS)}")
        if self.k < 1:
            raise QueryError("k must be at least 1")
        if not 0.0 <= self.alpha <= 1.0:
            raise QueryError("alpha must be between 0 and 1")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, (int, np.integer))
                                        or self.window < 1):
            raise QueryError(f"window (candidates) must be a whole number at least 1, not {self.window!r}")

    @property
    def candidates(self) -> int:
        """Rescored (two-phase) or fused per side (hybrid): ``window``, else max(100, 10k); a
        hybrid's max(100, min(10k, k + max(k, 1000))). For RRF that is the smallest pool whose
        fused top-k kept recall >= 0.99 against RRF over every document at k=10, 50, 500 and
        1000 (c·k with c = 10, 10, 3, 2; at k=500 2k kept 0.96). Min-max
        normalises by its pool, so no pool short of every document reproduces that one, and the
        size did not move relevance: on held-out captions of real photos every pool from k to
        10k found the caption's photo as well as fusion over every document did
        (docs/benchmarks.md, "Hybrid candidates")."""
        if self.window:
            return max(self.window, self.k)
        if self.mode == "hybrid":
            return max(100, min(10 * self.k, self.k + max(self.k, 1000)))
        return max(100, 10 * self.k)


@dataclass
class SearchResult:
    mode: str
    hits: list[Hit]
    took_ms: float
    query_terms: Sequence[tuple[str, float]] = field(default_factory=list)  # run_query: StrongestTerms
    # Hybrid only: who fused the runs, e.g. "elasticsearch-rrf-retriever" or "client-minmax".
    fusion: str | None = None
    weak_query: bool = False
    unrecognised_words: list[str] = field(default_factory=list)
    edits: AppliedEdits | None = None
    filters: SearchFilter | None = None

    @property
    def query_words(self) -> list[Word]:
        """``query_terms`` with inflections collapsed: one entry per lemma group, its strongest
        form's weight (d2s_search.inflections)."""
        return inflections().strongest(self.query_terms)

    @property
    def notice(self) -> str | None:
        if self.weak_query:
            return weak_query_notice(self.unrecognised_words)
        return unknown_words_notice(self.unrecognised_words) if self.unrecognised_words else None

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            **({"fusion": self.fusion} if self.fusion else {}),
            "took_ms": round(self.took_ms, 3),
            "weak_query": self.weak_query,
            "unrecognised_words": self.unrecognised_words,
            "notice": self.notice,
            "query_terms": [{"term": t, "weight": w} for t, w in self.query_terms],
            "query_words": [{"word": w, "weight": v, "terms": list(terms)} for w, v, terms in self.query_words],
            **({"query_edits": self.edits.to_json()} if self.edits else {}),
            **({"filters": self.filters.to_json()} if self.filters else {}),
            "results": [dict(rank=i + 1, **h.to_json()) for i, h in enumerate(self.hits)],
        }


def weak_query_notice(unrecognised: list[str]) -> str:
    words = f" ({', '.join(repr(w) for w in unrecognised[:5])})" if unrecognised else ""
    return (f"The query has no word the model knows as content{words}; these results are guesses, "
            "not matches. Try other (English) words, or search by a picture.")


def unknown_words_notice(unrecognised: list[str]) -> str:
    words = ", ".join(repr(w) for w in unrecognised[:5])
    one = len(unrecognised) == 1
    return (f"The model does not know the word{'' if one else 's'} {words}: the results match the query's other "
            f"words, not {'it' if one else 'them'}. Try another word for {'it' if one else 'them'}.")


# --- encoding queries ------------------------------------------------------------------


def encode_text_query(encoder, text: str, top_k: int | None = None, edits: bool = True) -> QueryVectors:
    """A typed query's vectors; with ``edits``, ``-word``, ``+word`` and ``word^2`` are
    applied (d2s_search.query_edits), without them the text is encoded as it is (captions)."""
    if not text or not text.strip():
        raise QueryError("the query is empty: type some words")
    typed_edits = parse_query(text) if edits else None
    if typed_edits:
        text = typed_edits.text
    enc = encoder.encode_texts([text])
    full = text_terms(encoder, enc, 0, top_k)
    if not full:
        raise QueryError(f"the model gives no terms for {text!r}; try other words or --mode dense")
    # Typed words are whole-word tokens: "giraffe" split into gi ##raf ##fe types none of them.
    typed = encoder.own_terms(enc.typed_ids[0] if enc.typed_ids is not None else enc.token_ids[0])
    own = {t: w for t, w in full.items() if t in typed} or _top(full, 8)
    known, unknown = recognised_words(encoder.tokenizer, text)
    applied = None
    if typed_edits:
        applied = apply_edits(encoder, typed_edits, full, own)
        unknown += [w for w in applied.unknown if w not in unknown]
        if not full:
            raise QueryError("no word of the query is left to search with: remove fewer words")
    return QueryVectors(full=full, own=own or _top(full, 8), dense=enc.dense[0], recognised=known,
                        unrecognised=unknown, typed=typed, edits=applied)


def text_terms(encoder, enc, row: int, top_k: int | None = None) -> SparseVector:
    """``{term: weight}`` a text searches with: the row's positive allowed weights, kept to the
    text's own tokens when the head was trained so (exp=0)."""
    terms = encoder.to_terms(enc.sparse[row], top_k=top_k)
    if getattr(encoder, "queries_use_own_tokens_only", False):  # as such a head was trained: every input token
        input_words = encoder.own_terms(enc.token_ids[row])
        terms = {t: w for t, w in terms.items() if t in input_words}
    return terms


def encode_image_query(encoder, image, top_k: int | None = None) -> QueryVectors:
    dense, sparse = encoder.encode_images([image])
    full = encoder.to_terms(sparse[0], top_k=top_k)
    # An image has no "own words": its strongest terms play that part for two-phase.
    return QueryVectors(full=full, own=_top(full, 8), dense=dense[0])


def combine_queries(text: QueryVectors, image: QueryVectors) -> QueryVectors:
    """Words and a picture searched together: the sum of the two sparse vectors (the text's
    edits applied to the picture's part as well: -word gone, word^N weighed, so the sum is
    that of the edited vectors), and the mean direction of the two dense vectors (each
    L2-normalised, summed, normalised again: neither side outweighs the other by its length).
    The own words (two-phase's first pass) are the text's and the picture's, weighed as in the sum."""
    picture = dict(image.full)
    if text.edits:
        for term in text.edits.excluded:
            picture.pop(term, None)
        for term, factor in text.edits.weights.items():
            if term in picture:
                picture[term] *= factor
    full = dict(text.full)
    for term, weight in picture.items():
        full[term] = full.get(term, 0.0) + weight
    own = {t: full[t] for t in (*text.own, *image.own) if t in full}
    dense = (_unit(np.asarray(text.dense, dtype=np.float64)) + _unit(np.asarray(image.dense, dtype=np.float64)))
    return QueryVectors(full=full, own=own or _top(full, 8), dense=_unit(dense).astype(np.float32),
                        recognised=text.recognised, unrecognised=list(text.unrecognised), typed=set(text.typed),
                        edits=text.edits)


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def _top(vector: SparseVector, n: int) -> SparseVector:
    """The n strongest terms, by weight then term: sorted by term, then stably by weight
    (two sorts in C, no Python key per term)."""
    items = sorted(vector.items())
    items.sort(key=itemgetter(1), reverse=True)  # stable: equal weights stay in term order
    return dict(items[:n])


class StrongestTerms(Sequence):
    """A query's n strongest (term, weight) pairs (:func:`_top`), sorted when first read: a
    search that shows no query terms does not sort them (0.05 ms of a 0.6 ms cold search at
    123k documents). The query's vector is read then, not
    copied now: searches never change it. Compares equal to the list it stands for."""

    __slots__ = ("_vector", "_n", "_items")

    def __init__(self, vector: SparseVector, n: int) -> None:
        self._vector, self._n, self._items = vector, n, None

    def _list(self) -> list[tuple[str, float]]:
        if self._items is None:
            self._items, self._vector = list(_top(self._vector, self._n).items()), None
        return self._items

    def __len__(self) -> int:
        return len(self._list())

    def __getitem__(self, index):
        return self._list()[index]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other) -> bool:
        return self._list() == (list(other) if isinstance(other, Sequence) else other)

    def __repr__(self) -> str:
        return repr(self._list())


# --- plans -----------------------------------------------------------------------------


def restrictions(backend: Backend, query: QueryVectors | None, options: SearchOptions) -> dict:
    """The keywords that narrow a search: ``words`` (+word / -word) and ``filters``, each passed
    only when set, so a backend without the keyword still runs the rest."""
    restrict: dict = {"words": query.words} if query is not None and query.words else {}
    if options.filters:
        if not isinstance(backend, Narrowing):
            raise QueryError(f"the {getattr(backend, 'name', 'chosen')} index cannot be filtered by date, folder, "
                             "field or place")
        restrict["filters"] = options.filters
    return restrict


def browse_library(backend: Backend, options: SearchOptions, offset: int = 0) -> SearchResult:
    """The library without a query: newest pictures first (by date taken), narrowed by the
    options' filters."""
    if not isinstance(backend, Narrowing):
        raise QueryError(f"the {getattr(backend, 'name', 'chosen')} index cannot list pictures without a query")
    start = time.perf_counter()
    hits = backend.browse(options.k, options.filters or None, offset)
    return SearchResult(mode="library", hits=hits, took_ms=(time.perf_counter() - start) * 1000,
                        filters=options.filters or None)


def explain_depth(query: SparseVector, explain: int) -> int:
    """How many matched terms to ask a backend for, so that the shown words are exact: every
    term of the query when two of them are forms of one word (a group's contribution is the sum
    of all its forms'), else just the ``explain`` shown."""
    if explain <= 0:
        return 0
    return max(explain, len(query)) if inflections().groups_several(query) else explain


def collapse_matches(hits: Sequence[Hit], explain: int, query: SparseVector) -> None:
    """Fill each hit's ``words`` (inflections collapsed, contributions summed) from its matched
    terms, and keep ``explain`` of each, in place; a hit whose backend filled its words is left."""
    if explain <= 0:
        return
    # Hit's slots, not its properties (which make empty containers on first use): at k=1000 the
    # properties' calls cost as much as collapsing the words in C.
    hits = [hit for hit in hits if getattr(hit, "_words", None) is None]
    raws = [hit._matched or [] for hit in hits]
    for hit, raw, words in zip(hits, raws, inflections().matches(query).many(raws, explain)):
        if raw:
            hit._words = words
            if len(raw) > explain:
                hit._matched = raw[:explain]


def run_query(backend: Backend, query: QueryVectors, options: SearchOptions) -> SearchResult:
    options.validate()
    restrict = restrictions(backend, query, options)
    depth = explain_depth(query.full, options.explain)
    # a backend that collapses words as it reads them is told how many are shown
    shown = {"shown": options.explain} if options.explain > 0 and getattr(backend, "collapses_words", False) else {}
    start = time.perf_counter()
    if options.mode == "sparse":
        hits = backend.sparse_search(query.full, options.k, explain=depth, **restrict, **shown)
    elif options.mode == "two-phase":
        hits = backend.two_phase_search(query.own, query.full, options.k, options.candidates, explain=depth,
                                        **restrict)
    elif options.mode == "dense":
        hits = backend.dense_search(query.dense, options.k, explain_with=query.full, explain=depth,
                                    **restrict)
    else:
        hits = hybrid(backend, query, dataclasses.replace(options, explain=depth), **shown)
    collapse_matches(hits, options.explain, query.full)
    took = (time.perf_counter() - start) * 1000
    fusion = None
    if options.mode == "hybrid":
        native = getattr(backend, "hybrid_search", None) is not None
        fusion = getattr(backend, "last_fusion", None) if native else f"client-{options.fusion}"
    return SearchResult(mode=options.mode, hits=hits, took_ms=took, query_terms=StrongestTerms(query.full, 50),
                        fusion=fusion, weak_query=query.weak, unrecognised_words=list(query.unrecognised),
                        edits=query.edits, filters=options.filters or None)


def hybrid(backend: Backend, query: QueryVectors, options: SearchOptions, shown: int = 0) -> list[Hit]:
    restrict = restrictions(backend, query, options)
    native = getattr(backend, "hybrid_search", None)
    if native is not None:
        return native(query.full, query.dense, options, **restrict, **({"shown": shown} if shown else {}))
    n = options.candidates
    # A backend that can explain given hits does it after fusion, for the k hits returned only.
    explain_hits = getattr(backend, "explain_hits", None)
    per_run = 0 if explain_hits is not None else options.explain
    sparse_hits = backend.sparse_search(query.full, n, explain=per_run, **restrict)
    dense_hits = backend.dense_search(query.dense, n, explain_with=query.full, explain=per_run, **restrict)
    if options.fusion == "rrf":
        fused = fuse_rrf({"sparse": sparse_hits, "dense": dense_hits}, options.k, options.rrf_k)
    else:
        fused = fuse_minmax({"sparse": sparse_hits, "dense": dense_hits}, {"sparse": 1 - options.alpha, "dense": options.alpha}, options.k)
    if explain_hits is not None and options.explain:
        explain_hits(fused, query.full, options.explain)
    return fused


def fuse_minmax(runs: dict[str, list[Hit]], weights: dict[str, float], k: int) -> list[Hit]:
    """Weighted sum of min-max normalised scores; a document missing from a run gets 0 there
    (what OpenSearch's normalization-processor does)."""
    fused: dict[str, Hit] = {}
    totals: dict[str, float] = {}
    for name, hits in runs.items():
        if not hits:
            continue
        for hit, norm in zip(hits, minmax_normalised([h.score for h in hits])):
            _merge(fused, hit, name)
            totals[hit.id] = totals.get(hit.id, 0.0) + weights.get(name, 0.0) * norm
    return _ranked(fused, totals, k)


def minmax_normalised(scores) -> np.ndarray:
    """Scores mapped onto [0, 1] by their min and max (all 1 when they are equal), in float64:
    the normalisation of :func:`fuse_minmax`, also used by the local index's array fusion."""
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        return values
    low, span = values.min(), values.max() - values.min()
    return (values - low) / span if span > 0 else np.ones_like(values)


def fuse_rrf(runs: dict[str, list[Hit]], k: int, rank_constant: int = 60) -> list[Hit]:
    """Reciprocal rank fusion: sum over runs of 1 / (rank_constant + rank)."""
    fused: dict[str, Hit] = {}
    totals: dict[str, float] = {}
    for name, hits in runs.items():
        for rank, hit in enumerate(hits, start=1):
            _merge(fused, hit, name)
            totals[hit.id] = totals.get(hit.id, 0.0) + 1.0 / (rank_constant + rank)
    return _ranked(fused, totals, k)


def _merge(fused: dict[str, Hit], hit: Hit, run: str) -> None:
    entry = fused.get(hit.id)
    if entry is None:
        entry = fused[hit.id] = Hit(id=hit.id, score=0.0, path=hit.path, url=hit.url, matched=list(hit.matched))
    elif not entry.matched:
        entry.matched = list(hit.matched)
    entry.parts[run] = hit.score


def _ranked(fused: dict[str, Hit], totals: dict[str, float], k: int) -> list[Hit]:
    order = sorted(totals, key=lambda doc_id: (-totals[doc_id], doc_id))[:k]
    hits = []
    for doc_id in order:
        hit = fused[doc_id]
        hit.score = totals[doc_id]
        hits.append(hit)
    return hits
