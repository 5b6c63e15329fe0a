"""``doctor`` against the ml-commons fake cluster: plugins, versions, ml-commons settings, heap, 403;
plans on 3.3 with k-NN and neural-search (SEISMIC sparse-only), across plugin releases, and on
Amazon OpenSearch Serverless (the fake in its Serverless mode)."""

from __future__ import annotations

import pytest

from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.backends.opensearch.doctor import OK, WARN, diagnose
from d2s_search.backends.opensearch.ml_commons import MLCommons


def checks(cluster, identity=None):
    b = OpenSearchBackend(cluster.url, index_name="d2s-doc", sleep=lambda s: None)
    try:
        return {c.name: c for c in diagnose(b, identity).checks}
    finally:
        b.close()


def test_full_cluster_on_2_19(make_cluster):
    by = checks(make_cluster(version="2.19.1", heap_max_bytes=4 * 1024**3))
    assert by["version"].detail == "OpenSearch 2.19.1" and by["plugins"].status == OK
    plans = by["plans"].data["plans"]
    assert all(plans[p] for p in ("dense", "hybrid min-max", "hybrid rrf", "neural_sparse", "server-side model"))
    assert not plans["sparse_vector (SEISMIC)"]
    assert by["request bodies"].detail.startswith("hybrid: pagination_depth; rrf: combination.parameters.rank_constant")
    # ml-commons defaults on a single node: no ML node, no uploads
    ml = by["ml-commons"]
    assert ml.status == WARN and "only_run_on_ml_node=true" in ml.detail and "uploads not allowed" in ml.detail


def test_ml_settings_after_configure_cluster_and_heap(make_cluster):
    cluster = make_cluster(version="3.1.0", heap_max_bytes=1024**3, heap_used_percent=90)
    MLCommons(OpenSearchBackend(cluster.url, sleep=lambda s: None).http).configure_cluster()
    by = checks(cluster)
    ml = by["ml-commons"]
    assert "only_run_on_ml_node=false" in ml.detail and "uploads not allowed" not in ml.detail
    assert "OPENSEARCH_HEAP=2g" in ml.detail and "over jvm_heap_memory_threshold (85%)" in ml.detail
    assert by["request bodies"].detail.startswith("hybrid: pagination_depth; rrf: combination.rank_constant")


def test_old_cluster_gets_old_bodies_and_no_rrf(make_cluster):
    by = checks(make_cluster(version="2.11.1", ml_enabled=False))
    assert not by["plans"].data["plans"]["hybrid rrf"] and by["plans"].data["plans"]["hybrid min-max"]
    assert "from 0, size = window" in by["request bodies"].detail and "not available before 2.19" in by["request bodies"].detail
    assert by["ml-commons"].status == "skip"


def test_403_on_settings_is_a_warning_not_a_failure(make_cluster):
    by = checks(make_cluster(forbidden={"/_cluster/settings": "cluster:monitor/settings"}))
    assert by["max_clause_count"].status == WARN and "assuming 1024" in by["max_clause_count"].detail
    assert by["ml-commons"].status == "skip"


def test_3_3_with_knn_and_neural_search_lists_seismic_as_sparse_only(make_cluster):
    by = checks(make_cluster(version="3.3.0", heap_max_bytes=4 * 1024**3))
    plans = by["plans"].data["plans"]
    assert all(plans[p] for p in ("dense", "dense (lucene engine)", "hybrid min-max", "hybrid rrf", "neural_sparse",
                                  "server-side model", "sparse_vector (SEISMIC)"))
    detail = by["plans"].detail
    assert "SEISMIC keeps only sparse vectors" in detail and "dense in <index>-dense, hybrid fused here" in detail


@pytest.mark.parametrize(("version", "lucene", "tokens"), [
    ("2.11.1", False, False), ("2.12.0", False, False), ("2.13.0", True, False), ("2.14.0", True, True),
])
def test_plans_follow_the_plugin_releases(make_cluster, version, lucene, tokens):
    plans = checks(make_cluster(version=version, ml_enabled=False))["plans"].data["plans"]
    assert plans["dense (lucene engine)"] is lucene and plans["neural_sparse"] is tokens
    assert plans["dense"] and not plans["sparse_vector (SEISMIC)"]


def test_serverless_lists_what_a_vector_search_collection_offers(make_cluster, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    cluster = make_cluster(serverless=True)
    b = OpenSearchBackend(cluster.url, index_name="d2s-doc", sleep=lambda s: None, aws_service="aoss",
                          aws_region="eu-west-1")
    try:
        by = {c.name: c for c in diagnose(b).checks}
    finally:
        b.close()
    assert by["reachable"].status == OK and by["distribution"].detail == "Amazon OpenSearch Serverless"
    plans = by["plans"].data["plans"]
    assert plans["hybrid min-max"] and plans["dense"] and plans["neural_sparse"]
    assert not plans["hybrid rrf"] and not plans["server-side model"] and not plans["sparse_vector (SEISMIC)"]
    assert "content_id" in by["serverless"].detail and "no _refresh" in by["serverless"].detail
    assert all(r.headers.get("authorization", "").startswith("AWS4-HMAC-SHA256") for r in cluster.requests)


def test_a_node_short_of_disk_is_a_warning_before_ml_commons_refuses(make_cluster):
    ml = checks(make_cluster(heap_max_bytes=4 * 1024**3, disk_free_bytes=3 * 1024**3))["ml-commons"]
    assert ml.status == WARN and "disk_free=3.0 GiB" in ml.detail
    assert "under disk_free_space_threshold (5 GiB)" in ml.detail
    roomy = checks(make_cluster(heap_max_bytes=4 * 1024**3))["ml-commons"]
    assert "disk_free_space_threshold (" not in roomy.detail and "disk_free=50.0 GiB" in roomy.detail
