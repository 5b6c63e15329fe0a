"""The one protocol every index backend speaks, and the records that cross it.

A backend stores :class:`Document` records keyed by content hash and answers sparse
(dot product over ``{term: weight}``), two-phase and dense (inner product) searches.
Fusion of sparse and dense runs lives in :mod:`d2s_search.search`, so a backend only needs
to support it natively if it can do better (OpenSearch's hybrid query).

One path is one document: the same bytes at several paths are one document that carries
every path (the shown one first, then its copies); a path holds the content of exactly one
document, so storing a document at a path takes that path from whatever document held it
before (a file overwritten in place), and a document left without a path is removed.
:func:`relinked` is that rule, shared by every backend.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..metadata import NO_METADATA, Metadata

SparseVector = dict[str, float]

# A picture carries a word when its stored weight for it is at least this: what `+word` keeps
# and `-word` leaves out (docs/design-decisions.md, "Editing a query": measured on Flickr8k,
# 0.95 of the pictures captioned with a word carry it this strongly, 0.08-0.17 of the others).
CARRIES_WORD_FROM = 1.0


@dataclass(frozen=True)
class WordFilter:
    """Words a hit must carry (``required``) or must not (``excluded``), as vocabulary terms;
    every backend applies it before the top k are taken, so k hits come back when k exist."""

    required: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    threshold: float = CARRIES_WORD_FROM

    def __bool__(self) -> bool:
        return bool(self.required or self.excluded)

    def allows(self, sparse: SparseVector) -> bool:
        """Whether a document with these (stored) weights passes."""
        return (all(sparse.get(t, 0.0) >= self.threshold for t in self.required)
                and not any(sparse.get(t, 0.0) >= self.threshold for t in self.excluded))


@dataclass
class IndexIdentity:
    """What an index must agree with: the bundle that fills it.

    ``bundle_path`` is where that bundle was (absolute); an index records it so commands run
    without ``--bundle`` use the bundle that filled it, not just the one exported last.
    It is a hint, not part of the identity: only the fingerprint decides a match.
    """

    fingerprint: str
    dense_dim: int
    model: str = ""
    bundle_path: str = ""


@dataclass
class Document:
    id: str  # SHA-256 of the image file bytes
    path: str  # where it is shown from
    size_bytes: int
    width: int
    height: int
    sparse: SparseVector  # positive weights only
    dense: np.ndarray  # float32, shape (dense_dim,)
    url: str | None = None
    ingested_at: float = 0.0
    copies: tuple[str, ...] = ()  # the other paths that hold the same bytes
    metadata: Metadata = NO_METADATA  # date taken, camera, place, the user's fields

    @property
    def paths(self) -> list[str]:
        return [self.path, *self.copies]

    def top_terms(self, n: int = 20) -> list[str]:
        return [t for t, _ in sorted(self.sparse.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


class Hit:
    """One search result.

    ``matched``: (term, query_weight * doc_weight), largest first: why this image matched.
    ``words``: the same with inflections collapsed (:mod:`d2s_search.inflections`): one
    ``Word(word, contribution, terms)`` per lemma group, largest first, filled by the query
    plans, or by a backend told ``shown`` (see :class:`Backend`; otherwise its own searches
    leave it empty); not compared by ``==`` (it follows from the match).
    ``parts``: per-run scores of fused results, e.g. {"sparse": 3.1, "dense": 0.42}.

    Slotted, and the two containers are made on first use: a k=1000 search builds 1,000 hits,
    most never explained or fused (0.6x the time of a slotted dataclass with two default
    factories, and one object per hit for the garbage collector instead of three).
    """

    # _words is left unset by the compiled hit builder (it writes the other slots): read with a default.
    __slots__ = ("id", "score", "path", "url", "_matched", "_parts", "_words")

    def __init__(self, id: str, score: float, path: str, url: str | None = None,
                 matched: list[tuple[str, float]] | None = None, parts: dict[str, float] | None = None,
                 words: list | None = None) -> None:
        self.id = id
        self.score = score
        self.path = path
        self.url = url
        self._matched = matched
        self._parts = parts
        self._words = words

    @property
    def matched(self) -> list[tuple[str, float]]:
        if self._matched is None:
            self._matched = []
        return self._matched

    @matched.setter
    def matched(self, value: list[tuple[str, float]]) -> None:
        self._matched = value

    @property
    def words(self) -> list:
        """``inflections.Word`` entries: (word, contribution, terms)."""
        words = getattr(self, "_words", None)
        if words is None:
            words = self._words = []
        return words

    @words.setter
    def words(self, value: list) -> None:
        self._words = value

    @property
    def parts(self) -> dict[str, float]:
        if self._parts is None:
            self._parts = {}
        return self._parts

    @parts.setter
    def parts(self, value: dict[str, float]) -> None:
        self._parts = value

    def _fields(self) -> tuple:
        return (self.id, self.score, self.path, self.url, self._matched or [], self._parts or {})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Hit):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # mutable, compared by value (as a dataclass)

    def __repr__(self) -> str:
        return "Hit(id={!r}, score={!r}, path={!r}, url={!r}, matched={!r}, parts={!r})".format(*self._fields())

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "score": self.score,
            "path": self.path,
            "url": self.url,
            "matched": [{"term": t, "contribution": c} for t, c in self._matched or ()],
            "words": [{"word": w, "contribution": c, "terms": list(terms)}
                      for w, c, terms in getattr(self, "_words", None) or ()],
            **({"parts": self._parts} if self._parts else {}),
        }


@runtime_checkable
class Backend(Protocol):
    """Storage and search of documents. Implementations: ``local``, ``opensearch``.

    The four searches (and ``hybrid_search``) also take ``words=WordFilter(...)``, a keyword
    the plans pass only when the query has ``+word`` or ``-word`` (search.run_query). A backend
    whose ``collapses_words`` is true also takes ``shown=N`` in ``sparse_search`` and
    ``hybrid_search`` (N the words shown a hit, ``explain`` then how many matched terms they
    are read from): it may fill each hit's ``words`` as search.collapse_matches would, with
    ``matched`` cut to N, and the plans leave the hits it filled."""

    name: str

    # After ``open``, ``identity`` is what the index records (with ``bundle_path`` when known).
    identity: IndexIdentity | None

    def open(self, identity: IndexIdentity, create: bool = True) -> None:
        """Open (or create) the index; refuse with BundleMismatchError if filled by another bundle.

        ``identity=None`` opens an existing index as it is and sets ``identity`` from its record.
        """

    def exists(self) -> bool: ...

    def upsert(self, docs: Sequence[Document]) -> None:
        """Store documents durably (an interrupted call stores all of a batch or none of it).

        Each document's paths become exactly ``doc.paths``; any other document that held one
        of them loses it (and is removed when none is left): see the module docstring."""

    def delete(self, ids: Iterable[str]) -> int:
        """Remove documents; returns how many existed."""

    def ids_present(self, ids: Iterable[str]) -> set[str]: ...

    def get(self, ids: Sequence[str]) -> list[Document]:
        """Stored documents in the order asked for (missing ids are left out)."""

    def sparse_search(self, query: SparseVector, k: int, explain: int = 5) -> list[Hit]:
        """Exact top-k by sparse dot product; ``explain`` = matched terms per hit."""

    def two_phase_search(
        self, first: SparseVector, full: SparseVector, k: int, window: int, explain: int = 5
    ) -> list[Hit]:
        """Retrieve ``window`` hits with ``first`` (the query's own words), rescore them with ``full``."""

    def dense_search(
        self, vector: np.ndarray, k: int, explain_with: SparseVector | None = None, explain: int = 5
    ) -> list[Hit]:
        """Exact or approximate top-k by inner product of dense vectors."""

    def stats(self) -> dict: ...

    def drop(self) -> None:
        """Delete the whole index."""

    def close(self) -> None: ...


@runtime_checkable
class Narrowing(Protocol):
    """Optional: metadata kept and searched by (``local``, ``opensearch``, ``elasticsearch``).
    The searches of such a backend also take ``filters=SearchFilter(...)``
    (:mod:`d2s_search.filters`), applied before the top k are taken."""

    def field_types(self) -> dict[str, str]:
        """Every field a filter may name, with its type (keyword, number, date, boolean): the
        built-in ones (:data:`d2s_search.filters.BUILT_IN_FIELDS`) and the user's."""

    def declare_fields(self, types: Mapping[str, str]) -> None:
        """Make the user's fields known (name -> type) before documents carrying them are
        stored; MetadataError when a name is already known with another type."""

    def set_metadata(self, metadata: Mapping[str, Metadata], keep_fields: Collection[str] = ()) -> int:
        """Replace the metadata of stored documents (id -> metadata) without touching their
        vectors; only documents whose metadata changed are written, and their number is
        returned. Unknown ids are left out. ``keep_fields``: ids whose stored user fields stay
        as they are (only what the picture says of itself is replaced: a re-ingest without a
        sidecar row for them)."""

    def browse(self, k: int, filters=None, offset: int = 0) -> list[Hit]:
        """The library without a query: the most recently taken pictures first (those without
        a date last, then by id), narrowed by ``filters``; ``Hit.score`` is 0."""

    def facets(self, filters=None, size: int = 20) -> dict[str, list[tuple[str, int]]]:
        """Counts of the documents passing ``filters`` by folder, camera and each keyword or
        boolean field of the user's: the ``size`` commonest values of each, most first."""


@runtime_checkable
class PathListing(Protocol):
    """Optional: stored paths without the vectors, for ``index prune``, the missing-file count
    of ``index stats``, and copies, moved and overwritten files in ``ingest`` (``local``,
    ``opensearch`` and ``elasticsearch`` have it; without it ``ingest`` only adds documents)."""

    def document_paths(self) -> Iterable[tuple[str, str]]:
        """(id, path) of every stored path: a document with copies comes once per path."""

    def paths_of(self, ids: Iterable[str]) -> dict[str, list[str]]:
        """id -> every stored path (the shown one first) of the given ids that are stored
        (cheaper than ``get``)."""

    def relink(self, found: Mapping[str, str] | None = None, gone: Iterable[str] = ()) -> int:
        """Move paths between stored documents without touching their vectors (see
        :func:`relinked`): ``found`` path -> id of the stored document whose bytes are now at
        that path, ``gone`` paths whose file is gone. Returns how many documents were removed
        (left without a path)."""


def relinked(current: Mapping[str, Sequence[str]], found: Mapping[str, str],
             gone: Iterable[str] = ()) -> dict[str, list[str]]:
    """The new paths (shown one first) of every document in ``current`` (id -> its paths)
    that changes; ``[]``: the document is to be removed.

    A path in ``found`` belongs to its document from now on and to no other; a path in
    ``gone`` to none. A document whose shown path is taken away and that gains a path in the
    same step has moved: the new path is shown. ``current`` must hold every document that
    holds or gains one of these paths (ids in ``found`` that are not in it are not stored:
    their paths are only taken from the others).
    """
    gone = set(gone)
    gained: dict[str, list[str]] = {}
    for path, doc_id in found.items():
        gained.setdefault(doc_id, []).append(path)
    changed: dict[str, list[str]] = {}
    for doc_id, paths in current.items():
        kept = [p for p in paths if p not in gone and found.get(p, doc_id) == doc_id]
        added = [p for p in gained.get(doc_id, ()) if p not in paths]
        new = added + kept if paths and paths[0] not in kept and added else kept + added
        new = list(dict.fromkeys(new))
        if new != list(paths):
            changed[doc_id] = new
    return changed
