"""Amazon OpenSearch Serverless (SigV4 service ``aoss``): what differs there, and the lookups
that replace ids.

From the AWS developer guide (read through the public copies of these pages):

* "Supported operations and plugins in Amazon OpenSearch Serverless" (serverless-genref): a
  subset of the API. ``_bulk``, ``_search``, index create/delete/describe and ``_mapping``
  are offered; ``_refresh``, scroll (``_search/scroll``), ``_reindex``, ``GET /``, ``_cat``,
  ``_nodes`` and ``_cluster/settings`` are not (``_refresh`` answers 404 with no body,
  opensearch-project/opensearch-py#646). Documents become searchable on their own.
* "Choosing a collection type" (serverless-overview) and, for NextGen collections, the
  Migration Assistant's "Collection types": a *vector search* (and *time series*) collection
  generates every document id; an explicit ``_id`` on a write is refused ("Document ID is not
  supported in create/index operation request", opensearch-project/opensearch-py#792).
* "Configure Neural Search and Hybrid Search on OpenSearch Serverless": the ``hybrid`` query with
  the ``normalization-processor`` (``min_max``; ``arithmetic_mean``) and ``neural_sparse`` are
  offered; RRF (``score-ranker-processor``), model uploads to ml-commons and neural-search's
  SEISMIC index are not listed.

So on ``aoss`` every index is made for a vector search collection (it works the same in a
search collection): the content hash is stored in the keyword field ``content_id``, documents
are found by it (``terms``), a re-ingest replaces a stored document (delete by its server id,
index anew: no duplicates), nothing is refreshed, paths are listed with ``search_after`` on
``content_id``, and a write whose answer was lost is not sent again (it may have been stored:
the next ingest finds it by its hash). ``index reindex`` is refused at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from d2s_search.backends.opensearch.queries import CONTENT_ID, content_lookup_body

REINDEX_REFUSED = (
    "index reindex is not offered on Amazon OpenSearch Serverless (no _reindex or scroll there): "
    "create a new index and ingest again"
)
SEISMIC_REFUSED = "the SEISMIC sparse index is not offered on Amazon OpenSearch Serverless: use --sparse-index rank_features"
LOOKUP_CHUNK = 1000

Search = Callable[[dict[str, Any]], list[dict]]


def content_id_of(hit: Mapping[str, Any]) -> str:
    """A hit's content hash (its ``_id`` is the server's)."""
    return str((hit.get("_source") or {}).get(CONTENT_ID) or hit["_id"])


def stored_documents(
    search: Search, ids: Iterable[str], fields: Sequence[str] | bool
) -> list[dict]:
    """Every stored document with one of these content hashes, as raw hits (a hash stored twice
    comes back twice); ``fields``: the ``_source`` fields wanted (``content_id`` always)."""
    wanted = fields if isinstance(fields, bool) and fields else [CONTENT_ID, *(fields or [])]
    ids = list(dict.fromkeys(ids))
    hits: list[dict] = []
    for start in range(0, len(ids), LOOKUP_CHUNK):
        hits += search(content_lookup_body(ids[start : start + LOOKUP_CHUNK], wanted))
    return hits


def as_mget(hits: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Raw hits in the shape of ``_mget`` docs keyed by content hash (the first of a duplicate)."""
    docs: dict[str, dict[str, Any]] = {}
    for hit in hits:
        doc_id = content_id_of(hit)
        docs.setdefault(
            doc_id, {"_id": doc_id, "found": True, "_source": dict(hit.get("_source") or {})}
        )
    return list(docs.values())


def server_ids(hits: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(content hash, server id) of every stored copy."""
    return [(content_id_of(h), str(h["_id"])) for h in hits]
