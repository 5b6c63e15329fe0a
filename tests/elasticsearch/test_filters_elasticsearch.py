"""Metadata filters on Elasticsearch: the 800-picture library of the OpenSearch tests on the test
server behind the compatibility proxy. Sparse and two-phase results, the library order and the
facet counts equal brute force over ``SearchFilter.allows``; kNN and RRF-retriever bodies carry
the filter (``knn.filter``, both retrievers); metadata updates, declared fields and indexes made
before the metadata fields; every body sent matches the Elasticsearch API specification."""

from __future__ import annotations

import calendar
import dataclasses
import json

import httpx
import numpy as np
import pytest
from d2s_es_proxy import CompatProxy
from d2s_os_reference import (
    RARE_CAMERA,
    USER_TYPES,
    facet_counts,
    filtered_ranking,
    library_order,
    lucene_score,
    metadata_docs,
    passes,
    random_query,
    ulps,
    vocabulary,
)

from d2s_search.backends.elasticsearch import queries as q
from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend
from d2s_search.backends.engine import narrowing
from d2s_search.backends.engine.bodies import Filters
from d2s_search.errors import DocumentsRejectedError, IndexStoreError, MetadataError
from d2s_search.filters import Condition as C
from d2s_search.filters import SearchFilter as F
from d2s_search.metadata import Metadata

VEC = (np.arange(1, 9, dtype=np.float32) / np.linalg.norm(np.arange(1, 9))).astype(np.float32)


def year(y: int) -> float:
    return float(calendar.timegm((y, 1, 1, 0, 0, 0)))


FILTERS = {
    "rare camera": F(where=(C("camera", "=", RARE_CAMERA),)),
    "one year": F(after=year(2018), before=year(2019)),
    "folders": F(folders=("/lib/2019/trips", "/backup")),
    "tag not red": F(where=(C("tag", "!=", "red"),)),
    "rating >= 4 and favourite": F(where=(C("rating", ">=", 4.0), C("favourite", "=", False))),
    "two cameras": F(where=(C("camera", "=", "Pixel 7"), C("camera", "=", "iPhone 12"))),
    "sizes and event": F(where=(C("width", ">", 700.0), C("event", "<", year(2020)), C("height", "<=", 680.0))),
    "near sydney": F(near=(-33.8688, 151.2093, 25.0)),
    "combined": F(after=year(2016), folders=("/lib/2020", "/backup"),
                  where=(C("camera", "!=", "Pixel 7"), C("rating", ">=", 2.0)), near=(35.6762, 139.6503, 40.0)),
}


# Filters holding every kind of clause between them: range, prefix, term (text, boolean), must_not,
# alternatives, integer bounds, a date equality, a place.
SHAPES = ("combined", "two cameras", "rating >= 4 and favourite", "sizes and event")


@pytest.fixture(scope="module")
def docs():
    # unit dense vectors (the dot_product similarity wants them), as synthetic_docs makes them
    return metadata_docs(800, dim=8, seed=7)


@pytest.fixture(scope="module")
def cluster(osmem_server):
    clone = osmem_server.clone()
    proxy = CompatProxy(clone.url)  # records every request
    yield proxy
    proxy.close()
    clone.close()


@pytest.fixture(scope="module")
def library(cluster, docs, identity_module):
    b = ElasticsearchBackend(cluster.url, index_name="d2s-filters", sleep=lambda s: None)
    b.open(identity_module)
    b.declare_fields(USER_TYPES)
    b.upsert(docs)
    yield b
    b.close()


@pytest.fixture(scope="module")
def identity_module():
    from d2s_search.backends.base import IndexIdentity

    return IndexIdentity(fingerprint="e" * 32, dense_dim=8, model="synthetic")


def test_the_filters_keep_one_picture_a_tenth_and_nine_tenths(docs):
    shares = [len(passes(docs, f)) / len(docs) for f in FILTERS.values()]
    assert len(passes(docs, FILTERS["rare camera"])) == 1
    assert any(0.05 <= s <= 0.15 for s in shares) and any(0.85 <= s <= 0.95 for s in shares)
    assert all(s > 0 for s in shares)


def assert_ranking(hits, expected) -> None:
    assert [h.id for h in hits] == [i for i, _ in expected]
    assert all(ulps(h.score, s) <= 1 for h, (_, s) in zip(hits, expected, strict=True))


@pytest.mark.parametrize("name", list(FILTERS))
def test_sparse_and_two_phase_equal_brute_force(library, docs, name):
    f = FILTERS[name]
    rng = np.random.default_rng(3)
    own = passes(docs, f)[0]
    by_id = {d.id: d for d in docs}
    for query in (random_query(vocabulary(), rng), dict(sorted(own.sparse.items(), key=lambda kv: -kv[1])[:6])):
        expected = filtered_ranking(query, docs, f)
        assert_ranking(library.sparse_search(query, 10, filters=f), expected[:10])
        assert_ranking(library.sparse_search(query, len(docs) + 10, filters=f), expected)
        first = dict(list(query.items())[:4])
        pool = [i for i, _ in filtered_ranking(first, docs, f)]
        for k in (10, len(docs) + 10):
            rescored = sorted(((i, lucene_score(query, by_id[i].sparse)) for i in pool[: max(25, k)]),
                              key=lambda x: (-x[1], x[0]))
            assert_ranking(library.two_phase_search(first, query, k, 25, filters=f), rescored[:k])


@pytest.mark.parametrize("name", list(FILTERS))
def test_library_order_and_facets_equal_brute_force(library, docs, name):
    f = FILTERS[name]
    order = library_order(docs, f)
    assert [h.id for h in library.browse(40, f)] == order[:40]
    assert [h.id for h in library.browse(40, f, offset=40)] == order[40:80]
    assert [h.id for h in library.browse(len(docs) + 10, f)] == order
    for size in (3, 20):
        assert library.facets(f, size) == facet_counts(docs, f, USER_TYPES, size)


def test_field_types_and_metadata_read_back(library, docs):
    assert library.field_types() == {"camera": "keyword", "width": "number", "height": "number",
                                     "size_bytes": "number", "taken": "date", **USER_TYPES}
    stored = {d.id: d for d in library.get([d.id for d in docs[:50]])}
    assert all(stored[d.id].metadata == d.metadata for d in docs[:50])
    assert [h.id for h in library.browse(25)] == library_order(docs, F())[:25]


def test_knn_and_rrf_bodies_carry_the_filter(spec):
    for sparse_type in q.SPARSE_TYPES:
        for name, f in FILTERS.items():
            validate = spec.validate if name in SHAPES and (sparse_type == "rank_features" or name == "combined") \
                else (lambda *args: None)  # each kind of clause is validated once (the validator is slow)
            narrowed = Filters(search=f, types=USER_TYPES)
            knn = q.knn_search_body(VEC, 10, filters=narrowed)
            validate("POST", "/{index}/_search", knn)
            want = [narrowed.as_query()] if narrowed.exclusions() else narrowed.clauses()
            assert knn["knn"]["filter"] == want, name  # during the search: k hits when k pass
            rrf = q.rrf_search_body({"dog": 1.0, "car": 0.5}, VEC, 10, window=50, sparse_type=sparse_type,
                                    filters=narrowed)
            validate("POST", "/{index}/_search", rrf)
            standard, dense = rrf["retriever"]["rrf"]["retrievers"]
            restricted = standard["standard"]["query"]["bool"]
            assert restricted.get("filter", []) == narrowed.clauses()
            assert restricted.get("must_not", []) == narrowed.exclusions()
            assert dense["knn"]["filter"] == want
            two = q.two_phase_body({"dog": 1.0}, {"dog": 1.0, "car": 0.5}, 10, 100, sparse_type=sparse_type,
                                   filters=narrowed)
            validate("POST", "/{index}/_search", two)


# -- writes -----------------------------------------------------------------------------------


@pytest.fixture
def small(make_backend, es_proxy, identity):
    b = make_backend(es_proxy.url)
    b.open(identity)
    b.declare_fields(USER_TYPES)
    docs = metadata_docs(30, dim=8, seed=9)
    b.upsert(docs)
    return b, docs


def test_set_metadata_changes_what_filters_find_not_the_vectors(small, es_proxy):
    b, docs = small
    before = {d.id: d for d in b.get([d.id for d in docs])}
    target = next(d for d in docs if d.metadata.camera != RARE_CAMERA)
    new = Metadata(year(2031), RARE_CAMERA, None, {"favourite": True, "event": year(2001)})
    sent = len(es_proxy.sent)
    assert b.set_metadata({target.id: new, "f" * 64: new}) == 1
    assert b.set_metadata({target.id: new}) == 0
    lines = [line for s in es_proxy.sent[sent:] if s.path.startswith("/_bulk") for line in s.ndjson()]
    assert lines and all(set(line.get("doc", {})) <= set(narrowing.METADATA_KEYS) for line in lines)
    rare = F(where=(C("camera", "=", RARE_CAMERA),))
    assert target.id in [h.id for h in b.browse(10, rare)]
    assert [h.id for h in b.browse(1)] == [target.id]
    after = {d.id: d for d in b.get([d.id for d in docs])}
    assert after[target.id].metadata == new
    assert all(after[d.id].sparse == before[d.id].sparse and np.array_equal(after[d.id].dense, before[d.id].dense)
               for d in docs)
    event = F(where=(C("event", "=", year(2001)),))
    assert [h.id for h in b.browse(5, event)] == [target.id]


def test_declare_fields_refuses_another_type(small):
    b, docs = small
    with pytest.raises(MetadataError, match="'tag' is already a keyword field"):
        b.declare_fields({"tag": "date"})
    stray = dataclasses.replace(docs[0], id="e" * 64, path="/x/new.jpg", metadata=Metadata(fields={"lens": "35mm"}))
    with pytest.raises(DocumentsRejectedError, match="'lens' is not declared"):
        b.upsert([stray])


def _old_index(proxy, identity) -> str:
    """An index as d2s-search made it before the metadata fields (through the proxy, which
    maps its dense_vector for osmem), holding one undated document; returns that id."""
    body = q.index_body(identity)
    for key in narrowing.metadata_properties():
        del body["mappings"]["properties"][key]
    body["aliases"] = {"d2s-old": {}}
    assert httpx.put(f"{proxy.url}/d2s-old-000001", json=body).status_code == 200
    old = dataclasses.replace(metadata_docs(1, dim=8, seed=3)[0], metadata=Metadata())
    source = {k: v for k, v in q.doc_source(old).items() if k not in narrowing.METADATA_KEYS}
    put = httpx.put(f"{proxy.upstream}/d2s-old/_doc/{old.id}", json=source, params={"refresh": "true"})
    assert put.status_code in (200, 201)
    return old.id


def test_an_index_made_before_is_extended_when_opened_for_writing(es_proxy, make_backend, identity):
    old_id = _old_index(es_proxy, identity)
    upstream = es_proxy.upstream
    b = make_backend(es_proxy.url, index_name="d2s-old")
    b.open(identity)
    props = httpx.get(f"{upstream}/d2s-old/_mapping").json()["d2s-old-000001"]["mappings"]["properties"]
    assert set(narrowing.metadata_properties()) <= set(props)
    new = metadata_docs(6, dim=8, seed=4)[1:]
    b.upsert([dataclasses.replace(d, metadata=dataclasses.replace(d.metadata, fields={})) for d in new])
    assert [h.id for h in b.browse(10)][-1] == old_id  # undated: last


def test_a_refused_mapping_update_is_one_line(es_proxy, make_backend, identity):
    _old_index(es_proxy, identity)
    es_proxy.add("PUT", "/_mapping", "status", code=400)
    b = make_backend(es_proxy.url, index_name="d2s-old")
    with pytest.raises(IndexStoreError, match="refused to add the metadata fields") as err:
        b.open(identity)
    assert "\n" not in str(err.value)


def test_zz_every_body_sent_matches_the_spec(spec, cluster, library):
    checked = 0
    shapes: set[str] = set()  # one body of each shape: the same structure validates the same way
    for sent in cluster.sent:
        if not sent.body:
            continue
        path = sent.path.split("?")[0]
        if path == "/_bulk":
            lines = [line for item in _bulk_items(sent.ndjson()) if _new_shape(shapes, item) for line in item]
            if lines:
                spec.validate("POST", "/_bulk", lines, ndjson=True)
        elif _new_shape(shapes, [sent.method, path.rsplit("/", 1)[-1], sent.json()]):
            template = "/{index}" + path[path.index("/", 1):] if path.count("/") > 1 else "/{index}"
            spec.validate(sent.method, template, sent.json())
        checked += 1
    kinds = {s.path.split("?")[0].rsplit("/", 1)[-1] for s in cluster.sent if s.body}
    assert {"_mapping", "_bulk", "_search", "_mget"} <= kinds and checked > 100
    searches = [s.body for s in cluster.sent if s.path.split("?")[0].endswith("/_search")]
    assert any(b'"aggregations"' in b for b in searches) and any(b'"geo_distance"' in b for b in searches)


def _shape(node):
    """The structure of a JSON value: keys and value types (the sparse field's keys left out)."""
    if isinstance(node, dict):
        return {k: _shape(v) for k, v in node.items() if not k.startswith("sparse.")} if "sparse" not in node else {
            **{k: _shape(v) for k, v in node.items() if k != "sparse"}, "sparse": "features"}
    if isinstance(node, list):
        return sorted({json.dumps(_shape(v), sort_keys=True) for v in node})
    return type(node).__name__


def _new_shape(seen: set[str], node) -> bool:
    key = json.dumps(_shape(node), sort_keys=True)
    if key in seen:
        return False
    seen.add(key)
    return True


def _bulk_items(lines: list) -> list[list]:
    """``_bulk`` lines as items: an action and its source (a delete alone)."""
    items, i = [], 0
    while i < len(lines):
        size = 1 if "delete" in lines[i] else 2
        items.append(lines[i : i + size])
        i += size
    return items
