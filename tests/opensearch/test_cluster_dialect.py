"""Request shapes chosen by cluster version (hybrid depth, RRF rank constant, rescore window,
clause budget), checked against what neural-search does with them at its release tags.

``fuse`` below is a reference of neural-search's hybrid flow on one shard, written from
opensearch-project/neural-search 2.19.1.0 ``search/query/HybridCollectorManager.java``
(``getSubqueryResultsRetrievalSize``: each sub-query keeps ``pagination_depth`` hits, else
``size``; ``from > 0`` without it is refused) and ``processor/.../RRFNormalizationTechnique``
(score ``1 / (rank_constant + rank)``, ranks from 1, summed by the combination).
"""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.cluster import (
    DISTRIBUTION_AWS,
    DISTRIBUTION_OPENSEARCH,
    DISTRIBUTION_SERVERLESS,
    NEWEST,
    Dialect,
    cluster_info,
    parse_version,
)
from d2s_search.errors import QueryError

V211, V219, V30, V31 = (Dialect.of(v) for v in ("2.11.1", "2.19.1", "3.0.0", "3.1.0"))
QUERY = {"dog": 1.0, "car": 0.5}
VEC = np.ones(4, dtype=np.float32)


def test_versions_parse():
    assert parse_version("2.19.1") == (2, 19, 1) and parse_version("3.0.0-beta1") == (3, 0, 0)
    assert parse_version("3.1") == (3, 1, 0) and parse_version("") is None
    assert Dialect.of(None).version == NEWEST
    assert (V211.pagination_depth, V219.pagination_depth, V31.pagination_depth) == (False, True, True)
    assert (V211.rrf, V219.rrf) == (False, True)
    assert (V219.rrf_rank_constant_top_level, V30.rrf_rank_constant_top_level, V31.rrf_rank_constant_top_level) == (
        False, False, True)
    assert (V31.sparse_vector, Dialect.of("3.3.0").sparse_vector) == (False, True)


def test_cluster_info_reads_root_and_host():
    root = {"cluster_name": "c", "version": {"distribution": "opensearch", "number": "2.19.1"}}
    info = cluster_info(root, "https://localhost:9200")
    assert info.version == (2, 19, 1) and info.distribution == DISTRIBUTION_OPENSEARCH
    assert cluster_info(root, "https://search-x-abc.eu-west-1.es.amazonaws.com").distribution == DISTRIBUTION_AWS
    aoss = cluster_info(None, "https://abc123.us-east-1.aoss.amazonaws.com")
    assert aoss.distribution == DISTRIBUTION_SERVERLESS and aoss.dialect.version == NEWEST
    compat = cluster_info({"version": {"number": "7.10.2", "distribution": "opensearch"}}, "https://h:9200")
    assert compat.version is None and compat.extra["compatibility_mode"]


# -- hybrid depth ------------------------------------------------------------------------------

def test_hybrid_body_depth_by_version():
    for dialect in (V219, V30, V31):
        page1 = q.hybrid_search_body(QUERY, VEC, 10, window=100, dialect=dialect)
        assert page1["query"]["hybrid"]["pagination_depth"] == 100 and (page1["from"], page1["size"]) == (0, 10)
        page3 = q.hybrid_search_body(QUERY, VEC, 10, offset=20, dialect=dialect)
        assert page3["query"]["hybrid"]["pagination_depth"] == 30 and (page3["from"], page3["size"]) == (20, 10)
    old = q.hybrid_search_body(QUERY, VEC, 10, offset=20, window=100, dialect=V211)
    assert "pagination_depth" not in old["query"]["hybrid"] and (old["from"], old["size"]) == (0, 100)
    assert old["query"]["hybrid"]["queries"][1]["knn"]["dense"]["k"] == 100
    assert q.hybrid_page(list(range(100)), 10, 20, V211) == list(range(20, 30))
    assert q.hybrid_page(list(range(10)), 10, 20, V219) == list(range(10))
    capped = q.hybrid_search_body(QUERY, VEC, 10, window=50_000, dialect=V31)
    assert capped["query"]["hybrid"]["pagination_depth"] == q.MAX_RESULT_WINDOW


def fuse(body: dict, runs: list[list[str]], rank_constant: int = 60) -> list[str]:
    """neural-search's hybrid query + RRF on one shard (see the module docstring)."""
    hybrid = body["query"]["hybrid"]
    depth = hybrid.get("pagination_depth")
    if depth is None and body["from"] > 0:
        raise ValueError("pagination_depth param is missing in the search request")
    keep = depth if depth is not None else body["size"]
    scores: dict[str, float] = {}
    for run in runs:
        for rank, doc in enumerate(run[:keep], start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (rank_constant + rank)
    fused = sorted(scores, key=lambda d: (-scores[d], d))
    return fused[body["from"] : body["from"] + body["size"]]


def test_pages_fuse_one_pool_and_window_counts_on_page_one():
    rng = np.random.default_rng(7)
    docs = [f"d{i:03d}" for i in range(300)]
    runs = [list(rng.permutation(docs)), list(rng.permutation(docs))]
    k, window = 10, 100
    for dialect in (V211, V219, V31):
        pages = []
        for page in range(3):
            body = q.hybrid_search_body(QUERY, VEC, k, offset=page * k, window=window, dialect=dialect)
            pages += q.hybrid_page(fuse(body, runs), k, page * k, dialect)
        # the reference: fuse the top `window` of each run once, then page through it
        scores: dict[str, float] = {}
        for run in runs:
            for rank, doc in enumerate(run[:window], start=1):
                scores[doc] = scores.get(doc, 0.0) + 1.0 / (60 + rank)
        want = sorted(scores, key=lambda d: (-scores[d], d))[: 3 * k]
        assert pages == want, dialect
        assert len(set(pages)) == len(pages)  # no overlaps between pages
    # what the old body did: page 1 fused only `size` hits per run, ignoring the window
    old = {"query": {"hybrid": {"queries": []}}, "from": 0, "size": k}
    assert fuse(old, runs) != pages[:k]


# -- RRF --------------------------------------------------------------------------------------

def test_rrf_rank_constant_placement_by_version():
    def combination(d):
        return q.rrf_pipeline_body(20, d)["phase_results_processors"][0]["score-ranker-processor"]["combination"]

    assert combination(V219) == {"technique": "rrf", "parameters": {"rank_constant": 20}}
    assert combination(V30) == {"technique": "rrf", "parameters": {"rank_constant": 20}}
    assert combination(V31) == {"technique": "rrf", "rank_constant": 20}
    assert combination(NEWEST_DIALECT := Dialect()) == combination(V31) and NEWEST_DIALECT.rrf
    with pytest.raises(QueryError, match="2.19"):
        q.rrf_pipeline_body(60, V211)
    assert q.pipeline_body("min_max", (0.3, 0.7), 60, V211) == q.minmax_pipeline_body((0.3, 0.7))


# -- rescore window and clause budget -------------------------------------------------------

def test_rescore_window_stays_within_max_rescore_window():
    body = q.two_phase_body({"dog": 1.0}, QUERY, 10, 50_000)
    assert body["rescore"]["window_size"] == q.MAX_RESCORE_WINDOW
    assert q.two_phase_body({"dog": 1.0}, QUERY, 10, 100, offset=500)["rescore"]["window_size"] == 510
    assert q.MAX_RESCORE_WINDOW <= q.MAX_RESULT_WINDOW  # so a page never outgrows the window
    with pytest.raises(QueryError, match="cannot page past 10000"):
        q.two_phase_body({"dog": 1.0}, QUERY, 10, 100, offset=q.MAX_RESCORE_WINDOW)


def test_clause_budget_keeps_a_margin():
    many = {f"t{i:04d}": 1.0 + i for i in range(2000)}
    plain = q.sparse_query(many, max_clauses=1024)["bool"]["should"]
    assert len(plain) == 1024 - q.CLAUSE_MARGIN
    filtered = q.sparse_query(many, max_clauses=1024, filters=q.Filters("a/"))["bool"]
    assert len(filtered["should"]) + len(filtered["filter"]) == 1024 - q.CLAUSE_MARGIN
    hybrid = q.hybrid_search_body(many, VEC, 5)["query"]["hybrid"]["queries"]
    assert len(hybrid[0]["bool"]["should"]) + 1 == 1024 - q.CLAUSE_MARGIN  # + the k-NN clause
    # the strongest terms are the ones kept
    assert min(c["rank_feature"]["boost"] for c in plain) == 1.0 + 2000 - len(plain)
