"""Everything against a real OpenSearch cluster, kNN and hybrid included: ``pytest -m opensearch``.

Set D2S_OPENSEARCH_URL (and D2S_OPENSEARCH_USER / _PASSWORD / _API_KEY / _CA_FILE as needed);
each test works in its own throw-away index. Skipped, with that reason, when no URL is set.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from d2s_os_reference import exact_dot, random_query, ranking, synthetic_docs, ulps, vocabulary

from d2s_search.backends.base import IndexIdentity
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.errors import IndexStoreError, QueryError

# Read at import: tests/conftest.py clears D2S_* variables around every test.
ENV = {k: v for k, v in os.environ.items() if k.startswith("D2S_OPENSEARCH_")}

pytestmark = [
    pytest.mark.opensearch,
    pytest.mark.skipif(
        not ENV.get("D2S_OPENSEARCH_URL"),
        reason="D2S_OPENSEARCH_URL is not set: no real OpenSearch cluster to test against",
    ),
]

DIM = 16
N = 200


@pytest.fixture
def real():
    name = f"d2s-pytest-{uuid.uuid4().hex[:8]}"
    b = OpenSearchBackend.from_env(env=ENV, index_name=name)
    ident = IndexIdentity(fingerprint=uuid.uuid4().hex, dense_dim=DIM, model="synthetic")
    b.open(ident)
    docs = synthetic_docs(N, dim=DIM, seed=5)
    b.upsert(docs)
    try:
        yield b, docs
    finally:
        b.drop()
        b.close()


def test_sparse_matches_lucene_reference(real):
    b, docs = real
    rng = np.random.default_rng(1)
    for _ in range(10):
        query = random_query(vocabulary(), rng)
        hits = b.sparse_search(query, 10)
        expected = ranking(query, docs)[:10]
        assert [h.id for h in hits] == [i for i, _ in expected]
        assert all(ulps(h.score, s) <= 1 for h, (_, s) in zip(hits, expected, strict=True))


def test_two_phase_and_filters(real):
    b, docs = real
    full = random_query(vocabulary(), np.random.default_rng(2), n_terms=20)
    first = dict(list(full.items())[:4])
    by_id = {d.id: d for d in docs}
    cand = [i for i, _ in ranking(first, docs)[:30]]
    want = sorted(cand, key=lambda i: -exact_dot(full, by_id[i].sparse))[:10]
    hits = b.two_phase_search(first, full, 10, 30)
    assert {h.id for h in hits[:5]} <= set(want)
    assert all(h.path.startswith("photos/cats/") for h in b.sparse_search(full, 10, path_prefix="photos/cats/"))


def test_neural_sparse_agrees_with_rank_feature(real):
    b, docs = real
    query = random_query(vocabulary(), np.random.default_rng(3))
    if not b.dialect().neural_sparse_tokens:  # neural-search 2.14.0.0 adds query_tokens
        with pytest.raises(QueryError, match="2.14"):
            b.sparse_search(query, 10, neural_sparse=True)
        return
    try:
        neural = b.sparse_search(query, 10, neural_sparse=True)
    except IndexStoreError as exc:
        pytest.skip(f"neural_sparse not available on this cluster (neural-search plugin): {exc}")
    plain = b.sparse_search(query, 10)
    assert [h.id for h in neural] == [h.id for h in plain]
    assert all(ulps(a.score, c.score) <= 2 for a, c in zip(neural, plain, strict=True))


def test_knn_inner_product(real):
    b, docs = real
    target = docs[17]
    hits = b.dense_search(target.dense, 5, explain_with={"w000": 1.0})
    assert hits[0].id == target.id
    assert hits[0].score == pytest.approx(float(np.dot(target.dense, target.dense)), abs=1e-4)
    by_id = {d.id: d for d in docs}
    for h in hits:
        assert h.score == pytest.approx(float(np.dot(by_id[h.id].dense, target.dense)), abs=1e-4)
    exact = sorted(docs, key=lambda d: -float(np.dot(d.dense, target.dense)))[:5]
    assert len({h.id for h in hits} & {d.id for d in exact}) >= 4  # HNSW is approximate


@pytest.mark.parametrize("method", ["min_max", "rrf"])
def test_hybrid(real, method):
    b, docs = real
    target = docs[42]
    query = dict(sorted(target.sparse.items(), key=lambda kv: -kv[1])[:8])
    try:
        hits = b.hybrid_search(query, target.dense, 10, method=method, weights=(0.3, 0.7))
    except IndexStoreError as exc:
        pytest.skip(f"hybrid search not available on this cluster (neural-search plugin): {exc}")
    assert hits and hits[0].id == target.id  # best in both runs
    assert hits[0].parts["dense"] == pytest.approx(1.0, abs=1e-4)
    assert hits[0].parts["sparse"] == pytest.approx(exact_dot(query, target.sparse), rel=1e-5)
    page2 = b.hybrid_search(query, target.dense, 5, method=method, weights=(0.3, 0.7), offset=5)
    assert [h.id for h in page2] == [h.id for h in hits[5:10]]


def test_reindex_and_stats(real):
    b, docs = real
    if b.serverless:
        with pytest.raises(IndexStoreError, match="not offered on Amazon OpenSearch Serverless"):
            b.reindex()
        return
    if not b.dialect().lucene_inner_product:  # k-NN 2.13.0.0: inner product on Lucene HNSW
        with pytest.raises(IndexStoreError, match="2.13"):
            b.reindex(engine="lucene")
        return
    out = b.reindex(engine="lucene")
    assert out["documents"] == N
    st = b.stats()
    assert st["documents"] == N and st["indices"] == [out["to"]]
    assert b.dense_search(docs[3].dense, 1)[0].id == docs[3].id


def test_hybrid_pages_fuse_one_pool(real):
    """pagination_depth (2.19+) or the client-side cut: page 1 + page 2 = the top 10 of one pool."""
    b, docs = real
    target = docs[7]
    query = dict(sorted(target.sparse.items(), key=lambda kv: -kv[1])[:8])
    try:
        top = b.hybrid_search(query, target.dense, 10, window=50)
    except IndexStoreError as exc:
        pytest.skip(f"hybrid search not available on this cluster (neural-search plugin): {exc}")
    pages = b.hybrid_search(query, target.dense, 5, window=50) + b.hybrid_search(query, target.dense, 5, window=50,
                                                                                offset=5)
    assert [h.id for h in pages] == [h.id for h in top]
    assert len({h.id for h in pages}) == 10


def test_doctor_on_the_real_cluster(real):
    from d2s_search.backends.opensearch.doctor import diagnose

    b, _ = real
    report = diagnose(b, b.identity)
    by = {c.name: c for c in report.checks}
    assert not report.failed, [c.to_json() for c in report.checks if c.status == "fail"]
    assert by["reachable"].status == "ok" and by["plans"].data["plans"]["sparse"]
    assert by["index"].data["documents"] in (N, None)  # None: counting is not offered (Serverless)


def test_every_plan_doctor_lists_as_working_works(real):
    from d2s_search.backends.opensearch.doctor import diagnose

    b, docs = real
    plans = {c.name: c for c in diagnose(b, b.identity).checks}["plans"].data["plans"]
    target = docs[21]
    query = dict(sorted(target.sparse.items(), key=lambda kv: -kv[1])[:8])
    if plans["dense"]:
        assert b.dense_search(target.dense, 3)[0].id == target.id
    if plans["neural_sparse"]:
        assert b.sparse_search(query, 3, neural_sparse=True)[0].id == b.sparse_search(query, 3)[0].id
    if plans["hybrid min-max"]:
        assert b.hybrid_search(query, target.dense, 3)[0].id == target.id
    if plans["hybrid rrf"]:
        assert b.hybrid_search(query, target.dense, 3, method="rrf")[0].id == target.id


def test_seismic_index_on_3_3(real):
    b, docs = real
    if not b.dialect().sparse_vector:
        pytest.skip(f"SEISMIC needs OpenSearch 3.3+ (cluster: {b.cluster().to_json()['version']})")
    name = f"{b.index_name}-seismic"
    s = OpenSearchBackend.from_env(env=ENV, index_name=name)
    try:
        s.create(b.identity, sparse_index="seismic", vocabulary=vocabulary())
        s.open(b.identity)
        s.upsert(docs)
        s.seismic_top_n = 50
        query = random_query(vocabulary(), np.random.default_rng(3), n_terms=10)
        hits = s.sparse_search(query, 10)
        want = [i for i, _ in ranking(query, docs)[:10]]
        assert len(set(h.id for h in hits) & set(want)) >= 8  # exact below approximate_threshold
        # no k-NN in the SEISMIC index: the dense vectors are in its sibling, hybrid is fused here
        assert s.dense_index == f"{name}-dense" and s.stats()["dense_index"] == s.dense_index
        target = docs[11]
        assert s.dense_search(target.dense, 3)[0].id == target.id
        strongest = dict(sorted(target.sparse.items(), key=lambda kv: -kv[1])[:8])
        fused = s.hybrid_search(strongest, target.dense, 5)
        assert fused[0].id == target.id and s.last_fusion == "client-minmax"
    finally:
        s.drop()
        s.close()


def test_one_index_cannot_have_both_codec_factories(real):
    """Why a SEISMIC index has no k-NN: the cluster refuses index.knn with index.sparse
    (EngineConfigFactory: "existing codec service factory already overridden")."""
    b, _ = real
    if not b.dialect().sparse_vector or b.serverless:
        pytest.skip("needs OpenSearch 3.3+ with neural-search (not Serverless)")
    from d2s_search.backends.opensearch import queries as q

    body = q.index_body(b.identity, sparse_index="seismic")
    body["settings"]["index"]["knn"] = True
    name = f"{b.index_name}-both"
    reply = b.http.request("PUT", f"/{name}", json_body=body)
    if reply.ok:  # a release that lets plugins share an index: nothing to guard against there
        b.http.request("DELETE", f"/{name}")
        pytest.skip("this cluster accepts index.knn with index.sparse")
    assert "codec service factory" in reply.error_reason()


def test_lucene_engine_follows_the_knn_release(real):
    b, docs = real
    if b.serverless:
        pytest.skip("the engine of a Serverless collection is its own")
    name = f"{b.index_name}-lucene"
    s = OpenSearchBackend.from_env(env=ENV, index_name=name)
    try:
        if not b.dialect().lucene_inner_product:
            with pytest.raises(IndexStoreError, match="2.13"):
                s.create(b.identity, engine="lucene")
            return
        s.create(b.identity, engine="lucene")
        s.open(b.identity)
        s.upsert(docs[:50])
        assert s.dense_search(docs[9].dense, 1)[0].id == docs[9].id
    finally:
        s.drop()
        s.close()


def test_the_connection_works_on_the_installed_client(real):
    """The transport resolves its arguments itself (Transport._resolve_request_args takes 3
    arguments before opensearch-py 2.8.0 and 5 from it)."""
    import opensearchpy

    b, _ = real
    assert b.http.client.indices.exists(index=b.index_name) is True
    assert opensearchpy.__versionstr__


def test_serverless_reingest_finds_documents_by_their_hash(real):
    b, docs = real
    if not b.serverless:
        pytest.skip("D2S_OPENSEARCH_AWS_SERVICE is not aoss")
    import time

    from d2s_search.backends.opensearch import serverless as aoss

    deadline = time.monotonic() + 120  # new documents become searchable on their own
    while len(b.ids_present([d.id for d in docs])) < N and time.monotonic() < deadline:
        time.sleep(5)
    b.upsert(docs[:20])  # the same pictures again: replaced, not added
    while time.monotonic() < deadline:
        stored = aoss.stored_documents(b._search, [d.id for d in docs[:20]], False)
        if len(stored) == 20 and len(b.ids_present([d.id for d in docs])) == N:
            break
        time.sleep(5)
    assert len(aoss.stored_documents(b._search, [d.id for d in docs[:20]], False)) == 20
    assert dict(b.document_paths(page=50)).keys() == {d.id for d in docs}
