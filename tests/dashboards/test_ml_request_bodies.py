"""Every ml-commons, search-template and server-side body d2s-search builds, validated against the
OpenSearch API specification (strict), plus negative controls. What the spec does not cover:
the raw bytes of ``upload_chunk`` (the spec describes a JSON ``{"chunk": ...}`` body, ml-commons
reads the request bytes) and the Dashboards saved-objects API (not an OpenSearch API)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from d2s_dash_mustache import render

from d2s_search.backends.opensearch import ml_commons as mc
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.queries import CLAUSE_MARGIN
from d2s_search.backends.opensearch.search_template import (
    TEMPLATE_SOURCE,
    put_template_body,
    search_template_body,
    template_params,
)
from d2s_search.backends.opensearch.server_side import server_side_body

REPO = Path(__file__).resolve().parents[2]
QUERY = {"dog": 1.5, ".": 0.5, "##s": 0.25, "日本": 0.75, "say \"cheese\"": 0.3, "zero": 0.0}


@pytest.fixture(scope="module")
def bodies(model_package):
    return {
        "model group": ("POST", "/_plugins/_ml/model_groups/_register", mc.model_group_body()),
        "find group": ("POST", "/_plugins/_ml/model_groups/_search", mc.find_by_name_body("d2s-search")),
        "find model": ("POST", "/_plugins/_ml/models/_search", mc.find_by_name_body(model_package.name)),
        "register meta": ("POST", "/_plugins/_ml/models/_register_meta", mc.register_meta_body(model_package, "g1")),
        "register url": ("POST", "/_plugins/_ml/models/_register",
                         mc.register_url_body(model_package, "g1", "https://example.org/m.zip")),
        "predict": ("POST", "/_plugins/_ml/_predict/{algorithm_name}/{model_id}", mc.predict_body(["a dog"])),
        "cluster settings": ("PUT", "/_cluster/settings", mc.cluster_settings_body(local_file=True, url=True)),
        "neural_sparse": ("POST", "/{index}/_search", server_side_body("a dog", "m1", 10)),
        "neural_sparse page+filter": ("POST", "/{index}/_search",
                                      server_side_body("a dog", "m1", 5, offset=5, path_prefix="/photos/")),
        "store template": ("PUT", "/_scripts/{id}", put_template_body()),
        "template search": ("POST", "/{index}/_search/template", search_template_body(QUERY, 10)),
        "template search all options": ("POST", "/{index}/_search/template",
                                        search_template_body(QUERY, 5, offset=10, path_prefix="/p/", explain=True)),
    }


NAMES = ["model group", "find group", "find model", "register meta", "register url", "predict", "cluster settings",
         "neural_sparse", "neural_sparse page+filter", "store template", "template search",
         "template search all options"]


@pytest.mark.parametrize("name", NAMES)
def test_body_matches_spec(spec, bodies, name):
    method, path, body = bodies[name]
    spec.validate(method, path, body)


BROKEN = {
    "function name typo": ("register meta", lambda b: b.update(function_name="SPARSE_ENCODER")),
    "model format lower case": ("register meta", lambda b: b.update(model_format="onnx_v2")),
    "chunks as text": ("register meta", lambda b: b.update(total_chunks="two")),
    "no chunks": ("register meta", lambda b: b.pop("total_chunks")),
    "unknown config key": ("register meta", lambda b: b["model_config"].update(pooling="cls")),
    "no group name": ("model group", lambda b: b.pop("name")),
    "texts as string": ("predict", lambda b: b.update(text_docs="a dog")),
    "neural_sparse typo": ("neural_sparse", lambda b: b["query"]["neural_sparse"]["sparse"].update(query_txt="x")),
    "script without source": ("store template", lambda b: b["script"].pop("source")),
    "template params not object": ("template search", lambda b: b.update(params=[1])),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_validator_rejects_broken_bodies(spec, bodies, name):
    base, mutate = BROKEN[name]
    method, path, body = bodies[base]
    body = copy.deepcopy(body)
    mutate(body)
    with pytest.raises(jsonschema.ValidationError):
        spec.validate(method, path, body)


def test_upload_chunk_is_raw_bytes_which_the_spec_does_not_describe(spec):
    op = spec.operation("POST", "/_plugins/_ml/models/{model_id}/upload_chunk/{chunk_number}")
    # The spec's JSON schema wants {"chunk": "..."}; ml-commons reads request.content() as bytes.
    with pytest.raises(jsonschema.ValidationError):
        spec.validate("POST", op.path, b"PK\x03\x04".decode("latin-1"))


# -- the search template ------------------------------------------------------------------------

def test_template_file_is_the_builders_output():
    assert json.loads((REPO / "mappings/search_templates/d2s-sparse.json").read_text()) == put_template_body()


@pytest.mark.parametrize("options", [{}, {"offset": 20}, {"path_prefix": "/photos/a b/"}, {"explain": True}])
def test_rendered_template_is_the_client_side_sparse_query(spec, options):
    params = template_params(QUERY, 7, **options)
    body = json.loads(render(TEMPLATE_SOURCE, params))
    spec.validate("POST", "/{index}/_search", body)
    want = q.sparse_search_body(QUERY, 7, offset=options.get("offset", 0), filters=q.Filters(options.get("path_prefix")))
    got_q, want_q = body["query"]["bool"], want["query"]["bool"]
    assert got_q["should"] == want_q["should"]  # same clauses, keys escaped, float32 weights
    assert got_q.get("filter") == want_q.get("filter")
    assert body["size"] == 7 and body["from"] == options.get("offset", 0)
    assert ("sparse" in body["_source"]) == bool(options.get("explain"))


def test_template_params_prune_like_the_client():
    big = {f"t{i}": 1.0 + i for i in range(3000)}
    params = template_params(big, 10, max_clauses=1024)
    budget = 1024 - CLAUSE_MARGIN  # the same margin as the client-side plan
    assert len(params["features"]) == budget and params["features"][-1]["last"] is True
    assert sum(1 for f in params["features"] if f.get("last")) == 1
    assert {f["name"] for f in params["features"]} == {f"t{i}" for i in range(3000 - budget, 3000)}
    client = q.sparse_query(big, max_clauses=1024)["bool"]["should"]
    assert {c["rank_feature"]["field"].removeprefix("sparse.") for c in client} == {f["name"] for f in params["features"]}
    with pytest.raises(Exception, match="no terms"):
        template_params({"x": 0.0}, 10)
