"""The SEISMIC sparse index (OpenSearch 3.3+): request bodies against the 3.3 spec (refused by
3.1's), the vocabulary-id keys, and the backend end to end on osmem behind the plugin
stand-in (tests/opensearch/plugins.py): neural-search 3.3.0.0 below ``approximate_threshold``
scores the ``sparse_vector`` field exactly, and an index asking for both k-NN's and
neural-search's codec service factories is refused as core refuses it. A SEISMIC index therefore
carries no ``index.knn`` and no ``knn_vector``: the dense vectors live in ``<name>-dense``."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import numpy as np
import pytest
from d2s_os_faultproxy import FaultProxy
from d2s_os_plugins import CODEC_CONFLICT, PluginStandIn
from d2s_os_reference import lucene_score, random_query, synthetic_docs, vocabulary
from d2s_os_spec import OpenSearchSpec

from d2s_search.backends.engine import narrowing
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


@pytest.fixture
def seismic_proxy(osmem_url):
    """OpenSearch 3.3 with k-NN and neural-search (tests/opensearch/plugins.py) in front of osmem."""
    p = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, "3.3.0"))
    yield p
    p.close()


def test_backend_on_a_seismic_index(seismic_proxy, make_backend, identity):
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


# -- one index cannot have both codec service factories ----------------------------------------


def test_a_seismic_index_carries_no_knn_and_its_sibling_has_the_vectors():
    s33 = OpenSearchSpec.load(strict=True, version="3.3.0")
    index = q.index_body(sparse_index="seismic")
    assert "knn" not in index["settings"]["index"] and index["settings"]["index"]["sparse"] is True
    assert all(f.get("type") != "knn_vector" for f in index["mappings"]["properties"].values())
    assert index["mappings"]["_meta"]["dense_vectors"] == q.DENSE_SIBLING
    sibling = q.dense_index_body(engine="lucene")
    assert sibling["settings"]["index"]["knn"] is True and "sparse" not in sibling["settings"]["index"]
    # the vectors, what a hit shows, and the metadata a dense search filters by
    assert set(sibling["mappings"]["properties"]) == {"dense", "path", "url", *narrowing.metadata_properties()}
    s33.validate("PUT", "/{index}", index)
    s33.validate("PUT", "/{index}", sibling)


@pytest.fixture
def seismic_corpus(seismic_proxy, make_backend, identity):
    b = make_backend(seismic_proxy.url)
    b.create(identity, sparse_index="seismic", vocabulary=VOCAB)
    b.open(identity)
    docs = synthetic_docs(60, dim=8, vocab=VOCAB, seed=3)
    b.upsert(docs)
    return b, docs


def test_created_on_a_3_3_cluster_with_knn_and_neural_search(spec, seismic_corpus, seismic_proxy):
    # what the 3.3 cluster answers to both settings, or to a k-NN method without index.knn
    # (the stand-in, as plugins.py cites): why the SEISMIC index has no k-NN
    both = q.index_body(sparse_index="seismic")
    both["settings"]["index"]["knn"] = True
    reply = httpx.put(f"{seismic_proxy.url}/both", json=both)
    assert reply.status_code == 500
    assert reply.json()["error"]["root_cause"][0] == {"type": "illegal_state_exception", "reason": CODEC_CONFLICT}
    no_knn = q.index_body(sparse_index="seismic")
    no_knn["mappings"]["properties"]["dense"] = {"type": "knn_vector", "dimension": 8, "method": {
        "name": "hnsw", "space_type": "innerproduct", "engine": "faiss"}}
    reply = httpx.put(f"{seismic_proxy.url}/no-knn", json=no_knn)
    assert reply.status_code == 400 and "index.knn setting is false" in reply.text
    b, _ = seismic_corpus
    puts = {s.path: json.loads(s.body) for s in seismic_proxy.log if s.method == "PUT" and s.body}
    main, sibling = puts["/d2s-test-000001"], puts["/d2s-test-dense"]
    assert "knn" not in main["settings"]["index"] and "dense" not in main["mappings"]["properties"]
    assert sibling["settings"]["index"]["knn"] is True
    for body in (main, sibling):
        spec.validate("PUT", "/{index}", body)
    assert b.dense_index == "d2s-test-dense" and b.stats()["dense_index"] == "d2s-test-dense"
    assert not [s for s in seismic_proxy.log if s.method == "PUT" and s.action != "forward"]


def test_dense_and_hybrid_use_the_sibling_and_say_they_fused_here(seismic_corpus, make_backend, seismic_proxy,
                                                                   identity):
    from d2s_search.search import QueryVectors, SearchOptions, run_query

    b, docs = seismic_corpus
    again = make_backend(seismic_proxy.url)
    again.open(identity, create=False)
    assert again.dense_index == "d2s-test-dense"
    vec = docs[7].dense
    hits = again.dense_search(vec, 5, explain_with=dict(list(docs[7].sparse.items())[:6]))
    ips = sorted(((float(np.dot(d.dense, vec)), d.id) for d in docs), reverse=True)[:5]
    assert [h.id for h in hits] == [i for _, i in ips]
    assert all(abs(h.score - ip) < 1e-5 for h, (ip, _) in zip(hits, ips, strict=True))
    assert hits[0].matched  # the terms come from the SEISMIC index's stored weights
    assert [s for s in seismic_proxy.seen("POST", "/d2s-test-dense/_search") if b'"knn"' in s.body]
    sparse = dict(list(docs[7].sparse.items())[:8])
    query = QueryVectors(full=sparse, own=sparse, dense=vec)
    again.seismic_top_n = 50
    result = run_query(again, query, SearchOptions(mode="hybrid", k=5, window=30))
    assert result.fusion == "client-minmax" and result.hits[0].id == docs[7].id
    assert set(result.hits[0].parts) == {"sparse", "dense"}
    assert run_query(again, query, SearchOptions(mode="hybrid", k=5, fusion="rrf")).fusion == "client-rrf"
    assert not seismic_proxy.seen("PUT", "/_search/pipeline")  # no hybrid query, no pipeline


def test_documents_live_in_both_indices(seismic_corpus, seismic_proxy):
    b, docs = seismic_corpus
    assert b.ids_present([d.id for d in docs[:5]]) == {d.id for d in docs[:5]}
    got = b.get([docs[2].id])[0]
    assert np.array_equal(got.dense, docs[2].dense) and got.path == docs[2].path
    httpx.delete(f"{seismic_proxy.upstream}/d2s-test-dense/_doc/{docs[3].id}", params={"refresh": "true"})
    assert docs[3].id not in b.ids_present([docs[3].id])  # half a document is not stored: ingest again
    assert b.delete([docs[0].id, docs[1].id]) == 2
    for index in ("d2s-test-000001", "d2s-test-dense"):
        assert httpx.get(f"{seismic_proxy.upstream}/{index}/_doc/{docs[0].id}").json()["found"] is False
    b.drop()
    for index in ("d2s-test-dense", "d2s-test-vocabulary", "d2s-test-000001"):
        assert httpx.head(f"{seismic_proxy.upstream}/{index}").status_code == 404


def test_a_moved_picture_moves_in_both_indices(seismic_corpus, seismic_proxy):
    b, docs = seismic_corpus
    assert b.relink(found={"photos/moved/0004.jpg": docs[4].id}, gone=[docs[4].path]) == 0
    for index in ("d2s-test-000001", "d2s-test-dense"):
        source = httpx.get(f"{seismic_proxy.upstream}/{index}/_doc/{docs[4].id}").json()["_source"]
        assert source["path"] in ("photos/moved/0004.jpg", ["photos/moved/0004.jpg"])
    dense = b.dense_search(docs[4].dense, 1)
    assert dense[0].id == docs[4].id and dense[0].path == "photos/moved/0004.jpg"
    assert b.relink(gone=["photos/moved/0004.jpg"]) == 1
    for index in ("d2s-test-000001", "d2s-test-dense"):
        assert httpx.get(f"{seismic_proxy.upstream}/{index}/_doc/{docs[4].id}").json()["found"] is False
