"""Pure builders of every request body the OpenSearch backend sends.

No I/O here, so each body can be checked against the OpenSearch API specification in tests.
``mappings/index.json`` and ``mappings/pipelines/*.json`` are these builders' output with the
default arguments (a test keeps them equal), so a user can apply them with curl.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from d2s_search.backends.base import Document, IndexIdentity, SparseVector
from d2s_search.backends.engine import bodies, narrowing
from d2s_search.backends.engine.bodies import MAX_RESULT_WINDOW, NO_FILTERS, Filters, check_page
from d2s_search.backends.engine.documents import (
    DENSE_FIELD,
    SPARSE_FIELD,
    checked_dense,
    source_from_document,
)
from d2s_search.backends.opensearch.cluster import Dialect
from d2s_search.backends.opensearch.features import (
    NEURAL_SPARSE_MAX_WEIGHT,
    prune,
    sendable_weights,
)
from d2s_search.errors import QueryError

DEFAULT_MAX_CLAUSES = 1024  # indices.query.bool.max_clause_count default
# index.max_rescore_window default (OpenSearch server/.../index/IndexSettings.java,
# MAX_RESCORE_WINDOW_SETTING, 2.x and 3.x): a larger rescore window_size fails the search.
MAX_RESCORE_WINDOW = 10_000
# Clauses kept free under max_clause_count: the limit counts every leaf (filters, the hybrid
# query's k-NN clause), and plugins may add a clause or two; sitting exactly at it is fragile.
CLAUSE_MARGIN = 8
NEWEST = Dialect()
SPARSE_RANK_FEATURES = "rank_features"
SPARSE_SEISMIC = "seismic"
# SEISMIC parameters sent when creating the field. neural-search 3.3.0.0
# sparse/common/SparseConstants.java defaults: n_postings -1 (derived from the segment),
# cluster_ratio 0.1, summary_prune_ratio 0.4, approximate_threshold 1,000,000 documents per
# segment before the approximate index is built, quantization_ceiling_ingest 3.0 (document
# weights are quantized to 8 bits up to it: larger ones are clipped), _search 16.
SEISMIC_DEFAULTS: dict[str, Any] = {"approximate_threshold": 1_000_000, "quantization_ceiling_ingest": 3.0}
# Amazon OpenSearch Serverless vector search collections generate every document id: the
# content hash lives in this keyword field instead (see backend.py).
CONTENT_ID = "content_id"
PIPELINE_MINMAX = "d2s-hybrid-minmax"
PIPELINE_RRF = "d2s-hybrid-rrf"
# Fields a search hit needs to become a Hit (matched terms come from the stored features).
HIT_SOURCE = ["path", "url", SPARSE_FIELD]


# -- index -------------------------------------------------------------------------------


def index_body(
    identity: IndexIdentity | None = None,
    *,
    engine: str = "faiss",
    shards: int = 1,
    replicas: int = 0,
    m: int = 16,
    ef_construction: int = 128,
    sparse_index: str = SPARSE_RANK_FEATURES,
    seismic: Mapping[str, Any] | None = None,
    serverless: bool = False,
) -> dict[str, Any]:
    """The ``PUT /<index>`` body: settings plus the mapping, ``_meta`` carrying the bundle.

    ``sparse_index="seismic"`` (OpenSearch 3.3+, neural-search): the sparse field is a
    ``sparse_vector`` with the SEISMIC approximate index (keys are vocabulary ids, see
    :mod:`d2s_search.backends.opensearch.seismic`); ``seismic`` overrides its parameters. Such
    an index has neither ``index.knn`` nor a ``knn_vector`` (k-NN's and neural-search's codec
    factories cannot share an index): the dense vectors live in the sibling index that
    :func:`dense_index_body` describes.

    ``serverless`` (Amazon OpenSearch Serverless): no shard counts (a collection manages its
    shards; an index there takes ``knn``, ``knn.algo_param.ef_search`` and ``refresh_interval``,
    AWS CloudFormation ``AWS::OpenSearchServerless::Index``), and the content hash in the
    keyword field :data:`CONTENT_ID`, as a vector search collection assigns document ids itself.
    """
    if engine not in ("faiss", "lucene"):
        raise QueryError(f"unknown k-NN engine {engine!r} (use faiss or lucene)")
    if sparse_index not in (SPARSE_RANK_FEATURES, SPARSE_SEISMIC):
        raise QueryError(f"unknown sparse index {sparse_index!r} (use {SPARSE_RANK_FEATURES} or {SPARSE_SEISMIC})")
    dim = identity.dense_dim if identity else 256
    settings: dict[str, Any] = {} if serverless else {"number_of_shards": shards, "number_of_replicas": replicas}
    properties: dict[str, Any] = {SPARSE_FIELD: {"type": "rank_features"}}
    meta = bodies.bundle_meta(identity, dim)
    if sparse_index == SPARSE_SEISMIC:
        settings["sparse"] = True  # neural-search 3.3.0.0 SparseSettings.IS_SPARSE_INDEX_SETTING
        properties[SPARSE_FIELD] = {
            "type": "sparse_vector",
            "method": {"name": "seismic", "parameters": {**SEISMIC_DEFAULTS, **(seismic or {})}},
        }
        meta.update(sparse_index=SPARSE_SEISMIC, sparse_keys="vocabulary ids (positions in the bundle's vocabulary)",
                    dense_vectors=DENSE_SIBLING)
    else:
        settings["knn"] = True
        properties[DENSE_FIELD] = knn_vector(dim, engine, m, ef_construction)
    properties.update(bodies.document_properties())
    if serverless:
        properties[CONTENT_ID] = {"type": "keyword"}
        meta["document_ids"] = CONTENT_ID
    return {
        "settings": {"index": settings},
        "mappings": {"dynamic": "strict", "_meta": meta, "properties": properties},
    }


# ``_meta.dense_vectors`` of a SEISMIC index: its dense vectors are in ``<name>-dense``.
DENSE_SIBLING = "sibling index <name>-dense"


def knn_vector(dim: int, engine: str = "faiss", m: int = 16, ef_construction: int = 128) -> dict[str, Any]:
    """The dense field: HNSW with inner product on ``engine``."""
    return {
        "type": "knn_vector",
        "dimension": dim,
        "method": {
            "name": "hnsw",
            "space_type": "innerproduct",
            "engine": engine,
            "parameters": {"m": m, "ef_construction": ef_construction},
        },
    }


def dense_index_body(identity: IndexIdentity | None = None, *, engine: str = "faiss", shards: int = 1,
                     replicas: int = 0, m: int = 16, ef_construction: int = 128) -> dict[str, Any]:
    """The sibling of a SEISMIC index: the dense vectors (``index.knn``, k-NN's codec), with the
    path (filters) and URL (hits) of each document, under the same ids."""
    dim = identity.dense_dim if identity else 256
    return {
        "settings": {"index": {"number_of_shards": shards, "number_of_replicas": replicas, "knn": True}},
        "mappings": {
            "dynamic": "strict",
            "_meta": {**bodies.bundle_meta(identity, dim), "dense_vectors_of": "the SEISMIC index <name>"},
            "properties": {
                DENSE_FIELD: knn_vector(dim, engine, m, ef_construction),
                "path": {"type": "keyword"},
                "url": {"type": "keyword"},
                **narrowing.metadata_properties(),  # a dense search filters here
            },
        },
    }



# -- documents ---------------------------------------------------------------------------


def doc_source(doc: Document, top_terms: int = 20, types: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``_source`` stored for a document (escaped, float32, positive sparse weights, its
    metadata; ``types``: the user's fields the index knows)."""
    return source_from_document(doc, sparse=sendable_weights(doc.sparse), dense=checked_dense(doc),
                                top_terms=top_terms, types=types)


def bulk_index_actions(index: str, docs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """``opensearchpy.helpers`` actions: ``index`` by content-hash id (overwrites: retry-safe)."""
    return [{"_op_type": "index", "_index": index, "_id": doc_id, "_source": source} for doc_id, source in docs]


def bulk_delete_actions(index: str, ids: Iterable[str]) -> list[dict[str, Any]]:
    return [{"_op_type": "delete", "_index": index, "_id": i} for i in ids]


# Serverless: the server names each document; an action also carries the content hash under
# CONTENT_ID (opensearchpy.helpers.expand_action sends only the metadata keys it knows), so its
# answer is reported under the document's own id.

def bulk_create_actions(index: str, docs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """``index`` actions without ``_id`` (the source holds the content hash in CONTENT_ID)."""
    return [{"_op_type": "index", "_index": index, "_source": {**source, CONTENT_ID: doc_id}, CONTENT_ID: doc_id}
            for doc_id, source in docs]


def bulk_delete_stored(index: str, stored: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """``delete`` actions for (content hash, server id) pairs."""
    return [{"_op_type": "delete", "_index": index, "_id": server_id, CONTENT_ID: doc_id}
            for doc_id, server_id in stored]


def content_lookup_body(ids: Sequence[str], fields: Sequence[str] | bool) -> dict[str, Any]:
    """The stored documents with these content hashes (a few more than asked: a hash stored
    twice is found twice and removed with the other)."""
    return {"query": {"terms": {CONTENT_ID: list(ids)}}, "size": min(MAX_RESULT_WINDOW, 2 * len(ids) + 10),
            "_source": fields if isinstance(fields, bool) else list(fields), "track_total_hits": False}


def content_page_body(page: int, after: Sequence[Any] | None = None,
                      fields: Sequence[str] | None = None) -> dict[str, Any]:
    """One page of every document in content-hash order, through ``search_after`` (no scroll)."""
    body: dict[str, Any] = {"size": int(page), "query": {"match_all": {}}, "sort": [{CONTENT_ID: {"order": "asc"}}],
                            "track_total_hits": False}
    if fields is not None:
        body["_source"] = [*fields, CONTENT_ID]
    if after is not None:
        body["search_after"] = list(after)
    return body


def bulk_update_actions(index: str, updates: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Partial updates (``doc``: the fields that change), e.g. a document's paths."""
    return [{"_op_type": "update", "_index": index, "_id": doc_id, "doc": dict(fields)} for doc_id, fields in updates]


def bulk_update_stored(index: str, stored: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Serverless partial updates: (content hash, server id, the fields that change); the body
    goes under ``_source`` (expand_action would send the CONTENT_ID key in it otherwise)."""
    return [{"_op_type": "update", "_index": index, "_id": server_id, "_source": {"doc": dict(fields)},
             CONTENT_ID: doc_id}
            for doc_id, server_id, fields in stored]


def scan_body(page: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
    """First page of a scroll over every document (``_doc`` order); ``fields``: only these of ``_source``."""
    body: dict[str, Any] = {"size": int(page), "sort": ["_doc"], "query": {"match_all": {}}}
    if fields is not None:
        body["_source"] = list(fields)
    return body


# -- queries -----------------------------------------------------------------------------


def query_weights(query: SparseVector, max_clauses: int) -> dict[str, float]:
    """Escaped, float32, positive query weights, pruned to the largest ``max_clauses``."""
    return prune(sendable_weights(query), max_clauses)


def clause_budget(max_clauses: int, other_clauses: int = 0) -> int:
    """Terms a query may have: Lucene counts every leaf clause against ``max_clause_count``
    (filters included); :data:`CLAUSE_MARGIN` more stay free."""
    return max(1, int(max_clauses) - other_clauses - CLAUSE_MARGIN)


def sparse_query(
    query: SparseVector,
    *,
    max_clauses: int = DEFAULT_MAX_CLAUSES,
    filters: Filters = NO_FILTERS,
    neural_sparse: bool = False,
) -> dict[str, Any]:
    """``bool.should`` of ``rank_feature`` (or one ``neural_sparse`` with ``query_tokens``)."""
    filter_clauses, exclusions = filters.clauses(), filters.exclusions()
    weights = query_weights(query, clause_budget(max_clauses, filters.count()))
    if not weights:
        raise QueryError("the query has no terms with a positive weight")
    if neural_sparse:
        too_big = [w for w in weights.values() if w > NEURAL_SPARSE_MAX_WEIGHT]
        if too_big:
            raise QueryError(
                f"neural_sparse accepts token weights up to {NEURAL_SPARSE_MAX_WEIGHT:g}, "
                f"got {max(too_big):g}; use the rank_feature plan"
            )
        return bodies.filtered({"neural_sparse": {SPARSE_FIELD: {"query_tokens": weights}}}, filter_clauses,
                               exclusions)
    return bodies.should_query(bodies.rank_feature_clauses(weights), filter_clauses, exclusions)


def search_body(
    query: dict[str, Any], k: int, offset: int = 0, source: Sequence[str] = HIT_SOURCE
) -> dict[str, Any]:
    check_page(k, offset)
    return {
        "query": query,
        "size": k,
        "from": offset,
        "_source": list(source),
        "track_total_hits": False,
    }


def sparse_search_body(
    query: SparseVector,
    k: int,
    *,
    offset: int = 0,
    max_clauses: int = DEFAULT_MAX_CLAUSES,
    filters: Filters = NO_FILTERS,
    neural_sparse: bool = False,
) -> dict[str, Any]:
    q = sparse_query(query, max_clauses=max_clauses, filters=filters, neural_sparse=neural_sparse)
    return search_body(q, k, offset)


def two_phase_body(
    first: SparseVector,
    full: SparseVector,
    k: int,
    window: int,
    *,
    offset: int = 0,
    max_clauses: int = DEFAULT_MAX_CLAUSES,
    filters: Filters = NO_FILTERS,
) -> dict[str, Any]:
    """Retrieve with ``first``, rescore the top ``window`` with ``full``.

    ``query_weight: 0`` makes a rescored hit's score exactly the full query's score; the window
    covers the whole page, or hits past it would keep their first-phase scores. It stays within
    ``index.max_rescore_window`` (:data:`MAX_RESCORE_WINDOW`; the page itself is already kept
    within ``index.max_result_window``, which has the same default).
    """
    body = sparse_search_body(first, k, offset=offset, max_clauses=max_clauses, filters=filters)
    body["rescore"] = bodies.rescore(sparse_query(full, max_clauses=max_clauses),
                                     min(max(int(window), offset + k), MAX_RESCORE_WINDOW))
    return body


def knn_query(vector: np.ndarray, k: int, filters: Filters = NO_FILTERS) -> dict[str, Any]:
    vec = np.asarray(vector, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(vec)):
        raise QueryError("the dense query vector has NaN or infinite values")
    inner: dict[str, Any] = {"vector": [float(x) for x in vec], "k": int(k)}
    restriction = filters.as_query()
    if restriction is not None:
        inner["filter"] = restriction  # k-NN's efficient filtering: k hits that pass, when k exist
    return {"knn": {DENSE_FIELD: inner}}


def knn_search_body(
    vector: np.ndarray,
    k: int,
    *,
    offset: int = 0,
    filters: Filters = NO_FILTERS,
    source: Sequence[str] = HIT_SOURCE,
) -> dict[str, Any]:
    check_page(k, offset)
    return search_body(knn_query(vector, offset + k, filters), k, offset, source)


def hybrid_search_body(
    sparse: SparseVector,
    vector: np.ndarray,
    k: int,
    *,
    offset: int = 0,
    window: int | None = None,
    max_clauses: int = DEFAULT_MAX_CLAUSES,
    filters: Filters = NO_FILTERS,
    neural_sparse: bool = False,
    dialect: Dialect = NEWEST,
    sparse_clause: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``hybrid`` query (sparse, dense); fusion happens in the search pipeline.

    ``sparse_clause`` replaces the sparse sub-query (a SEISMIC index's :func:`seismic_query`).

    Both sub-queries collect ``depth = max(window, offset + k)`` candidates per shard on every
    page, so ``window`` matters on page 1 and pages 1 and 2 fuse the same pool. From 2.19 that
    is ``pagination_depth``; before, ``from: 0, size: depth`` and :func:`hybrid_page` cuts the
    page out (see :mod:`d2s_search.backends.opensearch.cluster`).
    """
    check_page(k, offset)
    depth = min(max(int(window or 0), offset + k), MAX_RESULT_WINDOW)
    queries = [
        # the k-NN sub-query is one more leaf clause
        sparse_clause or sparse_query(sparse, max_clauses=max_clauses - 1, filters=filters,
                                      neural_sparse=neural_sparse),
        knn_query(vector, depth, filters),
    ]
    hybrid: dict[str, Any] = {"queries": queries}
    if dialect.pagination_depth:
        hybrid["pagination_depth"] = depth  # bounded by index.max_result_window
        return search_body({"hybrid": hybrid}, k, offset)
    return search_body({"hybrid": hybrid}, depth, 0)


def hybrid_page(hits: Sequence[Any], k: int, offset: int, dialect: Dialect = NEWEST) -> list[Any]:
    """The page of a hybrid answer: clusters before 2.19 returned the whole candidate pool."""
    return list(hits) if dialect.pagination_depth else list(hits)[offset : offset + k]


def seismic_query(ids: Mapping[str, float], k: int, *, top_n: int = 10, heap_factor: float = 1.0,
                  filters: Filters = NO_FILTERS) -> dict[str, Any]:
    """``neural_sparse`` on a SEISMIC ``sparse_vector`` field: ``query_tokens`` keyed by
    vocabulary id, ``method_parameters`` from neural-search 3.3.0.0
    ``sparse/query/SparseAnnQueryBuilder.java``: ``top_n`` query tokens kept (default 10),
    ``k`` hits per shard (default 10), ``heap_factor`` (recall vs speed, default 1.0), ``filter``."""
    if not ids:
        raise QueryError("the query has no terms with a positive weight")
    if filters.words:
        raise QueryError("a SEISMIC index cannot require or exclude words (+word, -word): it keeps "
                         "8-bit weights by vocabulary id; search without them")
    params: dict[str, Any] = {"top_n": int(top_n), "k": int(k), "heap_factor": float(heap_factor)}
    restriction = filters.as_query()
    if restriction is not None:
        params["filter"] = restriction  # applied while the k hits are collected
    return {"neural_sparse": {SPARSE_FIELD: {"query_tokens": dict(ids), "method_parameters": params}}}


def seismic_search_body(ids: Mapping[str, float], k: int, *, offset: int = 0, top_n: int = 10,
                        heap_factor: float = 1.0, filters: Filters = NO_FILTERS) -> dict[str, Any]:
    check_page(k, offset)
    return search_body(seismic_query(ids, offset + k, top_n=top_n, heap_factor=heap_factor, filters=filters),
                       k, offset)


# -- search pipelines --------------------------------------------------------------------


def minmax_pipeline_body(weights: tuple[float, float] = (0.5, 0.5)) -> dict[str, Any]:
    """Min-max normalisation, then a weighted mean.

    The dense run's scores are k-NN scores, not inner products: ``1 + ip`` for ``ip >= 0`` and
    ``1 / (1 - ip)`` below (k-NN ``SpaceType.INNER_PRODUCT``). That map is monotonic, so ranks
    (and RRF) are unaffected, but it is not linear for negative inner products: min-max over it
    squeezes the negative range, so a candidate pool with negative inner products is fused on
    a different scale than the plain inner products (``Hit.parts`` reports the exact ones).
    """
    ws, wd = fusion_weights(weights)
    return {
        "description": "d2s-search hybrid: min-max normalised sparse and dense scores, "
        "weighted arithmetic mean (weights: sparse, dense)",
        "phase_results_processors": [
            {
                "normalization-processor": {
                    "normalization": {"technique": "min_max"},
                    "combination": {
                        "technique": "arithmetic_mean",
                        "parameters": {"weights": [ws, wd]},
                    },
                }
            }
        ],
    }


def rrf_pipeline_body(rank_constant: int = 60, dialect: Dialect = NEWEST) -> dict[str, Any]:
    """Reciprocal rank fusion; where ``rank_constant`` goes depends on the version (cluster.py)."""
    if rank_constant < 1:
        raise QueryError("the RRF rank constant must be at least 1")
    if not dialect.rrf:
        raise QueryError("RRF fusion needs OpenSearch 2.19 or later; use min_max")
    combination: dict[str, Any] = {"technique": "rrf"}
    if dialect.rrf_rank_constant_top_level:
        combination["rank_constant"] = rank_constant
    else:
        combination["parameters"] = {"rank_constant": rank_constant}
    return {
        "description": "d2s-search hybrid: reciprocal rank fusion of the sparse and dense runs",
        "phase_results_processors": [{"score-ranker-processor": {"combination": combination}}],
    }


def pipeline_name(method: str, weights: tuple[float, float] = (0.5, 0.5), rank_constant: int = 60) -> str:
    """A stable name per fusion setting, so a pipeline is created once and reused."""
    if method == "rrf":
        return PIPELINE_RRF if rank_constant == 60 else f"{PIPELINE_RRF}-k{rank_constant}"
    if method != "min_max":
        raise QueryError(f"unknown fusion {method!r} (use min_max or rrf)")
    ws, wd = fusion_weights(weights)
    if (ws, wd) == (0.5, 0.5):
        return PIPELINE_MINMAX
    return f"{PIPELINE_MINMAX}-{ws:.4f}-{wd:.4f}"


def pipeline_body(method: str, weights: tuple[float, float] = (0.5, 0.5), rank_constant: int = 60,
                  dialect: Dialect = NEWEST) -> dict[str, Any]:
    if method == "rrf":
        return rrf_pipeline_body(rank_constant, dialect)
    pipeline_name(method, weights)  # validates the method
    return minmax_pipeline_body(weights)


def fusion_weights(weights: tuple[float, float]) -> tuple[float, float]:
    ws, wd = (float(w) for w in weights)
    if not (math.isfinite(ws) and math.isfinite(wd)) or ws < 0 or wd < 0 or ws + wd <= 0:
        raise QueryError("fusion weights must be non-negative and not both zero")
    # The normalization processor wants weights summing to 1.
    total = ws + wd
    return round(ws / total, 4), round(1.0 - round(ws / total, 4), 4)


# -- reindex and aliases -----------------------------------------------------------------


def clone(body: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(body)
