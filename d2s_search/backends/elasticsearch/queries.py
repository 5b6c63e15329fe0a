"""Pure builders of every request body the Elasticsearch backend sends.

No I/O here, so each body is checked against the Elasticsearch API specification in tests.
``mappings/elasticsearch/*.json`` are these builders' output with default arguments (a test keeps
them equal), so a user can apply them with curl.

Versions (Elasticsearch reference; the backend checks the server's version where it matters):

=================================================  =======================================
``rank_features`` field + ``rank_feature`` query     7.0+ (the default sparse mapping)
``sparse_vector`` field                              8.11+ (alternative sparse mapping)
``sparse_vector`` query with ``query_vector``        8.15+
``dense_vector`` HNSW, ``dot_product``               8.0+; top-level ``knn`` in ``_search`` 8.4+
``max_inner_product`` similarity                     8.11+
``int8_hnsw`` index type                             8.12+
``rrf`` retriever                                    8.14+ (GA 8.16), Enterprise or trial license
``sparse_vector`` query ``prune``                    8.15+ (sent as false: see below)
``sparse_vector`` mapping ``index_options.prune``    8.19.x and 9.1+ (not 9.0)
=================================================  =======================================

Pruning (elastic/elasticsearch, ``server/.../index/mapper/vectors/SparseVectorFieldMapper.java``
and ``server/.../inference/WeightedTokensUtils.java``, 8.19/9.1 line): a ``sparse_vector`` field
of an index created on 8.19+ or 9.1+ defaults to ``index_options: {prune: true}``, and a
``sparse_vector`` query without ``prune`` takes the field's setting, so it silently drops every
query token whose document frequency is over 5x the field's average, unless its weight is over
0.4x the query's best (``TokenPruningConfig`` defaults). The score is then no longer the dot
product and frequent words stop counting. Every ``sparse_vector`` query here says
``prune: false``, and the mapping says ``index_options: {prune: false}`` where the server takes
it (for Dev Tools and other clients that query the field).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from d2s_search.backends.base import Document, IndexIdentity, SparseVector
from d2s_search.backends.elasticsearch.features import check_feature_key, prune, sendable_weights
from d2s_search.backends.engine import bodies
from d2s_search.backends.engine.bodies import NO_FILTERS, Filters, check_page, dumps
from d2s_search.backends.engine.documents import (
    DENSE_FIELD,
    SPARSE_FIELD,
    checked_dense,
    source_from_document,
)
from d2s_search.errors import QueryError

SPARSE_TYPES = ("rank_features", "sparse_vector")
SIMILARITIES = ("dot_product", "max_inner_product")
DENSE_INDEX_TYPES = ("hnsw", "int8_hnsw")
DEFAULT_MAX_CLAUSES = 1024  # the floor of Elasticsearch 8's heap-derived clause limit
MAX_NUM_CANDIDATES = 10_000  # knn num_candidates limit
# Fields a search hit needs to become a Hit (matched terms come from the stored features).
HIT_SOURCE = ["path", "url", SPARSE_FIELD]
# Minimum server versions of optional features, (major, minor).
SINCE = {
    "sparse_vector": (8, 11),
    "sparse_vector_query": (8, 15),
    "max_inner_product": (8, 11),
    "int8_hnsw": (8, 12),
    "rrf_retriever": (8, 14),
}


def takes_sparse_index_options(version: tuple[int, int]) -> bool:
    """Does a server of ``version`` accept ``index_options`` on a ``sparse_vector`` field?

    IndexVersions.SPARSE_VECTOR_PRUNING_INDEX_OPTIONS_SUPPORT (9.1.0) and its 8.x backport
    (8.19.0); 9.0 has neither ("unknown parameter [index_options]"). These are also the
    versions whose new fields prune by default.
    """
    return (8, 19) <= tuple(version) < (9, 0) or tuple(version) >= (9, 1)


@dataclass(frozen=True)
class VectorMapping:
    """How the index stores vectors (recorded in ``_meta`` so searches pick the right query)."""

    sparse_type: str = "rank_features"
    similarity: str = "dot_product"
    index_type: str = "hnsw"
    m: int = 16
    ef_construction: int = 100

    def validate(self) -> None:
        if self.sparse_type not in SPARSE_TYPES:
            raise QueryError(f"unknown sparse field type {self.sparse_type!r} (use {' or '.join(SPARSE_TYPES)})")
        if self.similarity not in SIMILARITIES:
            raise QueryError(f"unknown similarity {self.similarity!r} (use {' or '.join(SIMILARITIES)})")
        if self.index_type not in DENSE_INDEX_TYPES:
            raise QueryError(f"unknown dense index type {self.index_type!r} (use {' or '.join(DENSE_INDEX_TYPES)})")

    def needs(self) -> list[str]:
        """Features of this mapping that need a recent server (keys of ``SINCE``)."""
        out = []
        if self.sparse_type == "sparse_vector":
            out.append("sparse_vector")
        if self.similarity == "max_inner_product":
            out.append("max_inner_product")
        if self.index_type == "int8_hnsw":
            out.append("int8_hnsw")
        return out


DEFAULT_MAPPING = VectorMapping()


# -- index -------------------------------------------------------------------------------


def index_body(
    identity: IndexIdentity | None = None,
    mapping: VectorMapping = DEFAULT_MAPPING,
    *,
    shards: int | None = 1,
    replicas: int | None = 0,
    keep_vectors_in_source: bool = False,
    sparse_index_options: bool = False,
) -> dict[str, Any]:
    """The ``PUT /<index>`` body: settings plus the mapping, ``_meta`` carrying the bundle.

    ``sparse_index_options``: a ``sparse_vector`` field gets ``index_options: {prune: false}``
    (only for a server that takes it: :func:`takes_sparse_index_options`).

    ``shards``/``replicas`` None leaves them out (Elastic Cloud Serverless refuses them).
    ``keep_vectors_in_source``: Elasticsearch 9.x drops ``dense_vector``/``sparse_vector`` values
    from ``_source`` by default (``index.mapping.exclude_source_vectors``), which would hide the
    stored terms that explain a hit; this sets it to false. 8.x does not know the setting.
    """
    mapping.validate()
    dim = identity.dense_dim if identity else 256
    settings: dict[str, Any] = {}
    if shards is not None:
        settings["number_of_shards"] = shards
    if replicas is not None:
        settings["number_of_replicas"] = replicas
    if keep_vectors_in_source:
        settings["mapping.exclude_source_vectors"] = False
    body: dict[str, Any] = {
        "mappings": {
            "dynamic": "strict",
            # The bundle (with where it is: a second export elsewhere breaks nothing) and the
            # vector mapping, read back by meta_identity and meta_mapping.
            "_meta": {**bodies.bundle_meta(identity, dim), "sparse_type": mapping.sparse_type,
                      "similarity": mapping.similarity},
            "properties": {
                SPARSE_FIELD: sparse_field(mapping.sparse_type, sparse_index_options),
                DENSE_FIELD: {
                    "type": "dense_vector",
                    "dims": dim,
                    "index": True,
                    "similarity": mapping.similarity,
                    "index_options": {
                        "type": mapping.index_type,
                        "m": mapping.m,
                        "ef_construction": mapping.ef_construction,
                    },
                },
                **bodies.document_properties(),
            },
        },
    }
    if settings:
        body["settings"] = {"index": settings}
    return body



def sparse_field(sparse_type: str, index_options: bool = False) -> dict[str, Any]:
    """The sparse field's mapping; a ``sparse_vector`` one that never prunes when asked."""
    field: dict[str, Any] = {"type": sparse_type}
    if sparse_type == "sparse_vector" and index_options:
        field["index_options"] = {"prune": False}
    return field


def meta_mapping(meta: Mapping[str, Any] | None, properties: Mapping[str, Any] | None = None) -> VectorMapping:
    """The stored mapping choices (from ``_meta``, else from the field types themselves)."""
    meta = meta or {}
    props = properties or {}
    sparse_type = meta.get("sparse_type") or props.get(SPARSE_FIELD, {}).get("type") or "rank_features"
    dense = props.get(DENSE_FIELD, {})
    similarity = meta.get("similarity") or dense.get("similarity") or "dot_product"
    index_type = (dense.get("index_options") or {}).get("type", "hnsw")
    return VectorMapping(
        sparse_type=sparse_type if sparse_type in SPARSE_TYPES else "rank_features",
        similarity=similarity if similarity in SIMILARITIES else "dot_product",
        index_type=index_type if index_type in DENSE_INDEX_TYPES else "hnsw",
    )


# -- documents ---------------------------------------------------------------------------


def doc_source(doc: Document, mapping: VectorMapping = DEFAULT_MAPPING, top_terms: int = 20,
               types: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``_source`` stored for a document (escaped, float32, positive sparse weights).

    Raises ValueError for what Elasticsearch would refuse: non-finite values, and for
    ``dot_product`` a dense vector that is not unit length (DenseVectorFieldMapper checks
    ``|squared magnitude - 1| <= 1e-4``).
    """
    dense = checked_dense(doc)
    if mapping.similarity == "dot_product":
        sq = float(np.dot(dense, dense))
        if abs(sq - 1.0) > 1e-4:
            raise ValueError(
                f"dense vector has squared length {sq:.6f}; the dot_product similarity needs unit "
                "vectors (create the index with --similarity max_inner_product)"
            )
    sparse = sendable_weights(doc.sparse)
    for key in sparse:
        check_feature_key(key, mapping.sparse_type)
    return source_from_document(doc, sparse, dense, top_terms, types)


def bulk_index_lines(index: str, docs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """NDJSON lines (action, source) for ``_bulk``; ``index`` overwrites, so retries are safe."""
    lines: list[str] = []
    for doc_id, source in docs:
        lines.append(dumps({"index": {"_index": index, "_id": doc_id}}))
        lines.append(dumps(source))
    return lines


def bulk_delete_lines(index: str, ids: Iterable[str]) -> list[str]:
    return [dumps({"delete": {"_index": index, "_id": i}}) for i in ids]


def bulk_update_lines(index: str, updates: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """NDJSON lines (action, partial document) of updates, e.g. a document's paths."""
    lines: list[str] = []
    for doc_id, fields in updates:
        lines.append(dumps({"update": {"_index": index, "_id": doc_id}}))
        lines.append(dumps({"doc": dict(fields)}))
    return lines


# -- queries -----------------------------------------------------------------------------


def query_weights(query: SparseVector, max_clauses: int) -> dict[str, float]:
    """Escaped, float32, positive query weights, pruned to the largest ``max_clauses``."""
    return prune(sendable_weights(query), max_clauses)


def sparse_query(
    query: SparseVector,
    *,
    sparse_type: str = "rank_features",
    max_clauses: int = DEFAULT_MAX_CLAUSES,
    filters: Filters = NO_FILTERS,
) -> dict[str, Any]:
    """Score = sparse dot product over the stored (9-bit) weights.

    ``rank_features``: ``bool.should`` of ``rank_feature`` (linear, boost = query weight).
    ``sparse_vector``: one ``sparse_vector`` query with ``query_vector`` (Elasticsearch builds the
    same linear feature clauses, one per token).
    """
    filter_clauses, exclusions = filters.clauses(), filters.exclusions()
    # Lucene counts every leaf clause against the clause limit, filters included.
    weights = query_weights(query, max(1, max_clauses - filters.count()))
    if not weights:
        raise QueryError("the query has no terms with a positive weight")
    if sparse_type == "sparse_vector":
        # prune false: every token counts, as in the dot product (see the module docstring)
        query = {"sparse_vector": {"field": SPARSE_FIELD, "query_vector": weights, "prune": False}}
        return bodies.filtered(query, filter_clauses, exclusions)
    return bodies.should_query(bodies.rank_feature_clauses(weights), filter_clauses, exclusions)


def source_filter(fields: Sequence[str]) -> dict[str, Any]:
    """``_source`` as a filter object (the plain-list form is missing from the serverless spec)."""
    return {"includes": list(fields)}


def search_body(query: dict[str, Any] | None, k: int, offset: int = 0,
                source: Sequence[str] = HIT_SOURCE) -> dict[str, Any]:
    check_page(k, offset)
    body: dict[str, Any] = {"size": k, "from": offset, "_source": source_filter(source), "track_total_hits": False}
    if query is not None:
        body["query"] = query
    return body


def sparse_search_body(query: SparseVector, k: int, *, offset: int = 0, sparse_type: str = "rank_features",
                       max_clauses: int = DEFAULT_MAX_CLAUSES, filters: Filters = NO_FILTERS) -> dict[str, Any]:
    q = sparse_query(query, sparse_type=sparse_type, max_clauses=max_clauses, filters=filters)
    return search_body(q, k, offset)


def two_phase_body(first: SparseVector, full: SparseVector, k: int, window: int, *, offset: int = 0,
                   sparse_type: str = "rank_features", max_clauses: int = DEFAULT_MAX_CLAUSES,
                   filters: Filters = NO_FILTERS) -> dict[str, Any]:
    """Retrieve with ``first``, rescore the top ``window`` with ``full``.

    ``query_weight: 0`` makes a rescored hit's score exactly the full query's score; the window
    covers the whole page, or hits past it would keep their first-phase scores.
    """
    body = sparse_search_body(first, k, offset=offset, sparse_type=sparse_type, max_clauses=max_clauses,
                              filters=filters)
    body["rescore"] = bodies.rescore(sparse_query(full, sparse_type=sparse_type, max_clauses=max_clauses),
                                     max(int(window), offset + k))
    return body


def knn_clause(vector: np.ndarray, k: int, filters: Filters = NO_FILTERS,
               num_candidates: int | None = None) -> dict[str, Any]:
    """The ``knn`` search option (also the body of a ``knn`` retriever)."""
    vec = np.asarray(vector, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(vec)):
        raise QueryError("the dense query vector has NaN or infinite values")
    if k > MAX_NUM_CANDIDATES:
        raise QueryError(f"knn k cannot exceed {MAX_NUM_CANDIDATES}")
    candidates = num_candidates or max(100, 2 * k)
    knn: dict[str, Any] = {
        "field": DENSE_FIELD,
        "query_vector": [float(x) for x in vec],
        "k": int(k),
        "num_candidates": int(min(MAX_NUM_CANDIDATES, max(k, candidates))),
    }
    clauses = filters.clauses()
    if filters.exclusions():
        clauses = [filters.as_query()]
    if clauses:
        knn["filter"] = clauses  # applied during the search: k hits that pass, when k exist
    return knn


def knn_search_body(vector: np.ndarray, k: int, *, offset: int = 0, filters: Filters = NO_FILTERS,
                    num_candidates: int | None = None, source: Sequence[str] = HIT_SOURCE) -> dict[str, Any]:
    body = search_body(None, k, offset, source)
    body["knn"] = knn_clause(vector, offset + k, filters, num_candidates)
    return body


def rrf_search_body(sparse: SparseVector, vector: np.ndarray, k: int, *, offset: int = 0,
                    window: int | None = None, rank_constant: int = 60, sparse_type: str = "rank_features",
                    max_clauses: int = DEFAULT_MAX_CLAUSES, filters: Filters = NO_FILTERS,
                    source: Sequence[str] = HIT_SOURCE) -> dict[str, Any]:
    """Hybrid through the ``rrf`` retriever: a standard (sparse) and a knn (dense) retriever."""
    check_page(k, offset)
    if rank_constant < 1:
        raise QueryError("the RRF rank constant must be at least 1")
    depth = min(MAX_NUM_CANDIDATES, max(int(window or 0), offset + k))
    standard = {"query": sparse_query(sparse, sparse_type=sparse_type, max_clauses=max_clauses, filters=filters)}
    body: dict[str, Any] = {
        "retriever": {
            "rrf": {
                "retrievers": [{"standard": standard}, {"knn": knn_clause(vector, depth, filters)}],
                "rank_window_size": depth,
                "rank_constant": int(rank_constant),
            }
        },
        "size": k,
        "from": offset,
        "_source": source_filter(source),
    }
    return body


# -- reindex, aliases, scans -------------------------------------------------------------


def pit_page_body(pit_id: str, page: int, after: list[Any] | None = None, keep_alive: str = "5m",
                  fields: Sequence[str] | None = None) -> dict[str, Any]:
    """One page of a point-in-time scan (``_shard_doc`` order), for copying every document;
    ``fields``: only these of ``_source`` (e.g. the stored paths for ``index prune``)."""
    body: dict[str, Any] = {
        "size": int(page),
        "query": {"match_all": {}},
        "pit": {"id": pit_id, "keep_alive": keep_alive},
        "sort": [{"_shard_doc": {"order": "asc"}}],
        "track_total_hits": False,
    }
    if fields is not None:
        body["_source"] = source_filter(fields)
    if after is not None:
        body["search_after"] = list(after)
    return body


def close_pit_body(pit_id: str) -> dict[str, Any]:
    return {"id": pit_id}


def put_meta_body(identity: IndexIdentity, mapping: VectorMapping = DEFAULT_MAPPING) -> dict[str, Any]:
    return {"_meta": index_body(identity, mapping)["mappings"]["_meta"]}
