"""Request bodies that OpenSearch and Elasticsearch accept in the same form (pure, no I/O)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from d2s_search.backends.base import IndexIdentity, WordFilter
from d2s_search.backends.engine import narrowing
from d2s_search.backends.engine.documents import SPARSE_FIELD
from d2s_search.backends.opensearch.features import escape_term
from d2s_search.errors import QueryError
from d2s_search.filters import SearchFilter

MAPPING_VERSION = 1
MAX_RESULT_WINDOW = 10_000  # index.max_result_window default (both engines)
SPARSE_KEYS = "vocabulary terms with '%' written as '%25' and '.' as '%2E'"


@dataclass(frozen=True)
class Filters:
    """Restrictions applied to every query plan: a path prefix, words a hit must carry or
    must not (``words``; ``sparse_vector``: the index keeps the sparse field as Elasticsearch's
    ``sparse_vector`` rather than ``rank_features``), and the metadata filter (``search``,
    with ``types``, the user's fields: a date field's values are stored as epoch millis)."""

    path_prefix: str | None = None
    words: WordFilter | None = None
    sparse_vector: bool = False
    search: SearchFilter | None = None
    types: Mapping[str, str] = field(default_factory=dict)

    def clauses(self) -> list[dict[str, Any]]:
        """Filter clauses: what every hit must match."""
        out: list[dict[str, Any]] = []
        if self.path_prefix:
            out.append({"prefix": {"path": {"value": self.path_prefix}}})
        if self.words:
            out += [self._carries(t) for t in self.words.required]
        if self.search:
            out += narrowing.filter_clauses(self.search, self.types)[0]
        return out

    def exclusions(self) -> list[dict[str, Any]]:
        """``must_not`` clauses: what no hit may match."""
        out = [self._carries(t) for t in self.words.excluded] if self.words else []
        if self.search:
            out += narrowing.filter_clauses(self.search, self.types)[1]
        return out

    def count(self) -> int:
        """Leaf clauses these add (Lucene counts them against ``max_clause_count``)."""
        return narrowing.leaves(self.clauses()) + narrowing.leaves(self.exclusions())

    def as_query(self) -> dict[str, Any] | None:
        """All of it as one query (a k-NN ``filter``), or None when there is nothing."""
        clauses, exclusions = self.clauses(), self.exclusions()
        if not exclusions:
            return None if not clauses else clauses[0] if len(clauses) == 1 else {"bool": {"filter": clauses}}
        body: dict[str, Any] = {"must_not": exclusions}
        if clauses:
            body["filter"] = clauses
        return {"bool": body}

    def _carries(self, term: str) -> dict[str, Any]:
        """Documents whose stored weight for ``term`` is at least the threshold. Neither engine
        queries a feature's value directly (``rank_features`` answer only ``rank_feature``
        queries): the feature's linear score (boost 1: the stored weight itself) behind
        ``function_score``'s ``min_score``, which excludes in filter context too."""
        key = escape_term(term)
        if self.sparse_vector:
            scored = {"sparse_vector": {"field": SPARSE_FIELD, "query_vector": {key: 1.0}, "prune": False}}
        else:
            scored = {"rank_feature": {"field": f"{SPARSE_FIELD}.{key}", "linear": {}}}
        return {"function_score": {"query": scored, "min_score": float(self.words.threshold)}}


NO_FILTERS = Filters()


def bundle_meta(identity: IndexIdentity | None, dense_dim: int) -> dict[str, Any]:
    """The mapping's ``_meta`` entries that record the bundle (read back by
    :func:`~d2s_search.backends.engine.identity.meta_identity`); each engine adds its own."""
    meta: dict[str, Any] = {
        "d2s_mapping_version": MAPPING_VERSION,
        "fingerprint": identity.fingerprint if identity else "",
        "dense_dim": dense_dim,
        "model": identity.model if identity else "",
        "sparse_keys": SPARSE_KEYS,
    }
    if identity and identity.bundle_path:
        meta["bundle_path"] = identity.bundle_path
    return meta


def document_properties() -> dict[str, Any]:
    """The mapping of every field but the two vectors (both engines store them alike)."""
    return {
        "terms": {"type": "keyword"},
        "path": {"type": "keyword"},
        "url": {"type": "keyword"},
        "width": {"type": "integer"},
        "height": {"type": "integer"},
        "size_bytes": {"type": "long"},
        "ingested_at": {"type": "date", "format": "epoch_millis"},
        **narrowing.metadata_properties(),
    }


def check_page(k: int, offset: int) -> None:
    """Refuse a page the engine would refuse: ``from + size`` beyond ``index.max_result_window``."""
    if k <= 0:
        raise QueryError("k must be positive")
    if offset < 0:
        raise QueryError("the page offset cannot be negative")
    if offset + k > MAX_RESULT_WINDOW:
        raise QueryError(f"cannot page past {MAX_RESULT_WINDOW} hits (offset {offset} + k {k}); narrow the query")


def rank_feature_clauses(weights: Mapping[str, float]) -> list[dict[str, Any]]:
    """One ``rank_feature`` clause per term: score = boost * stored value, i.e. the dot product."""
    return [
        {"rank_feature": {"field": f"{SPARSE_FIELD}.{key}", "linear": {}, "boost": w}}
        for key, w in weights.items()
    ]


def should_query(should: list[dict[str, Any]], filter_clauses: list[dict[str, Any]],
                 must_not: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``bool.should`` of scoring clauses, restricted by ``filter_clauses`` and ``must_not``."""
    body: dict[str, Any] = {"should": should}
    if filter_clauses:
        body["filter"] = filter_clauses
    if must_not:
        body["must_not"] = must_not
    if filter_clauses or must_not:
        # With a filter, should-clauses become optional: demand one so only matches count.
        body["minimum_should_match"] = 1
    return {"bool": body}


def filtered(scoring: dict[str, Any], filter_clauses: list[dict[str, Any]],
             must_not: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One scoring query, restricted by ``filter_clauses`` and ``must_not`` (itself when there
    are none)."""
    if not filter_clauses and not must_not:
        return scoring
    body: dict[str, Any] = {"must": [scoring]}
    if filter_clauses:
        body["filter"] = filter_clauses
    if must_not:
        body["must_not"] = must_not
    return {"bool": body}


def rescore(query: dict[str, Any], window: int) -> dict[str, Any]:
    """Rescore the top ``window`` hits with ``query``; ``query_weight: 0`` makes a rescored
    hit's score exactly ``query``'s score."""
    return {
        "window_size": window,
        "query": {
            "rescore_query": query,
            "query_weight": 0.0,
            "rescore_query_weight": 1.0,
            "score_mode": "total",
        },
    }


def mget_body(ids: Sequence[str]) -> dict[str, Any]:
    return {"ids": list(ids)}


HOLDERS_PER_REQUEST = 500  # paths asked at once: one bool clause each, under max_clause_count (1024)


def holders_body(paths: Sequence[str], source: bool | list[str] = False) -> dict[str, Any]:
    """The documents that hold any of ``paths`` (ids only): one exact ``term`` clause a path
    (a ``terms`` query would do, but the Elasticsearch specification renders it without its
    field). A path belongs to one document, so ten hits a path leave room for what an older
    version left behind (one document per ingest of an overwritten file)."""
    return {"size": min(MAX_RESULT_WINDOW, 10 * len(paths)), "_source": source,
            "query": {"bool": {"should": [{"term": {"path": {"value": p}}} for p in paths]}}}


def reindex_body(source_index: str, dest_index: str) -> dict[str, Any]:
    return {"source": {"index": source_index}, "dest": {"index": dest_index, "op_type": "index"}}


def alias_swap_body(alias: str, new_index: str, old_index: str | None, old_is_alias: bool) -> dict[str, Any]:
    """Point ``alias`` at ``new_index`` atomically; a same-named plain index is removed in the same step."""
    actions: list[dict[str, Any]] = [{"add": {"index": new_index, "alias": alias}}]
    if old_index and old_is_alias:
        actions.append({"remove": {"index": old_index, "alias": alias}})
    elif old_index:
        actions.append({"remove_index": {"index": old_index}})
    return {"actions": actions}


def dumps(obj: Any) -> str:
    """Compact JSON, no NaN, non-ASCII kept: the exact bytes both engines' bulk lines use."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
