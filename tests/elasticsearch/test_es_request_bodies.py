"""Every request body the Elasticsearch backend can send, checked against the Elasticsearch API
specification (serverless OpenAPI + types.ts, see spec.py), and the curl-able mapping files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from d2s_os_reference import TRICKY_TERMS, synthetic_docs

from d2s_search.backends.base import IndexIdentity
from d2s_search.backends.elasticsearch import queries as q
from d2s_search.backends.elasticsearch.features import check_feature_key, escape_term, unescape_term
from d2s_search.backends.engine import bodies
from d2s_search.errors import QueryError

ROOT = Path(__file__).resolve().parents[2]
IDENTITY = IndexIdentity(fingerprint="e" * 32, dense_dim=8, model="synthetic")
MAPPINGS = [
    q.VectorMapping(),
    q.VectorMapping(sparse_type="sparse_vector"),
    q.VectorMapping(similarity="max_inner_product", index_type="int8_hnsw"),
]
VEC = (np.arange(1, 9, dtype=np.float32) / np.linalg.norm(np.arange(1, 9))).astype(np.float32)
QUERY = {t: 0.5 + i / 10 for i, t in enumerate(TRICKY_TERMS[:20])} | {"dog": 2.0, "car": 1.2}


def search_bodies():
    for sparse_type in q.SPARSE_TYPES:
        for filters in (q.NO_FILTERS, q.Filters("photos/cats/")):
            tag = f"{sparse_type}-{'filtered' if filters.path_prefix else 'all'}"
            yield f"sparse-{tag}", q.sparse_search_body(QUERY, 10, offset=20, sparse_type=sparse_type, filters=filters)
            yield f"two-phase-{tag}", q.two_phase_body({"dog": 2.0}, QUERY, 10, 100, sparse_type=sparse_type,
                                                       filters=filters)
            yield f"rrf-{tag}", q.rrf_search_body(QUERY, VEC, 10, offset=10, window=100, rank_constant=30,
                                                  sparse_type=sparse_type, filters=filters)
        yield f"knn-{sparse_type}", q.knn_search_body(VEC, 10, offset=5, filters=q.Filters("photos/"))
    yield "knn-plain", q.knn_search_body(VEC, 10)
    yield "rrf-with-vectors", {**q.rrf_search_body(QUERY, VEC, 5), "_source": q.source_filter([*q.HIT_SOURCE, "dense"])}


@pytest.mark.parametrize(("name", "body"), list(search_bodies()), ids=lambda x: x if isinstance(x, str) else "")
def test_search_bodies_match_the_spec(spec, name, body):
    spec.validate("POST", "/{index}/_search", body)


@pytest.mark.parametrize("mapping", MAPPINGS, ids=lambda m: f"{m.sparse_type}-{m.similarity}-{m.index_type}")
def test_index_bodies_match_the_spec(spec, mapping):
    body = q.index_body(IDENTITY, mapping)
    body["aliases"] = {"d2s": {}}
    spec.validate("PUT", "/{index}", body)
    spec.validate("PUT", "/{index}", q.index_body(IDENTITY, mapping, shards=None, replicas=None))
    spec.validate("PUT", "/{index}", q.index_body(IDENTITY, mapping, keep_vectors_in_source=True))
    spec.validate("PUT", "/{index}/_mapping", q.put_meta_body(IDENTITY, mapping))


def test_other_bodies_match_the_spec(spec):
    docs = synthetic_docs(3, dim=8, seed=2)
    lines = q.bulk_index_lines("d2s", [(d.id, q.doc_source(d)) for d in docs]) + q.bulk_delete_lines("d2s", ["x"])
    spec.validate("POST", "/_bulk", [json.loads(line) for line in lines], ndjson=True)
    spec.validate("POST", "/{index}/_mget", bodies.mget_body([d.id for d in docs]))
    spec.validate("POST", "/_reindex", bodies.reindex_body("d2s-000001", "d2s-000002"))
    spec.validate("POST", "/_aliases", bodies.alias_swap_body("d2s", "d2s-000002", "d2s-000001", True))
    spec.validate("POST", "/_aliases", bodies.alias_swap_body("d2s", "d2s-000001", "d2s", False))
    spec.validate("POST", "/_search", q.pit_page_body("pit-id", 200))
    spec.validate("POST", "/_search", q.pit_page_body("pit-id", 200, after=[3, 17]))
    spec.validate("DELETE", "/_pit", q.close_pit_body("pit-id"))


def test_bodies_sent_over_the_wire_match_the_spec(spec, make_backend, es_proxy, identity):
    """What the client really put on the wire in a full session, not just the builders' output."""
    b = make_backend(es_proxy.url)
    b.open(identity)
    docs = synthetic_docs(30, dim=8, seed=4)
    b.upsert(docs)
    b.sparse_search(QUERY, 5, path_prefix="photos/")
    b.two_phase_search({"dog": 1.0}, QUERY, 5, 20)
    b.get([d.id for d in docs[:3]])
    b.relink({docs[4].path: docs[3].id}, [docs[5].path])  # a copy found, a file gone: update, delete
    b.delete([docs[0].id])
    checked = 0
    for sent in es_proxy.sent:
        if not sent.body:
            continue
        path = sent.path.split("?")[0]
        if path == "/_bulk":
            spec.validate("POST", "/_bulk", sent.ndjson(), ndjson=True)
        else:
            template = "/{index}" + path[path.index("/", 1):] if path.count("/") > 1 else "/{index}"
            spec.validate(sent.method, template, sent.json())
        checked += 1
    assert {s.path.split("?")[0].rsplit("/", 1)[-1] for s in es_proxy.sent if s.body} >= {
        "d2s-test-000001", "_bulk", "_search", "_mget"}
    assert checked >= 6


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda b: b["query"]["bool"]["should"][0]["rank_feature"].update(lineer={}), "typo in rank_feature"),
        (lambda b: b["rescore"]["query"].update(rescore_querry={}), "typo in rescore"),
        (lambda b: b["rescore"].update(script={"script": {"source": "1"}}), "two rescorers in one"),
        (lambda b: b.update(size="ten"), "size not a number"),
    ],
)
def test_the_validator_catches_mistakes(spec, mutate, why):
    body = q.two_phase_body({"dog": 1.0}, QUERY, 10, 50)
    mutate(body)
    with pytest.raises(Exception):  # noqa: B017 -- jsonschema or types.ts error, both mean "refused"
        spec.validate("POST", "/{index}/_search", body)


def test_the_validator_catches_mistakes_in_knn_rrf_index_and_bulk(spec):
    knn = q.knn_search_body(VEC, 10)
    knn["knn"]["vector"] = knn["knn"].pop("query_vector")  # OpenSearch's spelling
    rrf = q.rrf_search_body(QUERY, VEC, 10)
    rrf["retriever"]["rrf"]["window_size"] = 10  # the pre-8.16 name
    index = q.index_body(IDENTITY)
    index["mappings"]["properties"]["dense"]["dimension"] = 8  # OpenSearch's spelling
    shards = q.index_body(IDENTITY)
    shards["settings"]["index"]["number_of_shards"] = [1]
    for method, path, body in (("POST", "/{index}/_search", knn), ("POST", "/{index}/_search", rrf),
                               ("PUT", "/{index}", index), ("PUT", "/{index}", shards)):
        with pytest.raises(Exception):  # noqa: B017
            spec.validate(method, path, body)
    with pytest.raises(Exception):  # noqa: B017
        spec.validate("POST", "/_bulk", [{"index": {"_index": "d2s", "id": "x"}}, {}], ndjson=True)


@pytest.mark.parametrize(("file", "mapping"), [
    ("index.json", q.VectorMapping()),
    ("index-sparse-vector.json", q.VectorMapping(sparse_type="sparse_vector", similarity="max_inner_product",
                                                 index_type="int8_hnsw")),
])
def test_mapping_files_are_the_builders_output(spec, file, mapping):
    on_disk = json.loads((ROOT / "mappings" / "elasticsearch" / file).read_text(encoding="utf-8"))
    assert on_disk == q.index_body(None, mapping)
    spec.validate("PUT", "/{index}", on_disk)


def test_feature_keys_follow_elasticsearch_rules():
    for term in TRICKY_TERMS:
        key = escape_term(term)
        assert "." not in key and key
        assert unescape_term(key) == term
        check_feature_key(key, "sparse_vector")
    with pytest.raises(ValueError, match="do not support dots in feature names"):
        check_feature_key("a.m.", "sparse_vector")
    with pytest.raises(ValueError, match="could never reach it"):
        check_feature_key("a.m.", "rank_features")


def test_rank_feature_field_names_split_at_the_last_dot():
    """Elasticsearch resolves ``sparse.<key>`` at the last dot, so every key must be dot-free."""
    body = q.sparse_query({t: 1.0 for t in TRICKY_TERMS})
    for clause in body["bool"]["should"]:
        field = clause["rank_feature"]["field"]
        parent, _, key = field.rpartition(".")
        assert parent == q.SPARSE_FIELD
        assert unescape_term(key) in TRICKY_TERMS


def test_non_unit_vectors_refused_before_sending_for_dot_product():
    doc = synthetic_docs(1, dim=8)[0]
    doc.dense = doc.dense * 2
    with pytest.raises(ValueError, match="unit"):
        q.doc_source(doc)
    assert q.doc_source(doc, q.VectorMapping(similarity="max_inner_product"))["dense"]


def test_knn_candidates_and_paging_limits():
    body = q.knn_search_body(VEC, 10, offset=20)
    assert body["knn"]["k"] == 30 and body["knn"]["num_candidates"] == 100
    assert (body["size"], body["from"]) == (10, 20)
    with pytest.raises(QueryError):
        q.knn_search_body(VEC, 10, offset=9995)
    with pytest.raises(QueryError):
        q.knn_search_body(np.full(8, np.nan, np.float32), 10)
    rrf = q.rrf_search_body(QUERY, VEC, 10, offset=10, window=5)
    assert rrf["retriever"]["rrf"]["rank_window_size"] == 20  # never below from + size
