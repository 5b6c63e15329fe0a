"""register-model's REST flow and server-side search, against a local ml-commons fake over osmem.

Each flow's requests are recorded and every JSON body is validated against the OpenSearch API
specification (strict). Server-side results are compared with the client-side sparse plan
on the same index: the model in the zip must rank and score exactly like d2s-search itself.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
from d2s_dash_corpus import QUERY_TERMS, TEXTS, client_query
from d2s_dash_fake_cluster import LOCAL_FILE, VIA_URL
from d2s_dash_wire import validate_recorded

from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.backends.opensearch.client import OpenSearchHTTP
from d2s_search.backends.opensearch.ml_commons import (
    MLCommons,
    MLCommonsError,
    MLCommonsUnavailable,
    chunk_count,
)
from d2s_search.backends.opensearch.server_side import (
    run_server_side,
    server_side_query,
    template_query,
)
from d2s_search.errors import BackendUnavailableError


def backend_on(cluster, tiny_bundle, documents) -> OpenSearchBackend:
    b = OpenSearchBackend(cluster.url, index_name="d2s-ml", sleep=lambda s: None)
    b.open(tiny_bundle.identity())
    b.upsert(documents)
    return b


def ml_on(cluster, **options) -> MLCommons:
    options.setdefault("poll_interval", 0.0)
    options.setdefault("chunk_bytes", 2_000_000)
    return MLCommons(OpenSearchHTTP(cluster.url, sleep=lambda s: None), **options)


def test_register_deploy_and_search_server_side(spec, cluster, package, tiny_bundle, encoder, documents):
    steps: list[str] = []
    ml = ml_on(cluster, progress=steps.append)
    reg = ml.register(package)
    assert reg.state == "DEPLOYED" and not reg.reused
    assert reg.chunks == chunk_count(package.size, 2_000_000) >= 4
    model = cluster.models[reg.model_id]
    assert b"".join(model.chunks[i] for i in sorted(model.chunks)) == package.path.read_bytes()
    assert model.meta["name"] == package.name and model.meta["function_name"] == "SPARSE_ENCODING"
    assert any("uploading chunk 1/" in s for s in steps) and any("deploy" in s for s in steps)

    # Registering the same bundle again reuses the deployed model: nothing is uploaded.
    before = len([r for r in cluster.requests if r.path.endswith("/_register_meta")])
    again = ml.register(package)
    assert again.reused and again.model_id == reg.model_id and again.chunks == 0
    assert len([r for r in cluster.requests if r.path.endswith("/_register_meta")]) == before

    backend = backend_on(cluster, tiny_bundle, documents)
    for text in TEXTS:
        server = server_side_query(backend, text, reg.model_id, k=8, explain=5)
        client = backend.sparse_search(client_query(encoder, package, text), 8, explain=5)
        assert [h.id for h in server] == [h.id for h in client], text
        assert [h.score for h in server] == [h.score for h in client]
        assert [h.matched for h in server] == [h.matched for h in client]
        assert all(h.url and h.url.startswith("http://127.0.0.1:8765/") for h in server)
    filtered = server_side_query(backend, TEXTS[0], reg.model_id, k=20, path_prefix=str(documents[1].path.rsplit("/", 1)[0]))
    assert filtered and all("/a/" in h.path for h in filtered)

    result = run_server_side(backend, TEXTS[0], k=5, bundle=tiny_bundle)  # finds the model by name
    assert result.mode == "server-side (neural_sparse)" and len(result.hits) == 5 and result.query_terms

    checked = validate_recorded(spec, cluster.requests)
    assert {
        ("POST", "/_plugins/_ml/model_groups/_register"), ("POST", "/_plugins/_ml/models/_register_meta"),
        ("POST", "/_plugins/_ml/models/_search"), ("POST", "/_plugins/_ml/_predict/{algorithm_name}/{model_id}"),
        ("POST", "/{index}/_search"), ("POST", "/_bulk"), ("PUT", "/{index}"),
    } <= checked.validated
    assert {("POST", "/_plugins/_ml/models/{model_id}/_deploy"), ("GET", "/_plugins/_ml/tasks/{task_id}"),
            ("GET", "/_plugins/_ml/models/{model_id}")} <= checked.without_body
    # The one body the spec cannot describe: raw zip bytes (the spec says JSON {"chunk": ...}).
    assert checked.raw == {("POST", "/_plugins/_ml/models/{model_id}/upload_chunk/{chunk_number}")}


def test_template_fallback_without_ml_commons(spec, make_cluster, package, tiny_bundle, encoder, documents):
    cluster = make_cluster(ml_enabled=False)
    ml = ml_on(cluster)
    with pytest.raises(MLCommonsUnavailable, match="no ml-commons plugin"):
        ml.register(package)
    assert ml.store_search_template() == "d2s-sparse"
    backend = backend_on(cluster, tiny_bundle, documents)
    for text in TEXTS:
        query = encoder.to_terms(encoder.encode_texts([text]).sparse[0], top_k=QUERY_TERMS)
        via_template = template_query(backend, query, k=8, explain=5)
        client = backend.sparse_search(query, 8, explain=5)
        assert [(h.id, h.score, h.matched) for h in via_template] == [(h.id, h.score, h.matched) for h in client]
    page2 = template_query(backend, query, k=4, offset=4, explain=0)
    assert [h.id for h in page2] == [h.id for h in client[4:8]] and all(not h.matched for h in page2)
    prefix = documents[1].path.rsplit("/", 1)[0]
    assert all("/a/" in h.path for h in template_query(backend, query, k=20, path_prefix=prefix))

    result = run_server_side(backend, TEXTS[0], k=5, bundle=tiny_bundle, encoder_factory=lambda: encoder,
                             max_terms=QUERY_TERMS)
    assert result.mode == "server-side (search template)" and len(result.hits) == 5
    checked = validate_recorded(spec, cluster.requests)
    assert {("PUT", "/_scripts/{id}"), ("POST", "/{index}/_search/template")} <= checked.validated


def test_missing_template_is_explained(make_cluster, tiny_bundle, documents):
    cluster = make_cluster(ml_enabled=False)
    backend = backend_on(cluster, tiny_bundle, documents)
    with pytest.raises(Exception, match="register-model --template-only"):
        template_query(backend, {"dog": 1.0}, k=3)


def test_uploads_need_a_setting_that_configure_cluster_sets(spec, make_cluster, package):
    cluster = make_cluster(settings={})
    ml = ml_on(cluster)
    with pytest.raises(MLCommonsError, match="--configure-cluster") as err:
        ml.register(package)
    assert "\n" not in str(err.value)
    ml.configure_cluster()
    assert cluster.settings[LOCAL_FILE] is True and cluster.settings["plugins.ml_commons.only_run_on_ml_node"] is False
    assert ml.register(package).state == "DEPLOYED"
    validate_recorded(spec, cluster.requests)


def test_register_from_a_url(spec, make_cluster, package):
    cluster = make_cluster(settings={VIA_URL: True})
    cluster.files["model.zip"] = package.path.read_bytes()
    reg = ml_on(cluster).register(package, model_url=f"{cluster.url}/files/model.zip")
    assert reg.state == "DEPLOYED" and reg.chunks == 0
    register = [r for r in cluster.requests if r.path == "/_plugins/_ml/models/_register"]
    assert json.loads(register[0].body)["url"].endswith("/files/model.zip")
    checked = validate_recorded(spec, cluster.requests)
    assert ("POST", "/_plugins/_ml/models/_register") in checked.validated


def test_a_failed_deploy_reports_the_task_error(cluster, package):
    wrong = dataclasses.replace(package, sha256="0" * 64)
    with pytest.raises(MLCommonsError, match="model content changed") as err:
        ml_on(cluster).register(wrong)
    assert "run register-model again" in str(err.value)


def test_waiting_has_a_deadline(make_cluster, package):
    cluster = make_cluster(settings={LOCAL_FILE: True}, task_polls=10**9)
    ticks = itertools.count(0, 5.0)
    ml = ml_on(cluster, timeout=30.0, clock=lambda: next(ticks), sleep=lambda s: None)
    with pytest.raises(MLCommonsError, match=r"timed out after 30s waiting to deploy the model \(last state RUNNING\)"):
        ml.register(package)


def test_model_group_is_created_once(cluster):
    ml = ml_on(cluster)
    assert ml.ensure_model_group() == ml.ensure_model_group()
    assert len(cluster.groups) == 1


def test_credentials_reach_the_cluster(make_cluster, package):
    cluster = make_cluster(settings={LOCAL_FILE: True}, auth=("admin", "Adm1n!pass"))
    http = OpenSearchHTTP(cluster.url, user="admin", password="Adm1n!pass", sleep=lambda s: None)
    reg = MLCommons(http, poll_interval=0, chunk_bytes=4_000_000).register(package)
    assert reg.state == "DEPLOYED"
    assert all(r.headers.get("authorization", "").startswith("Basic ") for r in cluster.requests)


def test_unknown_model_in_server_side_query(cluster, tiny_bundle, documents):
    backend = backend_on(cluster, tiny_bundle, documents)
    with pytest.raises(Exception, match="not deployed|Failed to find|not ready"):
        server_side_query(backend, "a dog", "no-such-model", k=3, explain=0)
    assert np.isfinite(len(documents))


def test_a_model_with_plain_input_names_ends_deploy_failed(make_cluster, tiny_bundle, package, tmp_path):
    """What happened before the graph inputs were renamed: DJL feeds input1.* by name."""
    import hashlib
    import zipfile

    with open(tiny_bundle.path / "text.onnx", "rb") as fh:
        plain = fh.read()
    path = tmp_path / "plain.zip"
    with zipfile.ZipFile(path, "w") as zf, zipfile.ZipFile(package.path) as good:
        zf.writestr("model.onnx", plain)
        zf.writestr("tokenizer.json", good.read("tokenizer.json"))
    data = path.read_bytes()
    plain_pkg = dataclasses.replace(package, path=path, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                                    name=package.name + "-plain")
    cluster = make_cluster(settings={LOCAL_FILE: True})
    with pytest.raises(MLCommonsError, match="Invalid input tensor name: input1.input_ids"):
        ml_on(cluster).register(plain_pkg)
    assert [m.state for m in cluster.models.values()] == ["DEPLOY_FAILED"]


def test_heap_breaker_hint_names_the_heap_not_native_memory(make_cluster, package):
    cluster = make_cluster(settings={LOCAL_FILE: True}, heap_used_percent=91)
    # CircuitBreakingException is a 429: retried, then reported with the hint
    with pytest.raises(BackendUnavailableError, match="Memory Circuit Breaker is open") as err:
        ml_on(cluster).register(package)
    message = str(err.value)
    assert "plugins.ml_commons.jvm_heap_memory_threshold" in message and "OPENSEARCH_HEAP" in message
    assert "native_memory_threshold" not in message
    # the native breaker keeps its own hint
    from d2s_search.backends.opensearch.ml_commons import _hint

    assert "native_memory_threshold" in _hint("Native Memory Circuit Breaker is open, please check your resources!")


def test_403_on_settings_assumes_1024_clauses(make_cluster, tiny_bundle, documents, encoder):
    cluster = make_cluster(forbidden={"/_cluster/settings": "cluster:monitor/settings"})
    backend = backend_on(cluster, tiny_bundle, documents)
    assert backend.max_clauses() == 1024
    query = encoder.to_terms(encoder.encode_texts([TEXTS[0]]).sparse[0], top_k=QUERY_TERMS)
    assert len(backend.sparse_search(query, 5)) == 5
    assert any(r.path == "/_cluster/settings" for r in cluster.requests)  # it was asked, and refused


def test_403_on_model_lookup_falls_back_to_the_template(make_cluster, tiny_bundle, encoder, documents):
    cluster = make_cluster(forbidden={"/_plugins/_ml/.*": "cluster:admin/opensearch/ml/models/search"})
    backend = backend_on(cluster, tiny_bundle, documents)
    ml_on(cluster).store_search_template()
    result = run_server_side(backend, TEXTS[0], k=5, bundle=tiny_bundle, encoder_factory=lambda: encoder,
                             max_terms=QUERY_TERMS)
    assert result.mode == "server-side (search template)" and len(result.hits) == 5
    assert any(r.path == "/_plugins/_ml/models/_search" for r in cluster.requests)


def test_disk_breaker_hint_names_the_free_space_threshold(make_cluster, package):
    cluster = make_cluster(settings={LOCAL_FILE: True}, disk_free_bytes=3 * 1024**3)
    with pytest.raises(BackendUnavailableError, match="Disk Circuit Breaker is open") as err:
        ml_on(cluster).register(package)
    message = str(err.value)
    assert "plugins.ml_commons.disk_free_space_threshold" in message and "5 GB" in message
    assert "OPENSEARCH_HEAP" not in message and "\n" not in message
