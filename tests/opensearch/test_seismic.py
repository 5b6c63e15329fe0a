"""The SEISMIC sparse index (OpenSearch 3.3+): request bodies against the 3.3 spec (refused by
3.1's), the vocabulary-id keys, and the backend end to end on osmem behind a stand-in that
does what neural-search 3.3.0.0 does below ``approximate_threshold``: exact scoring of the
``sparse_vector`` field (``SparseVectorFieldMapper`` indexes one FeatureField per id key)."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import numpy as np
import pytest
from d2s_os_faultproxy import FaultProxy
from d2s_os_reference import lucene_score, random_query, synthetic_docs, vocabulary
from d2s_os_spec import OpenSearchSpec

from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.cluster import Dialect
from d2s_search.backends.opensearch.seismic import Vocabulary
from d2s_search.errors import IndexStoreError, QueryError

VOCAB = vocabulary()
VEC = np.linspace(-1, 1, 8).astype(np.float32)


def test_bodies_match_the_3_3_spec_and_not_3_1():
    s33 = OpenSearchSpec.load(strict=True, version="3.3.0")
    s31 = OpenSearchSpec.load(strict=True, version="3.1.0")
    index = q.index_body(sparse_index="seismic", seismic={"n_postings": 4000, "cluster_ratio": 0.1})
    search = q.seismic_search_body({"12": 1.5, "7": 0.25}, 10, offset=10, top_n=20, heap_factor=1.2,
                                   filters=q.Filters("a/"))
    hybrid = q.hybrid_search_body({}, VEC, 10, window=100, dialect=Dialect.of("3.3.0"),
                                  sparse_clause=q.seismic_query({"12": 1.5}, 100))
    s33.validate("PUT", "/{index}", index)
    s33.validate("POST", "/{index}/_search", search)
    s33.validate("POST", "/{index}/_search", hybrid)
    for method, path, body in (("PUT", "/{index}", index), ("POST", "/{index}/_search", search)):
        with pytest.raises(jsonschema.ValidationError):
            s31.validate(method, path, body)
    with pytest.raises(jsonschema.ValidationError):  # Seismic.validateMethod: "Unknown parameter"
        s33.validate("PUT", "/{index}", q.index_body(sparse_index="seismic", seismic={"n_posting": 3}))
    assert index["settings"]["index"]["sparse"] is True
    assert search["query"]["neural_sparse"]["sparse"]["method_parameters"]["k"] == 20  # offset + k per shard


def test_vocabulary_ids():
    v = Vocabulary(["[PAD]", "dog", "car", "a.m."], "f" * 32)
    ids = v.to_ids({"dog": 1.5, "a.m.": 0.5, "unknown": 2.0, "car": 0.0, "[PAD]": float("nan")})
    assert ids == {"1": 1.5, "3": 0.5}
    assert all(k.isdigit() for k in ids)  # SparseVectorFieldMapper: non-negative integer keys
    assert v.from_ids(ids) == {"dog": 1.5, "a.m.": 0.5}
    assert Vocabulary.from_json(json.loads(json.dumps(v.to_json()))).terms == v.terms
    with pytest.raises(IndexStoreError):
        Vocabulary.from_json({"terms": "dog car"})


class Seismic33:
    """A 3.3 cluster in front of osmem, for a corpus under approximate_threshold (exact scoring)."""

    def __init__(self, osmem_url: str) -> None:
        self.osmem = osmem_url

    def __call__(self, method: str, path: str, body: bytes):
        path = path.split("?")[0]
        if method == "GET" and path == "/":
            return 200, {"cluster_name": "c", "version": {"distribution": "opensearch", "number": "3.3.0"}}
        if method == "PUT" and body and b'"sparse_vector"' in body:
            doc = json.loads(body)
            assert doc["settings"]["index"].pop("sparse") is True
            doc["mappings"]["properties"]["sparse"] = {"type": "rank_features"}  # FeatureField per id
            resp = httpx.put(self.osmem + path, json=doc)
            return resp.status_code, resp.json()
        if path.endswith("/_search") and b'"method_parameters"' in (body or b""):
            doc = json.loads(body)
            ns = doc["query"]["neural_sparse"]["sparse"]
            params = ns["method_parameters"]
            top = dict(sorted(ns["query_tokens"].items(), key=lambda kv: -kv[1])[: params["top_n"]])
            should = [{"rank_feature": {"field": f"sparse.{t}", "linear": {}, "boost": w}} for t, w in top.items()]
            doc["query"] = {"bool": {"should": should, "minimum_should_match": 1}}
            if "filter" in params:
                doc["query"]["bool"]["filter"] = [params["filter"]]
            resp = httpx.post(self.osmem + path, json=doc)
            return resp.status_code, resp.json()
        return None


@pytest.fixture
def seismic_proxy(osmem_url):
    p = FaultProxy(osmem_url, stub=Seismic33(osmem_url))
    yield p
    p.close()


def test_backend_on_a_seismic_index(make_backend, seismic_proxy, identity):
    b = make_backend(seismic_proxy.url)
    b.create(identity, sparse_index="seismic", vocabulary=VOCAB)
    b.open(identity)
    assert b.vocabulary is not None and b.vocabulary.terms == VOCAB
    docs = synthetic_docs(80, dim=8, vocab=VOCAB, seed=3)
    b.upsert(docs)
    bulk = [json.loads(x) for s in seismic_proxy.seen("POST", "/_bulk") for x in s.body.decode().splitlines()]
    stored = [x["sparse"] for x in bulk if "sparse" in x]
    assert stored and all(k.isdigit() and int(k) < len(VOCAB) for sp in stored for k in sp)
    # a new backend finds the vocabulary on open
    again = make_backend(seismic_proxy.url)
    again.open(identity, create=False)
    again.seismic_top_n = 50
    query = random_query(VOCAB, np.random.default_rng(4), n_terms=12)
    hits = again.sparse_search(query, 10)
    want = sorted(((d.id, s) for d in docs if (s := lucene_score(query, d.sparse)) is not None),
                  key=lambda t: (-t[1], t[0]))[:10]
    assert [h.id for h in hits] == [i for i, _ in want]
    assert hits[0].matched and all(t in query for t, _ in hits[0].matched)  # terms, not ids
    got = again.get([docs[0].id])[0]
    assert set(got.sparse) <= set(VOCAB) and got.sparse.keys() == {t for t, w in docs[0].sparse.items() if w > 0}
    with pytest.raises(QueryError, match="two-phase"):
        again.two_phase_search(query, query, 5, 10)
    sent = [json.loads(s.body) for s in seismic_proxy.seen("POST", "/_search") if s.body]
    assert any(re.search('"method_parameters"', json.dumps(x)) for x in sent)
    again.drop()
    assert httpx.head(f"{seismic_proxy.upstream}/d2s-test-vocabulary").status_code == 404


def test_seismic_needs_3_3(make_backend, proxy, identity):
    b = make_backend(proxy.url)  # osmem reports 3.8.0: allowed; an older cluster is refused
    b._cluster = None
    from d2s_search.backends.opensearch.cluster import ClusterInfo

    b._cluster = ClusterInfo(version=(3, 1, 0))
    with pytest.raises(IndexStoreError, match="3.3"):
        b.create(identity, sparse_index="seismic", vocabulary=VOCAB)
