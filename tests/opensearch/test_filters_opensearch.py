"""Metadata filters on OpenSearch: 800 pictures with dates, cameras, places, the user's fields and
copies, on the test server behind the plugin stand-in (exact k-NN with its efficient filter),
searched with filters that keep one picture, about a tenth and about nine tenths: sparse,
two-phase, dense and SEISMIC results, the library order and the facet counts equal brute force
over ``SearchFilter.allows``; hybrid bodies carry the filter in both sub-queries; metadata
updates, declared fields and indexes made before the metadata fields; every request on the wire
matches the OpenSearch API specification."""

from __future__ import annotations

import calendar
import dataclasses
import json
import re

import httpx
import numpy as np
import pytest
from d2s_os_faultproxy import FaultProxy
from d2s_os_plugins import PluginStandIn
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

from d2s_search.backends.base import IndexIdentity
from d2s_search.backends.engine import narrowing
from d2s_search.backends.engine.bodies import Filters
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.errors import DocumentsRejectedError, IndexStoreError, MetadataError
from d2s_search.filters import Condition as C
from d2s_search.filters import SearchFilter as F
from d2s_search.metadata import Metadata

IDENT = IndexIdentity("ab" * 16, 8, "synthetic")
VEC = np.linspace(-1, 1, 8).astype(np.float32)


def year(y: int) -> float:
    return float(calendar.timegm((y, 1, 1, 0, 0, 0)))


FILTERS = {
    "rare camera": F(where=(C("camera", "=", RARE_CAMERA),)),
    "one year": F(after=year(2018), before=year(2019)),
    "a folder": F(folders=("/lib/2019/trips",)),
    "copies folder": F(folders=("/backup", "/lib/scans")),
    "tag red": F(where=(C("tag", "=", "red"),)),
    "tag not red": F(where=(C("tag", "!=", "red"),)),
    "rating >= 4": F(where=(C("rating", ">=", 4.0),)),
    "two cameras": F(where=(C("camera", "=", "Pixel 7"), C("camera", "=", "iPhone 12"))),
    "width and event": F(where=(C("width", ">", 700.0), C("event", "<", year(2020)), C("height", "<=", 680.0))),
    "favourite": F(where=(C("favourite", "=", True),)),
    "event on a day": None,  # filled in from the data: = on a date
    "near paris": F(near=(48.8566, 2.3522, 20.0)),
    "before 2024": F(before=year(2024)),
    "combined": F(after=year(2016), folders=("/lib/2020", "/backup"),
                  where=(C("camera", "!=", "Pixel 7"), C("rating", ">=", 2.0)), near=(35.6762, 139.6503, 40.0)),
}


@pytest.fixture(scope="module")
def docs():
    out = metadata_docs(800, dim=8)
    day = next(d.metadata.fields["event"] for d in out if "event" in d.metadata.fields)
    FILTERS["event on a day"] = F(where=(C("event", "=", day),))
    return out


def stand_in(osmem_url: str):
    """The plugin stand-in, with search pipelines accepted and hybrid queries answered empty
    (the stand-in has no hybrid query: its bodies are checked against the specification)."""
    plugins = PluginStandIn(osmem_url, "3.3.0")

    def stub(method: str, path: str, body: bytes):
        if method == "PUT" and path.startswith("/_search/pipeline/"):
            return 200, {"acknowledged": True}
        if path.split("?")[0].endswith("/_search") and b'"hybrid"' in (body or b""):
            return 200, {"hits": {"hits": []}}
        return plugins(method, path, body)

    return stub


@pytest.fixture(scope="module")
def cluster(osmem_server):
    clone = osmem_server.clone()
    proxy = FaultProxy(clone.url, stub=stand_in(clone.url))  # records every request
    yield proxy
    proxy.close()
    clone.close()


@pytest.fixture(scope="module")
def library(cluster, docs):
    b = OpenSearchBackend(cluster.url, index_name="d2s-filters", sleep=lambda s: None)
    b.open(IDENT)
    b.declare_fields(USER_TYPES)
    b.upsert(docs)
    yield b
    b.close()


def test_the_filters_keep_one_picture_a_tenth_and_nine_tenths(docs):
    kept = {name: len(passes(docs, f)) / len(docs) for name, f in FILTERS.items()}
    assert len(passes(docs, FILTERS["rare camera"])) == 1
    assert any(0.05 <= share <= 0.15 for share in kept.values())
    assert any(0.85 <= share <= 0.95 for share in kept.values())
    assert all(share > 0 for share in kept.values()), kept


def queries(docs, f, n: int = 3) -> list[dict[str, float]]:
    """Random queries, and one made of a passing picture's own terms (so a narrow filter has a hit)."""
    rng = np.random.default_rng(len(docs))
    out = [random_query(vocabulary(), rng) for _ in range(n - 1)]
    first = passes(docs, f)[0]
    out.append(dict(sorted(first.sparse.items(), key=lambda kv: -kv[1])[:6]))
    return out


def assert_ranking(hits, expected) -> None:
    assert [h.id for h in hits] == [i for i, _ in expected]
    assert all(ulps(h.score, s) <= 1 for h, (_, s) in zip(hits, expected, strict=True))


@pytest.mark.parametrize("name", list(FILTERS))
def test_sparse_and_two_phase_equal_brute_force(library, docs, name):
    f = FILTERS[name]
    for query in queries(docs, f):
        expected = filtered_ranking(query, docs, f)
        assert_ranking(library.sparse_search(query, 10, filters=f), expected[:10])
        # more than pass: exactly every passing picture that matches
        assert_ranking(library.sparse_search(query, len(docs) + 10, filters=f), expected)
        first = dict(list(query.items())[:4])
        pool = [i for i, _ in filtered_ranking(first, docs, f)]
        by_id = {d.id: d for d in docs}
        for k, window in ((10, 25), (len(docs) + 10, 25)):
            candidates = pool[: max(window, k)]
            rescored = sorted(((i, lucene_score(query, by_id[i].sparse)) for i in candidates), key=lambda x: (-x[1], x[0]))
            assert_ranking(library.two_phase_search(first, query, k, window, filters=f), rescored[:k])


@pytest.mark.parametrize("name", ["rare camera", "one year", "tag not red", "combined", "near paris"])
def test_dense_equals_brute_force_with_efficient_filtering(library, docs, name):
    f = FILTERS[name]
    kept = passes(docs, f)
    ips = sorted(((d.id, float(np.dot(d.dense.astype(np.float64), VEC.astype(np.float32).astype(np.float64))))
                  for d in kept), key=lambda x: (-x[1], x[0]))
    for k in (10, len(docs) + 10):
        hits = library.dense_search(VEC, k, filters=f)
        assert [h.id for h in hits] == [i for i, _ in ips[:k]]  # k hits when k pass: no post-filter
        assert all(abs(h.score - s) < 1e-5 for h, (_, s) in zip(hits, ips, strict=False))


@pytest.mark.parametrize("name", list(FILTERS))
def test_library_order_and_facets_equal_brute_force(library, docs, name):
    f = FILTERS[name]
    order = library_order(docs, f)
    assert [h.id for h in library.browse(50, f)] == order[:50]
    assert [h.id for h in library.browse(50, f, offset=50)] == order[50:100]
    everything = library.browse(len(docs) + 10, f)
    assert [h.id for h in everything] == order and all(h.score == 0.0 for h in everything)
    assert everything and everything[0].path in {d.path for d in docs}
    for size in (3, 20):
        assert library.facets(f, size) == facet_counts(docs, f, USER_TYPES, size)


def test_the_library_without_filters(library, docs):
    assert [h.id for h in library.browse(30)] == library_order(docs, F())[:30]
    assert library.facets(size=50) == facet_counts(docs, F(), USER_TYPES, 50)
    assert library.facets()["favourite"] and {v for v, _ in library.facets()["favourite"]} <= {"true", "false"}


def test_field_types_and_metadata_read_back(library, docs):
    assert library.field_types() == {"camera": "keyword", "width": "number", "height": "number",
                                     "size_bytes": "number", "taken": "date", **USER_TYPES}
    stored = {d.id: d for d in library.get([d.id for d in docs[:60]])}
    for d in docs[:60]:
        assert stored[d.id].metadata == d.metadata
        assert stored[d.id].paths == d.paths


def test_hybrid_and_dense_bodies_carry_the_filter(spec):
    for name, f in FILTERS.items():
        if f is None:
            continue
        narrowed = Filters(search=f, types=USER_TYPES)
        clauses, exclusions = narrowed.clauses(), narrowed.exclusions()
        knn = q.knn_search_body(VEC, 10, filters=narrowed)
        spec.validate("POST", "/{index}/_search", knn)
        assert knn["query"]["knn"]["dense"]["filter"] == narrowed.as_query(), name
        hybrid = q.hybrid_search_body({"dog": 1.0, "car": 0.5}, VEC, 10, window=50, filters=narrowed)
        spec.validate("POST", "/{index}/_search", hybrid)
        sparse_part, dense_part = hybrid["query"]["hybrid"]["queries"]
        assert sparse_part["bool"].get("filter", []) == clauses and sparse_part["bool"].get("must_not", []) == exclusions
        assert sparse_part["bool"]["minimum_should_match"] == 1
        assert dense_part["knn"]["dense"]["filter"] == narrowed.as_query()
        two = q.two_phase_body({"dog": 1.0}, {"dog": 1.0, "car": 0.5}, 10, 100, filters=narrowed)
        spec.validate("POST", "/{index}/_search", two)
        assert "filter" not in two["rescore"]["query"]["rescore_query"]["bool"]  # the rescore only reorders


def test_seismic_takes_the_filter_in_its_parameters():
    from d2s_os_spec import OpenSearchSpec

    spec33 = OpenSearchSpec.load(strict=True, version="3.3.0")
    narrowed = Filters(search=FILTERS["combined"], types=USER_TYPES)
    body = q.seismic_search_body({"3": 1.0, "17": 0.5}, 10, filters=narrowed)
    spec33.validate("POST", "/{index}/_search", body)
    assert body["query"]["neural_sparse"]["sparse"]["method_parameters"]["filter"] == narrowed.as_query()
    assert "must_not" in narrowed.as_query()["bool"]  # the != condition


def test_clauses_are_counted_against_max_clause_count():
    f = F(folders=("/a", "/b", "/c"), where=(C("tag", "=", "x"), C("tag", "=", "y"), C("tag", "!=", "z"),
                                              C("rating", ">", 1.0)), after=year(2019), near=(1.0, 2.0, 3.0))
    narrowed = Filters(search=f, types=USER_TYPES)
    assert narrowed.count() == 3 + 2 + 1 + 1 + 1 + 1  # prefixes, alternatives, !=, range, dates, place
    query = {f"w{i:04d}": 1.0 + i / 1000 for i in range(3000)}
    body = q.sparse_search_body(query, 10, max_clauses=1024, filters=narrowed)
    assert len(body["query"]["bool"]["should"]) == 1024 - narrowed.count() - q.CLAUSE_MARGIN


def test_integer_fields_compare_with_whole_bounds():
    types: dict[str, str] = {}
    assert narrowing.filter_clauses(F(where=(C("width", ">", 700.5),)), types)[0] == [
        {"range": {"width": {"gte": 701}}}]
    assert narrowing.filter_clauses(F(where=(C("width", "<", 700.0),)), types)[0] == [
        {"range": {"width": {"lte": 699}}}]
    assert narrowing.filter_clauses(F(where=(C("width", "=", 700.5),)), types)[0] == [{"match_none": {}}]
    assert narrowing.filter_clauses(F(where=(C("width", "!=", 700.5),)), types) == ([], [])


# -- writes: metadata updates, declared fields, indexes made before the metadata fields ----------


@pytest.fixture
def small(make_backend, proxy, identity):
    b = make_backend(proxy.url)
    b.open(identity)
    b.declare_fields(USER_TYPES)
    docs = metadata_docs(40, dim=8, seed=9)
    b.upsert(docs)
    return b, docs


def test_set_metadata_changes_what_filters_find_not_the_vectors(small, proxy):
    b, docs = small
    rare = F(where=(C("camera", "=", RARE_CAMERA),))
    before = {d.id: d for d in b.get([d.id for d in docs])}
    target = next(d for d in docs if d.metadata.camera != RARE_CAMERA and d.metadata.fields)
    new = Metadata(year(2030), RARE_CAMERA, (35.0, 139.0), {"tag": "new"})
    sent_before = len(proxy.log)
    assert b.set_metadata({target.id: new, "f" * 64: new}) == 1  # an unknown id is left out
    assert b.set_metadata({target.id: new}) == 0  # unchanged: nothing written
    bulk = [json.loads(line) for s in proxy.log[sent_before:] if s.path.startswith("/_bulk") for line in s.body.splitlines()]
    assert bulk and all(set(line.get("doc", {})) <= set(narrowing.METADATA_KEYS) for line in bulk)
    assert not any("dense" in line.get("doc", {}) or "sparse" in line.get("doc", {}) for line in bulk)
    found = [h.id for h in b.sparse_search(dict(list(target.sparse.items())[:3]), 50, filters=rare)]
    assert target.id in found
    assert [h.id for h in b.browse(1)] == [target.id]  # taken in 2030: first in the library
    after = {d.id: d for d in b.get([d.id for d in docs])}
    assert after[target.id].metadata == new  # replaced whole: the other user fields are gone
    for d in docs:
        assert after[d.id].sparse == before[d.id].sparse and np.array_equal(after[d.id].dense, before[d.id].dense)
        assert d.id == target.id or after[d.id].metadata == before[d.id].metadata
    assert b.facets(F(where=(C("tag", "=", "new"),)))["camera"] == [(RARE_CAMERA, 1)]


def test_declare_fields_refuses_another_type(small):
    b, docs = small
    b.declare_fields({"rating": "number"})  # the same again: nothing to do
    with pytest.raises(MetadataError, match="'rating' is already a number field"):
        b.declare_fields({"rating": "keyword"})
    with pytest.raises(MetadataError, match="width"):
        b.declare_fields({"width": "number"})
    with pytest.raises(MetadataError, match="unknown type"):
        b.declare_fields({"mood": "colour"})
    b.declare_fields({"mood": "keyword"})
    assert b.field_types()["mood"] == "keyword"
    with pytest.raises(MetadataError, match="'rating' is a number field"):
        b.set_metadata({docs[0].id: Metadata(fields={"rating": "high"})})
    stray = dataclasses.replace(docs[1], id="e" * 64, path="/lib/new.jpg", metadata=Metadata(fields={"lens": "35mm"}))
    with pytest.raises(DocumentsRejectedError, match="'lens' is not declared"):
        b.upsert([stray])


def _old_index(url: str, name: str) -> None:
    """An index as d2s-search made it before the metadata fields, holding one document."""
    body = q.index_body(IDENT)
    for key in narrowing.metadata_properties():
        del body["mappings"]["properties"][key]
    body["aliases"] = {name: {}}
    assert httpx.put(f"{url}/{name}-000001", json=body).status_code == 200
    doc = dataclasses.replace(metadata_docs(1, dim=8, seed=3)[0], metadata=Metadata())
    source = {k: v for k, v in q.doc_source(doc).items() if k not in narrowing.METADATA_KEYS}
    assert httpx.put(f"{url}/{name}/_doc/{doc.id}", json=source, params={"refresh": "true"}).status_code in (200, 201)


def test_an_index_made_before_is_extended_when_opened_for_writing(osmem_url, make_backend):
    _old_index(osmem_url, "d2s-old")
    reader = make_backend(osmem_url, index_name="d2s-old")
    reader.open(None, create=False)  # read only: left as it is, and still answers
    assert "taken_at" not in json.dumps(httpx.get(f"{osmem_url}/d2s-old/_mapping").json())
    (old,) = reader.browse(10)
    assert reader.sparse_search({"w000": 1.0, "dog": 1.0, ".": 1.0}, 5, filters=F(near=(1.0, 1.0, 5.0))) == []
    assert reader.browse(10, F(after=year(2000))) == []
    writer = make_backend(osmem_url, index_name="d2s-old")
    writer.open(IDENT)
    mapping = httpx.get(f"{osmem_url}/d2s-old/_mapping").json()["d2s-old-000001"]["mappings"]["properties"]
    assert set(narrowing.metadata_properties()) <= set(mapping)
    writer.declare_fields(USER_TYPES)
    new = metadata_docs(12, dim=8, seed=4)[5:]
    writer.upsert(new)
    assert [h.id for h in writer.browse(20)] == library_order(new, F()) + [old.id]  # undated: last
    dated = F(after=year(2000))
    assert {h.id for h in writer.browse(20, dated)} == {d.id for d in passes(new, dated)}


def test_a_refused_mapping_update_is_one_line(proxy, make_backend):
    _old_index(proxy.upstream, "d2s-old")
    proxy.add("PUT", "/_mapping", "status", code=400)
    b = make_backend(proxy.url, index_name="d2s-old")
    with pytest.raises(IndexStoreError, match="refused to add the metadata fields") as err:
        b.open(IDENT)
    assert "\n" not in str(err.value)


def test_set_metadata_on_serverless_by_server_ids(osmem_url, make_backend, identity, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    collection = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, serverless=True))
    try:
        b = make_backend(collection.url, aws_service="aoss", aws_region="eu-west-1")
        b.open(identity)
        b.declare_fields(USER_TYPES)
        docs = metadata_docs(20, dim=8, seed=6)
        b.upsert(docs)
        target = docs[3]
        assert b.set_metadata({target.id: Metadata(camera=RARE_CAMERA)}) == 1
        rare = F(where=(C("camera", "=", RARE_CAMERA),))
        docs[3] = dataclasses.replace(target, metadata=Metadata(camera=RARE_CAMERA))
        assert [h.id for h in b.browse(5, rare)] == library_order(docs, rare) and target.id in library_order(docs, rare)
        assert b.get([target.id])[0].metadata == Metadata(camera=RARE_CAMERA)
        updates = [s for s in collection.log if s.path.startswith("/_bulk") and b'"update"' in s.body]
        assert updates and target.id.encode() not in updates[-1].body.splitlines()[0]  # the server's id
    finally:
        collection.close()


# -- last: everything the module sent -------------------------------------------------------------


def test_zz_every_request_matches_the_spec(spec, cluster, library, docs):
    from d2s_search.search import SearchOptions

    f = FILTERS["combined"]
    library.hybrid_search({"dog": 1.0, "w001": 0.5}, VEC, 10, filters=f)
    library.hybrid_search({"dog": 1.0}, VEC, SearchOptions(mode="hybrid", k=5, fusion="rrf"),
                          filters=FILTERS["tag not red"])
    paths = spec.paths_by_method()
    checked = set()
    for seen in cluster.log:
        path = seen.path.split("?")[0]
        template = max((t for rx, t in paths.get(seen.method, []) if rx.match(path)),
                       key=lambda t: len(re.sub(r"\{[^}]+\}", "", t)), default=None)  # most literal
        assert template, f"{seen.method} {path}"
        checked.add((seen.method, template))
        if not seen.body:
            continue
        if template == "/_bulk":
            spec.validate(seen.method, template, [json.loads(x) for x in seen.body.decode().splitlines()])
        else:
            spec.validate(seen.method, template, json.loads(seen.body))
    assert {("PUT", "/{index}/_mapping"), ("POST", "/_bulk"), ("POST", "/{index}/_search")} <= checked
    bodies = [s.body for s in cluster.log if s.path.split("?")[0].endswith("/_search")]
    assert any(b'"aggregations"' in b for b in bodies) and any(b'"geo_distance"' in b for b in bodies)
    assert any(b'"hybrid"' in b and b'"geo_distance"' in b for b in bodies)


def test_a_seismic_index_filters_its_sparse_and_dense_searches(osmem_url, make_backend, identity):
    """The SEISMIC index takes the filter in its method parameters; its dense sibling carries the
    metadata, so a dense search filters there, and a metadata update reaches both."""
    proxy = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, "3.3.0"))
    try:
        b = make_backend(proxy.url)
        b.create(identity, sparse_index="seismic", vocabulary=vocabulary())
        b.open(identity)
        b.declare_fields(USER_TYPES)
        docs = metadata_docs(150, dim=8, seed=8)
        b.upsert(docs)
        f = F(where=(C("tag", "!=", "red"), C("rating", ">=", 2.0)), after=year(2016))
        for query in queries(docs, f):
            query = dict(sorted(query.items(), key=lambda kv: -kv[1])[:10])  # SEISMIC keeps top_n = 10 tokens
            assert_ranking(b.sparse_search(query, 10, filters=f), filtered_ranking(query, docs, f)[:10])
        target = next(d for d in docs if not f.allows(d.paths, d.metadata, d.width, d.height, d.size_bytes))
        b.set_metadata({target.id: Metadata(year(2020), fields={"rating": 5.0})})
        docs = [dataclasses.replace(d, metadata=Metadata(year(2020), fields={"rating": 5.0})) if d is target else d
                for d in docs]
        ips = sorted(((d.id, float(np.dot(d.dense.astype(np.float64), VEC.astype(np.float64)))) for d in passes(docs, f)),
                     key=lambda x: (-x[1], x[0]))
        hits = b.dense_search(VEC, 200, filters=f)
        assert [h.id for h in hits] == [i for i, _ in ips] and target.id in {h.id for h in hits}
    finally:
        proxy.close()


def test_reindex_keeps_the_metadata_and_the_user_fields(small):
    b, docs = small
    f = F(where=(C("event", "<", year(2021)), C("favourite", "=", False)))
    before = [h.id for h in b.browse(50, f)]
    assert before == library_order(docs, f) and before
    b.reindex()  # server-side copy: the new generation maps the user's fields first
    assert [h.id for h in b.browse(50, f)] == before
    b.reindex(reencode=lambda d: d)  # through the client: read back and written with their metadata
    assert [h.id for h in b.browse(50, f)] == before
    assert b.field_types() == {**b.field_types(), **USER_TYPES}
    assert {d.id: d.metadata for d in b.get([d.id for d in docs])} == {d.id: d.metadata for d in docs}


def test_stored_metadata_is_read_as_untrusted():
    read = narrowing.document_metadata
    assert read({"taken_at": "soon", "camera": 5, "location": {"lat": 200, "lon": 0},
                 "fields": {"rating": "x", "tag": 3, "bad name": "a", "event": 1600000000000, "favourite": "yes",
                            "extra": True}}, USER_TYPES) == Metadata(fields={"event": 1600000000.0, "extra": True})
    assert read({"taken_at": 1500000000123, "location": {"lat": "48.5", "lon": 2}, "fields": []}, USER_TYPES) == \
        Metadata(taken_at=1500000000.123, location=(48.5, 2.0))
    assert read({"location": [2.0, 48.5], "taken_at": float("inf")}, {}) == Metadata()
