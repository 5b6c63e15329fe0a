"""The one protocol every index backend speaks, and the records that cross it.

A backend stores :class:`Document` records keyed by content hash and answers sparse
(dot product over ``{term: weight}``), two-phase and dense (inner product) searches.
Fusion of sparse and dense runs lives in :mod:`d2s_search.search`, so a backend only needs
to support it natively if it can do better (OpenSearch's hybrid query).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

SparseVector = dict[str, float]


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
    path: str
    size_bytes: int
    width: int
    height: int
    sparse: SparseVector  # positive weights only
    dense: np.ndarray  # float32, shape (dense_dim,)
    url: str | None = None
    ingested_at: float = 0.0

    def top_terms(self, n: int = 20) -> list[str]:
        return [t for t, _ in sorted(self.sparse.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


class Hit:
    """One search result.

    ``matched``: (term, query_weight * doc_weight), largest first: why this image matched.
    ``parts``: per-run scores of fused results, e.g. {"sparse": 3.1, "dense": 0.42}.

    Slotted, and the two containers are made on first use: a k=1000 search builds 1,000 hits,
    most never explained or fused (0.6x the time of a slotted dataclass with two default
    factories, and one object per hit for the garbage collector instead of three).
    """

    __slots__ = ("id", "score", "path", "url", "_matched", "_parts")

    def __init__(self, id: str, score: float, path: str, url: str | None = None,
                 matched: list[tuple[str, float]] | None = None, parts: dict[str, float] | None = None) -> None:
        self.id = id
        self.score = score
        self.path = path
        self.url = url
        self._matched = matched
        self._parts = parts

    @property
    def matched(self) -> list[tuple[str, float]]:
        if self._matched is None:
            self._matched = []
        return self._matched

    @matched.setter
    def matched(self, value: list[tuple[str, float]]) -> None:
        self._matched = value

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
            **({"parts": self._parts} if self._parts else {}),
        }


@runtime_checkable
class Backend(Protocol):
    """Storage and search of documents. Implementations: ``local``, ``opensearch``."""

    name: str

    # After ``open``, ``identity`` is what the index records (with ``bundle_path`` when known).
    identity: IndexIdentity | None

    def open(self, identity: IndexIdentity, create: bool = True) -> None:
        """Open (or create) the index; refuse with BundleMismatchError if filled by another bundle.

        ``identity=None`` opens an existing index as it is and sets ``identity`` from its record.
        """

    def exists(self) -> bool: ...

    def upsert(self, docs: Sequence[Document]) -> None:
        """Store documents durably (an interrupted call stores all of a batch or none of it)."""

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
class PathListing(Protocol):
    """Optional: stored paths without the vectors, for ``index prune``, the missing-file count
    of ``index stats`` and moved files in ``ingest`` (``local``, ``opensearch`` and
    ``elasticsearch`` have it; a backend without it falls back to ``get`` in ``ingest``)."""

    def document_paths(self) -> Iterable[tuple[str, str]]:
        """(id, path) of every document."""

    def paths_of(self, ids: Iterable[str]) -> dict[str, str]:
        """id -> stored path of the given ids that are stored (cheaper than ``get``)."""
