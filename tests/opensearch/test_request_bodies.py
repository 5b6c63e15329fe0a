"""Every request body the backend sends, validated against the OpenSearch API specification.

Two angles: (1) each pure builder, with the options that change its shape; (2) every request
the backend actually sent while exercising all of its methods (recorded on the wire), each
matched to its spec operation by method and path. Validation is strict (unknown keys fail),
and negative controls prove the validator does reject broken bodies.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest
from d2s_os_faultproxy import FaultProxy
from d2s_os_reference import synthetic_docs

from d2s_search.backends.base import IndexIdentity
from d2s_search.backends.engine import bodies
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.backends.opensearch.cluster import Dialect

REPO = Path(__file__).resolve().parents[2]
IDENT = IndexIdentity("ab" * 16, 8, "synthetic")
QUERY = {"dog": 1.5, ".": 0.5, "##s": 0.25, "日本": 0.75, "zero": 0.0}
VEC = np.linspace(-1, 1, 8).astype(np.float32)


BUILT = {
    "index create faiss": ("PUT", "/{index}", q.index_body(IDENT)),
    "index create lucene": ("PUT", "/{index}", q.index_body(IDENT, engine="lucene", shards=2, replicas=1)),
    "sparse": ("POST", "/{index}/_search", q.sparse_search_body(QUERY, 10)),
    "sparse page+filter": (
        "POST", "/{index}/_search",
        q.sparse_search_body(QUERY, 5, offset=20, filters=q.Filters("photos/dogs/")),
    ),
    "neural_sparse": ("POST", "/{index}/_search", q.sparse_search_body(QUERY, 10, neural_sparse=True)),
    "neural_sparse+filter": (
        "POST", "/{index}/_search",
        q.sparse_search_body(QUERY, 10, neural_sparse=True, filters=q.Filters("a/")),
    ),
    "two-phase": ("POST", "/{index}/_search", q.two_phase_body({"dog": 1.0}, QUERY, 10, 100)),
    "two-phase page+filter": (
        "POST", "/{index}/_search",
        q.two_phase_body({"dog": 1.0}, QUERY, 10, 50, offset=10, filters=q.Filters("x/")),
    ),
    "knn": ("POST", "/{index}/_search", q.knn_search_body(VEC, 10)),
    "knn page+filter": ("POST", "/{index}/_search", q.knn_search_body(VEC, 10, offset=5, filters=q.Filters("x/"))),
    "hybrid": ("POST", "/{index}/_search", q.hybrid_search_body(QUERY, VEC, 10, window=100)),
    "hybrid page+filter+neural": (
        "POST", "/{index}/_search",
        q.hybrid_search_body(QUERY, VEC, 10, offset=10, filters=q.Filters("x/"), neural_sparse=True),
    ),
    "pipeline min_max": ("PUT", "/_search/pipeline/{id}", q.minmax_pipeline_body((0.3, 0.7))),
    "pipeline rrf": ("PUT", "/_search/pipeline/{id}", q.rrf_pipeline_body(60)),
    "mget": ("POST", "/{index}/_mget", bodies.mget_body(["a", "b"])),
    "reindex": ("POST", "/_reindex", bodies.reindex_body("d2s-000001", "d2s-000002")),
    "alias swap": ("POST", "/_aliases", bodies.alias_swap_body("d2s", "d2s-000002", "d2s-000001", True)),
    "alias replace index": ("POST", "/_aliases", bodies.alias_swap_body("d2s", "d2s-000001", "d2s", False)),
    "put _meta": ("PUT", "/{index}/_mapping", {"_meta": q.index_body(IDENT)["mappings"]["_meta"]}),
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_builder_body_matches_spec(spec, name):
    method, path, body = BUILT[name]
    spec.validate(method, path, body)


def test_bulk_lines_match_spec(spec):
    docs = synthetic_docs(3, dim=8)
    from opensearchpy.helpers import expand_action

    def lines(actions):  # what opensearchpy.helpers.streaming_bulk sends for them
        out = []
        for action in actions:
            head, source = expand_action(dict(action))
            out += [head] + ([source] if source is not None else [])
        return out

    index_lines = lines(q.bulk_index_actions("d2s", [(d.id, q.doc_source(d)) for d in docs]))
    delete_lines = lines(q.bulk_delete_actions("d2s", [d.id for d in docs]))
    assert len(index_lines) == 6 and len(delete_lines) == 3
    spec.validate("POST", "/_bulk", index_lines)
    spec.validate("POST", "/_bulk", delete_lines)
    # The action lines alone must satisfy the spec's operation container, not just "any object".
    for line in index_lines[0::2] + delete_lines:
        spec.validate_schema("schemas/_core.bulk.yaml#/components/schemas/OperationContainer", line)


# -- negative controls: the validator is not vacuous -------------------------------------------

BROKEN = {
    "missing rank_feature field": ("POST", "/{index}/_search", lambda b: b["query"]["bool"]["should"][0]["rank_feature"].pop("field")),
    "typo in query type": ("POST", "/{index}/_search", lambda b: b["query"]["bool"]["should"].append({"rank_featur": {"field": "x"}})),
    "typo in rescore": ("POST", "/{index}/_search", lambda b: b.update(rescore={"query": {"rescore_query": {"match_all": {}}, "query_wieght": 0}})),
    "size as text": ("POST", "/{index}/_search", lambda b: b.update(size="ten")),
    "boost as text": ("POST", "/{index}/_search", lambda b: b["query"]["bool"]["should"][0]["rank_feature"].update(boost="1")),
    "knn without vector": ("POST", "/{index}/_search", lambda b: b.update(query={"knn": {"dense": {"k": 3}}})),
    "unknown mapping key": ("PUT", "/{index}", lambda b: b["mappings"]["properties"]["sparse"].update(positive_impact=True)),
    "knn without dimension": ("PUT", "/{index}", lambda b: b["mappings"]["properties"]["dense"].pop("dimension")),
    "unknown combination": ("PUT", "/_search/pipeline/{id}", lambda b: b["phase_results_processors"][0]["normalization-processor"]["combination"].update(technique="median")),
}
BASE_FOR = {"/{index}/_search": BUILT["sparse"][2], "/{index}": BUILT["index create faiss"][2], "/_search/pipeline/{id}": BUILT["pipeline min_max"][2]}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_validator_rejects_broken_bodies(spec, name):
    method, path, mutate = BROKEN[name]
    body = copy.deepcopy(BASE_FOR[path])
    mutate(body)
    with pytest.raises(jsonschema.ValidationError):
        spec.validate(method, path, body)


def test_validator_rejects_broken_bulk_action(spec):
    with pytest.raises(jsonschema.ValidationError):
        spec.validate_schema(
            "schemas/_core.bulk.yaml#/components/schemas/OperationContainer", {"index": {"_id": 5}}
        )


# -- the shipped JSON files are the builders' output --------------------------------------------

def test_mapping_files_equal_builders():
    assert json.loads((REPO / "mappings/index.json").read_text()) == q.index_body()
    pipelines = REPO / "mappings/pipelines"
    assert json.loads((pipelines / "d2s-hybrid-minmax.json").read_text()) == q.minmax_pipeline_body()
    assert json.loads((pipelines / "d2s-hybrid-rrf.json").read_text()) == q.rrf_pipeline_body()  # 3.1+
    rrf_219 = q.rrf_pipeline_body(60, Dialect.of("2.19.1"))  # 2.19 and 3.0 read parameters.rank_constant
    assert json.loads((pipelines / "d2s-hybrid-rrf-2.19.json").read_text()) == rrf_219


def test_mapping_files_match_spec(spec):
    spec.validate("PUT", "/{index}", json.loads((REPO / "mappings/index.json").read_text()))
    for f in sorted((REPO / "mappings/pipelines").glob("*.json")):
        spec.validate("PUT", "/_search/pipeline/{id}", json.loads(f.read_text()))


# -- everything the backend sent on the wire ----------------------------------------------------

def stub_missing(method: str, path: str, body: bytes):
    """What osmem lacks (kNN, hybrid, pipelines) is answered here; the rest is forwarded."""
    if method == "PUT" and path.startswith("/_search/pipeline/"):
        return 200, {"acknowledged": True}
    if path.split("?")[0].endswith("/_search") and re.search(rb'"(knn|hybrid|neural_sparse)"', body or b""):
        return 200, {"hits": {"hits": []}}
    return None


def _template(paths, method: str, path: str) -> str:
    matches = [t for rx, t in paths.get(method, []) if rx.match(path)]
    assert matches, f"{method} {path} is not an operation of the OpenSearch API"
    return max(matches, key=lambda t: len(re.sub(r"\{[^}]+\}", "", t)))  # most literal wins


def test_every_request_the_backend_sends_matches_spec(spec, osmem_url):
    rec = FaultProxy(osmem_url, stub=stub_missing)  # a real HTTP server that records every request
    b = OpenSearchBackend(rec.url, index_name="d2s-wire", sleep=lambda s: None)
    try:
        docs = synthetic_docs(12, dim=8)
        b.open(IDENT)
        b.upsert(docs)
        b.relink({docs[1].path: docs[0].id}, [docs[2].path])  # a copy found, a file gone: update, delete
        b.ids_present([d.id for d in docs] + ["missing"])
        b.get([docs[0].id])
        b.sparse_search(QUERY | {"w000": 1.0}, 5, offset=2, path_prefix="photos/")
        b.sparse_search(QUERY, 5, neural_sparse=True)
        b.two_phase_search({"dog": 1.0}, QUERY, 5, window=20)
        b.dense_search(VEC, 5, explain_with=QUERY, path_prefix="photos/")
        b.hybrid_search(QUERY, VEC, 5)
        b.hybrid_search(QUERY, VEC, 5, method="min_max", weights=(0.2, 0.8), offset=5)
        b.hybrid_search(QUERY, VEC, 5, method="rrf")
        b.stats()
        b.delete([docs[0].id, "missing"])
        b.reindex()
        b.reindex(reencode=lambda d: d)
        b.drop()
        # An index made by hand from mappings/index.json: open() records the bundle in _meta.
        httpx.put(f"{osmem_url}/d2s-wire", json=json.loads((REPO / "mappings/index.json").read_text()))
        OpenSearchBackend(rec.url, index_name="d2s-wire").open(IndexIdentity("cd" * 16, 256))
    finally:
        b.close()
        rec.close()

    paths = spec.paths_by_method()
    checked: set[tuple[str, str]] = set()
    n_bodies = 0
    sent = [(s.method, s.path.split("?")[0], s.body, s.content_type) for s in rec.log]
    assert {c for m, p, b, c in sent if p == "/_bulk"} == {"application/x-ndjson"}
    for method, path, body, _ctype in sent:
        template = _template(paths, method, path)
        checked.add((method, template))
        if not body:
            continue
        if template == "/_bulk":
            lines = [json.loads(x) for x in body.decode().splitlines()]
            spec.validate(method, template, lines)
            # The spec lets any object be a bulk line; hold the action lines to the real schema.
            actions = [x for x in lines if set(x) & {"index", "delete", "update"} and len(x) == 1]
            assert len(actions) >= len(lines) // 2
            for line in actions:
                spec.validate_schema("schemas/_core.bulk.yaml#/components/schemas/OperationContainer", line)
            n_bodies += 1
        else:
            spec.validate(method, template, json.loads(body))
            n_bodies += 1
    assert n_bodies >= 25
    expected = {
        ("PUT", "/{index}"), ("POST", "/_bulk"), ("POST", "/{index}/_mget"), ("POST", "/{index}/_search"),
        ("PUT", "/_search/pipeline/{id}"), ("POST", "/_reindex"), ("POST", "/_aliases"),
        ("POST", "/_search/scroll"), ("DELETE", "/_search/scroll"), ("PUT", "/{index}/_mapping"),
        ("GET", "/{index}/_mapping"), ("DELETE", "/{index}"), ("POST", "/{index}/_refresh"),
        ("GET", "/{index}/_count"), ("GET", "/_cluster/settings"),
    }
    assert expected <= checked, f"not exercised: {sorted(expected - checked)}"
    bodies = [json.loads(b) for m, p, b, c in sent if p.endswith("/_search") and b]
    kinds = {k for body in bodies for k in _query_kinds(body)}
    assert {"rank_feature", "neural_sparse", "knn", "hybrid", "prefix"} <= kinds
    assert any("rescore" in body for body in bodies)


def _query_kinds(node) -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        out.update(node)
        for v in node.values():
            out |= _query_kinds(v)
    elif isinstance(node, list):
        for v in node:
            out |= _query_kinds(v)
    return out


def _check_wire(spec, log) -> set[tuple[str, str]]:
    """Every request in ``log`` is an operation of the API and its body matches the spec."""
    paths = spec.paths_by_method()
    checked = set()
    for seen in log:
        method, path = seen.method, seen.path.split("?")[0]
        template = _template(paths, method, path)
        checked.add((method, template))
        if not seen.body:
            continue
        if template == "/_bulk":
            lines = [json.loads(x) for x in seen.body.decode().splitlines()]
            spec.validate(method, template, lines)
            for line in (x for x in lines if set(x) & {"index", "delete"} and len(x) == 1):
                spec.validate_schema("schemas/_core.bulk.yaml#/components/schemas/OperationContainer", line)
        else:
            spec.validate(method, template, json.loads(seen.body))
    return checked


def test_every_request_on_a_seismic_index_matches_the_3_3_spec(osmem_url):
    from d2s_os_plugins import PluginStandIn
    from d2s_os_reference import vocabulary
    from d2s_os_spec import OpenSearchSpec

    from d2s_search.search import QueryVectors, SearchOptions, run_query

    rec = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, "3.3.0"))
    vocab = vocabulary()
    b = OpenSearchBackend(rec.url, index_name="d2s-wire", sleep=lambda s: None)
    try:
        docs = synthetic_docs(12, dim=8, vocab=vocab)
        b.create(IDENT, sparse_index="seismic", vocabulary=vocab)
        b.open(IDENT)
        b.upsert(docs)
        b.ids_present([d.id for d in docs])
        b.get([docs[0].id])
        query = dict(list(docs[1].sparse.items())[:5])
        b.sparse_search(query, 5, path_prefix="photos/")
        b.dense_search(VEC, 5, explain_with=query, path_prefix="photos/")
        run_query(b, QueryVectors(full=query, own=query, dense=VEC), SearchOptions(mode="hybrid", k=5))
        b.stats()
        b.delete([docs[0].id])
        b.drop()
    finally:
        b.close()
        rec.close()
    checked = _check_wire(OpenSearchSpec.load(strict=True, version="3.3.0"), rec.log)
    assert {("PUT", "/{index}"), ("POST", "/_bulk"), ("POST", "/{index}/_search"), ("POST", "/{index}/_mget"),
            ("POST", "/{index}/_refresh")} <= checked


def test_every_request_on_serverless_matches_spec(spec, osmem_url, monkeypatch):
    from d2s_os_plugins import PluginStandIn

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    rec = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, serverless=True))
    b = OpenSearchBackend(rec.url, index_name="d2s-wire", sleep=lambda s: None, aws_service="aoss",
                          aws_region="eu-west-1")
    try:
        docs = synthetic_docs(12, dim=8)
        b.open(IDENT)
        b.upsert(docs)
        b.upsert(docs[:3])
        b.ids_present([d.id for d in docs] + ["missing"])
        b.get([docs[0].id])
        b.paths_of([docs[1].id])
        list(b.document_paths(page=5))
        b.sparse_search(QUERY | {"w000": 1.0}, 5, path_prefix="photos/")
        b.dense_search(VEC, 5, explain_with=QUERY)
        b.stats()
        b.delete([docs[0].id, "missing"])
        b.drop()
    finally:
        b.close()
        rec.close()
    checked = _check_wire(spec, rec.log)
    assert {("PUT", "/{index}"), ("POST", "/_bulk"), ("POST", "/{index}/_search")} <= checked
    assert not {c for c in checked if "scroll" in c[1] or "refresh" in c[1] or "mget" in c[1]}
