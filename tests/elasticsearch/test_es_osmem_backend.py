"""The Elasticsearch backend, on the official client, against a real HTTP server.

The server is osmem-server (in-memory, OpenSearch-compatible: the same ``_bulk``,
``rank_features``, ``rank_feature`` and ``rescore`` API as Elasticsearch) behind
``esproxy.CompatProxy``, a small local proxy that turns the client's REST-compatibility media
types (``application/vnd.elasticsearch+json; compatible-with=8``) into plain JSON, adds
``X-Elastic-Product: Elasticsearch`` to answers, and hands osmem a ``knn_vector`` where the
mapping says ``dense_vector`` (osmem has no such type). kNN and the RRF retriever are not
run here: their bodies are checked against the specification (test_request_bodies.py) and
they run in test_real_elasticsearch.py against a cluster.
"""

from __future__ import annotations

from dataclasses import replace

import httpx
import numpy as np
import pytest
from d2s_os_reference import lucene_score, random_query, ranking, synthetic_docs, ulps, vocabulary

from d2s_search.backends.base import Backend, Document, IndexIdentity
from d2s_search.errors import (
    BackendUnavailableError,
    BundleMismatchError,
    DocumentsRejectedError,
    QueryError,
)

N_DOCS = 300


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


@pytest.fixture
def backend(make_backend, es_proxy, identity):
    b = make_backend(es_proxy.url)
    b.open(identity)
    return b


@pytest.fixture
def corpus(backend):
    docs = synthetic_docs(N_DOCS, dim=8, seed=1)
    backend.upsert(docs)
    return docs


def test_backend_satisfies_protocol(backend):
    assert isinstance(backend, Backend)
    assert backend.name == "elasticsearch"


def test_requests_carry_the_compatibility_media_type(backend, corpus, es_proxy):
    """The 9.x client would send compatible-with=9, which an 8.x server refuses."""
    sent = [s for s in es_proxy.sent if s.body]
    assert sent
    for s in sent:
        want = "x-ndjson" if s.path.startswith("/_bulk") else "json"
        assert s.content_type == f"application/vnd.elasticsearch+{want}; compatible-with=8", s.path
        assert s.accept == "application/vnd.elasticsearch+json; compatible-with=8"


def test_ingest_round_trip_and_stats(backend, corpus):
    assert backend.ids_present([d.id for d in corpus] + ["nope"]) == {d.id for d in corpus}
    got = backend.get([corpus[5].id, "nope", corpus[2].id])
    assert [d.id for d in got] == [corpus[5].id, corpus[2].id]
    for stored, orig in zip(got, [corpus[5], corpus[2]], strict=True):
        assert stored.sparse == {t: float(np.float32(w)) for t, w in orig.sparse.items()}
        assert np.array_equal(stored.dense, orig.dense)
        assert stored.path == orig.path
    stats = backend.stats()
    assert stats["documents"] == N_DOCS
    assert stats["indices"] == ["d2s-test-000001"]
    assert stats["bundle_fingerprint"] == "e" * 32
    assert stats["sparse_type"] == "rank_features"


def test_sparse_search_equals_brute_force(backend, corpus):
    rng = np.random.default_rng(7)
    vocab = vocabulary()
    for _ in range(5):
        query = random_query(vocab, rng)
        expected = ranking(query, corpus)
        hits = backend.sparse_search(query, 10)
        assert [h.id for h in hits] == [i for i, _ in expected[:10]]
        for h, (_, s) in zip(hits, expected, strict=False):
            assert ulps(h.score, s) <= 1, (h.score, s)
        # Matched terms use the exact stored weights, largest contribution first.
        doc = next(d for d in corpus if d.id == hits[0].id)
        contributions = sorted(((t, w * doc.sparse[t]) for t, w in query.items() if t in doc.sparse),
                               key=lambda tc: -tc[1])[:5]
        assert [t for t, _ in hits[0].matched] == [t for t, _ in contributions]


def test_two_phase_rescores_window_with_full_query(backend, corpus):
    rng = np.random.default_rng(3)
    vocab = vocabulary()
    full = random_query(vocab, rng, n_terms=14)
    first = dict(list(full.items())[:3])
    hits = backend.two_phase_search(first, full, 10, window=40)
    # Brute force: the 40 best by `first`, re-ranked by `full`.
    window = [i for i, _ in ranking(first, corpus)[:40]]
    by_id = {d.id: d for d in corpus}
    rescored = sorted(((i, lucene_score(full, by_id[i].sparse)) for i in window), key=lambda x: -x[1])[:10]
    assert [h.id for h in hits] == [i for i, _ in rescored]
    for h, (_, s) in zip(hits, rescored, strict=True):
        assert ulps(h.score, s) <= 1


def test_tricky_terms_are_stored_and_searchable(backend):
    vocab = vocabulary()
    dense = unit(np.ones(8))
    docs = [Document(id=f"t{i}", path=f"t/{i}.jpg", size_bytes=1, width=1, height=1,
                     sparse={term: 1.0 + i, "common": 0.5}, dense=dense)
            for i, term in enumerate(vocab[:60])]
    backend.upsert(docs)
    for i, term in enumerate(vocab[:60]):
        hits = backend.sparse_search({term: 1.0}, 3)
        assert [h.id for h in hits] == [f"t{i}"], term
        assert hits[0].matched == [(term, 1.0 + i)]


def test_path_prefix_filter(backend, corpus):
    query = random_query(vocabulary(), np.random.default_rng(11))
    hits = backend.sparse_search(query, 10, path_prefix="photos/cats/")
    expected = ranking(query, corpus, only=lambda d: d.path.startswith("photos/cats/"))
    assert [h.id for h in hits] == [i for i, _ in expected[:10]]


def test_non_unit_vector_refused_for_dot_product_others_stored(backend, corpus):
    bad = Document(id="b" * 64, path="b.jpg", size_bytes=1, width=1, height=1, sparse={"dog": 1.0},
                   dense=np.full(8, 2.0, np.float32))
    good = Document(id="c" * 64, path="c.jpg", size_bytes=1, width=1, height=1, sparse={"dog": 1.0},
                    dense=unit(np.arange(1, 9, dtype=np.float32)))
    with pytest.raises(DocumentsRejectedError) as info:
        backend.upsert([bad, good])
    assert set(info.value.failures) == {"b" * 64}
    assert "unit" in info.value.failures["b" * 64]
    assert backend.ids_present(["b" * 64, "c" * 64]) == {"c" * 64}


def test_busy_bulk_items_are_resent_refused_ones_reported(backend, es_proxy, sleeps):
    docs = synthetic_docs(20, dim=8, seed=5, prefix="busy")
    es_proxy.add("POST", "/_bulk", "busy_items", every=2)
    es_proxy.add("POST", "/_bulk", "reject_items", ids={docs[2].id})
    with pytest.raises(DocumentsRejectedError) as info:
        backend.upsert(docs)
    assert set(info.value.failures) == {docs[2].id}
    assert backend.ids_present([d.id for d in docs]) == {d.id for d in docs} - {docs[2].id}
    bulks = es_proxy.seen("POST", "/_bulk")
    assert [b.items for b in bulks[:2]] == [20, 10]  # the second request resends only the busy half
    assert len(sleeps) == 1


def test_a_chunk_refused_as_too_large_is_sent_again_in_halves(backend, es_proxy, sleeps):
    docs = synthetic_docs(20, dim=8, seed=6, prefix="large")
    es_proxy.add("POST", "/_bulk", "status", code=413)
    backend.upsert(docs)
    assert [b.items for b in es_proxy.seen("POST", "/_bulk")] == [20, 10, 10]
    assert backend.ids_present([d.id for d in docs]) == {d.id for d in docs}
    assert sleeps == []  # a smaller request is not a retry of a busy server: no back-off


def test_delete_counts_existing(backend, corpus):
    assert backend.delete([corpus[0].id, corpus[1].id, "nope"]) == 2
    assert backend.stats()["documents"] == N_DOCS - 2


def test_bundle_mismatch_refused(make_backend, es_proxy, backend, corpus):
    other = make_backend(es_proxy.url)
    with pytest.raises(BundleMismatchError, match="eeeeeeeeeeee"):
        other.open(IndexIdentity(fingerprint="a" * 32, dense_dim=8))
    with pytest.raises(BundleMismatchError, match="8-d"):
        other.open(IndexIdentity(fingerprint="e" * 32, dense_dim=16))


def test_drop_removes_only_our_index(backend, corpus):
    assert backend.exists()
    backend.drop()
    assert not backend.exists()


def test_sparse_vector_mapping_refused_on_old_server(make_backend, es_proxy, identity):
    """osmem is not Elasticsearch, so the backend assumes 8.0: no sparse_vector (8.11+)."""
    from d2s_search.backends.elasticsearch.queries import VectorMapping
    from d2s_search.errors import IndexStoreError

    b = make_backend(es_proxy.url, index_name="sv", mapping=VectorMapping(sparse_type="sparse_vector"))
    with pytest.raises(IndexStoreError, match="sparse_vector needs Elasticsearch 8.11"):
        b.open(identity)
    assert not b.exists()


def test_empty_query_refused(backend):
    with pytest.raises(QueryError):
        backend.sparse_search({"zero": 0.0}, 5)


def test_unreachable_server_is_one_line_without_secrets(make_backend):
    b = make_backend("http://127.0.0.1:9", user="elastic", password="s3cret-pw", retries=0)
    with pytest.raises(BackendUnavailableError) as info:
        b.exists()
    assert "s3cret-pw" not in str(info.value)
    assert "\n" not in str(info.value)


def test_vectors_kept_in_source_on_9x_retried_without_on_servers_lacking_the_setting(make_backend, osmem_url,
                                                                                    identity):
    """On 9.x the index asks to keep vectors in _source; a server that does not know the setting
    (osmem answers as Elasticsearch would: "unknown setting [...]") gets the index without it."""
    from d2s_es_proxy import CompatProxy

    proxy = CompatProxy(osmem_url, pretend_version="9.0.0")
    try:
        b = make_backend(proxy.url, index_name="nine")
        b.open(identity)
        puts = [s for s in proxy.sent if s.method == "PUT" and s.path == "/nine-000001"]
        assert len(puts) == 2
        assert puts[0].json()["settings"]["index"]["mapping.exclude_source_vectors"] is False
        assert "mapping.exclude_source_vectors" not in puts[1].json()["settings"]["index"]
        assert puts[1].content_type.endswith("compatible-with=9")
        assert b.exists() and b.stats()["server_version"] == "9.0"
    finally:
        proxy.close()


def test_credentials_in_the_url_become_basic_auth_and_are_never_shown(make_backend, es_proxy, identity):
    host = es_proxy.url.removeprefix("http://")
    b = make_backend(f"http://elastic:url-s3cret@{host}", index_name="userinfo")
    assert "url-s3cret" not in repr(b) and b.url == es_proxy.url
    b.open(identity)
    assert es_proxy.log[-1].auth.startswith("Basic ")


def test_serverless_gets_no_shard_settings(make_backend, osmem_url, identity):
    """Elastic Cloud Serverless (build_flavor "serverless") refuses shard counts; the index is
    created without them (osmem behind a proxy that answers GET / as a serverless project)."""
    from d2s_es_proxy import CompatProxy

    proxy = CompatProxy(osmem_url, pretend_version="8.11.0", pretend_flavor="serverless")
    try:
        b = make_backend(proxy.url, index_name="sls")
        b.open(identity)
        assert b.serverless and b.rrf_available()
        (put,) = [s for s in proxy.sent if s.method == "PUT" and s.path == "/sls-000001"][-1:]
        settings = put.json().get("settings", {}).get("index", {})
        assert "number_of_shards" not in settings and "number_of_replicas" not in settings
    finally:
        proxy.close()


def test_settings_from_environment_cloud_id_and_api_key():
    import base64

    from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend

    cloud_id = "pictures:" + base64.b64encode(b"eu-west-1.aws.found.io:443$esid$kbid").decode()
    env = {"D2S_ELASTICSEARCH_CLOUD_ID": cloud_id, "D2S_ELASTICSEARCH_API_KEY": "a2V5OnNlY3JldA==",
           "D2S_ELASTICSEARCH_INDEX": "photos"}
    b = ElasticsearchBackend.from_env(env=env)
    try:
        assert b.url == "cloud:pictures" and b.index_name == "photos"
        assert b.es.transport.node_pool.all()[0].base_url == "https://esid.eu-west-1.aws.found.io:443"
        assert b.es._headers["authorization"] == "ApiKey a2V5OnNlY3JldA=="
        assert "a2V5" not in repr(b)
    finally:
        b.close()
    with pytest.raises(BackendUnavailableError, match="D2S_ELASTICSEARCH_URL"):
        ElasticsearchBackend.from_env(env={})


def _stored_meta(osmem_url: str, index: str = "d2s-test") -> dict:
    (mapping,) = httpx.get(f"{osmem_url}/{index}/_mapping", timeout=10).json().values()
    return mapping["mappings"]["_meta"]


def test_index_records_where_its_bundle_is(make_backend, es_proxy, osmem_url, identity):
    """As on OpenSearch: ``_meta.bundle_path`` names the bundle that filled the index,
    and a writer with the same bundle from another place records that place, so a second
    export elsewhere breaks nothing; a read-only open changes nothing."""
    first = replace(identity, bundle_path="/bundles/first")
    make_backend(es_proxy.url).open(first)
    assert _stored_meta(osmem_url)["bundle_path"] == "/bundles/first"
    peek = make_backend(es_proxy.url)
    peek.open(None, create=False)
    assert peek.identity == first
    moved = replace(identity, bundle_path="/bundles/moved")
    reader = make_backend(es_proxy.url)
    reader.open(moved, create=False)
    assert reader.identity.bundle_path == "/bundles/first"
    assert _stored_meta(osmem_url)["bundle_path"] == "/bundles/first"
    writer = make_backend(es_proxy.url)
    writer.open(moved)
    assert writer.identity == moved
    meta = _stored_meta(osmem_url)
    assert meta["bundle_path"] == "/bundles/moved" and meta["fingerprint"] == identity.fingerprint
    assert (meta["sparse_type"], meta["similarity"], meta["dense_dim"]) == ("rank_features", "dot_product", 8)
    with pytest.raises(BundleMismatchError):
        make_backend(es_proxy.url).open(replace(identity, fingerprint="a" * 32, bundle_path="/bundles/other"))
    assert _stored_meta(osmem_url)["bundle_path"] == "/bundles/moved"


def test_an_index_made_from_the_mapping_file_is_claimed_with_the_bundle_path(make_backend, es_proxy, osmem_url,
                                                                             identity):
    from d2s_search.backends.elasticsearch.queries import index_body

    body = index_body(replace(identity, fingerprint=""))
    body["mappings"]["properties"]["dense"] = {"type": "knn_vector", "dimension": 8}  # osmem's name for it
    assert httpx.put(f"{osmem_url}/d2s-test", json=body, timeout=10).status_code == 200
    b = make_backend(es_proxy.url)
    b.open(replace(identity, bundle_path="/bundles/here"))
    meta = _stored_meta(osmem_url)
    assert (meta["fingerprint"], meta["bundle_path"]) == (identity.fingerprint, "/bundles/here")


def test_server_side_reindex_waits_an_hour_not_the_request_timeout(backend, corpus):
    """``_reindex`` answers when the copy is done: under the client's 30 s timeout a large index
    would time out and the retry would start a second copy (as OpenSearch's backend avoids)."""
    timeouts, call = [], backend._call

    def recording(method, path, *args, **kwargs):
        if path == "/_reindex":
            timeouts.append(kwargs.get("timeout"))
        return call(method, path, *args, **kwargs)

    backend._call = recording
    before = {h.id for h in backend.sparse_search({"w000": 1.0, "dog": 1.0}, 50)}
    out = backend.reindex()
    assert out["documents"] == len(corpus) and timeouts == [3600.0]
    assert {h.id for h in backend.sparse_search({"w000": 1.0, "dog": 1.0}, 50)} == before
