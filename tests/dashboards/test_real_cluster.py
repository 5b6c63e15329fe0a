"""The same flows against a real cluster: ``pytest -m opensearch tests/dashboards``.

* D2S_DASHBOARDS_URL (+ D2S_DASHBOARDS_USER/_PASSWORD or D2S_OPENSEARCH_USER/_PASSWORD):
  imports the saved objects and reads them back.
* D2S_OPENSEARCH_URL (+ the usual D2S_OPENSEARCH_* credentials and CA file): registers and
  deploys the tiny bundle's encoder with ml-commons, then checks neural_sparse and the search
  template against the client-side sparse plan, in a throw-away index. Cluster settings are
  changed only with D2S_TEST_CONFIGURE_CLUSTER=1 (they are persistent); the model is
  undeployed and deleted afterwards.

Each group is skipped, with the reason, when its URL is not set.
"""

from __future__ import annotations

import os
import uuid

import pytest
from d2s_dash_corpus import TEXTS, client_query

from d2s_search.backends.opensearch import dashboards_objects as so
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.backends.opensearch.dashboards import DashboardsClient, install, load_objects
from d2s_search.backends.opensearch.ml_commons import (
    ML,
    MLCommons,
    MLCommonsError,
    MLCommonsUnavailable,
)
from d2s_search.backends.opensearch.server_side import server_side_query, template_query

# Read at import: tests/conftest.py clears D2S_* variables around every test.
ENV = {k: v for k, v in os.environ.items() if k.startswith("D2S_")}

needs_dashboards = pytest.mark.skipif(
    not ENV.get("D2S_DASHBOARDS_URL"),
    reason="D2S_DASHBOARDS_URL is not set: no real OpenSearch Dashboards to test against",
)
needs_opensearch = pytest.mark.skipif(
    not ENV.get("D2S_OPENSEARCH_URL"),
    reason="D2S_OPENSEARCH_URL is not set: no real OpenSearch cluster to test against",
)
pytestmark = pytest.mark.opensearch


@needs_dashboards
def test_install_into_real_dashboards():
    index = ENV.get("D2S_OPENSEARCH_INDEX", "d2s")
    with DashboardsClient.from_env(env=ENV) as client:
        result = install(client, load_objects(index_name=index))
        assert {(o["type"], o["id"]) for o in result.imported} == {(o["type"], o["id"]) for o in so.saved_objects()}
        for obj in so.saved_objects(index):
            resp = client._client.get(f"/api/saved_objects/{obj['type']}/{obj['id']}")
            assert resp.status_code == 200, resp.text
            assert resp.json()["attributes"]["title"] == obj["attributes"]["title"]
        # importing again replaces them (overwrite) instead of failing with conflicts
        install(client, load_objects(index_name=index))


@needs_opensearch
def test_register_deploy_and_search_on_a_real_cluster(package, tiny_bundle, encoder, documents):
    backend = OpenSearchBackend.from_env(env={k: v for k, v in ENV.items() if k != "D2S_OPENSEARCH_INDEX"},
                                         index_name=f"d2s-pytest-{uuid.uuid4().hex[:8]}")
    ml = MLCommons(backend.http, poll_interval=2.0, timeout=600.0)
    model_id = None
    try:
        if ENV.get("D2S_TEST_CONFIGURE_CLUSTER") == "1":
            ml.configure_cluster()
        try:
            reg = ml.register(package)
        except MLCommonsUnavailable as exc:
            pytest.skip(f"the cluster has no ml-commons: {exc}")
        except MLCommonsError as exc:
            if "--configure-cluster" in str(exc):
                pytest.skip(f"{exc} -- set D2S_TEST_CONFIGURE_CLUSTER=1 to let the test change it")
            raise
        model_id = reg.model_id
        assert reg.state in ("DEPLOYED", "PARTIALLY_DEPLOYED")
        backend.open(tiny_bundle.identity())
        backend.upsert(documents)
        for text in TEXTS:
            tokens = ml.predict(model_id, [text])[0]
            want = client_query(encoder, package, text)
            assert tokens.keys() == want.keys()
            assert max(abs(tokens[t] - want[t]) for t in want) < 1e-5
            server = server_side_query(backend, text, model_id, k=8)
            client = backend.sparse_search(want, 8)
            assert [h.id for h in server] == [h.id for h in client]
        ml.store_search_template()
        query = client_query(encoder, package, TEXTS[0])
        assert [h.id for h in template_query(backend, query, k=8)] == [h.id for h in backend.sparse_search(query, 8)]
    finally:
        if backend.exists():
            backend.drop()
        if model_id:
            backend.http.request("POST", f"{ML}/models/{model_id}/_undeploy")
            backend.http.request("DELETE", f"{ML}/models/{model_id}")
        backend.close()
