"""Writes to Elasticsearch are refreshed once before the next read and once at the end of an
ingest, not after every ``_bulk`` batch: the mechanism both engines share
(``EngineIndex.settle``)."""

from __future__ import annotations

from d2s_os_reference import synthetic_docs


def test_refresh_once_before_reading_not_per_batch(make_backend, es_proxy, identity):
    b = make_backend(es_proxy.url)
    b.open(identity)
    docs = synthetic_docs(30, dim=8)
    for start in range(0, 30, 10):  # three ingest batches
        b.upsert(docs[start : start + 10])
    assert es_proxy.seen("POST", "/_refresh") == []
    hits = b.sparse_search(dict(list(docs[25].sparse.items())[:5]), 30)
    assert docs[25].id in {h.id for h in hits}  # the search sees every write
    assert len(es_proxy.seen("POST", "/_refresh")) == 1
    b.sparse_search(dict(list(docs[3].sparse.items())[:5]), 5)
    assert len(es_proxy.seen("POST", "/_refresh")) == 1  # nothing written since
    b.upsert(docs[:1])
    b.close()
    assert len(es_proxy.seen("POST", "/_refresh")) == 2  # once at the end of an ingest


def test_stats_and_path_listings_see_every_write(make_backend, es_proxy, identity):
    b = make_backend(es_proxy.url)
    b.open(identity)
    docs = synthetic_docs(15, dim=8)
    b.upsert(docs[:12])
    assert es_proxy.seen("POST", "/_refresh") == []
    assert b.stats()["documents"] == 12
    b.upsert(docs[12:])
    assert len(es_proxy.seen("POST", "/_refresh")) == 1
    assert len(dict(b.document_paths(page=5))) == 15
    assert len(es_proxy.seen("POST", "/_refresh")) == 2


def test_close_after_the_server_went_away_tries_the_refresh_once(
    make_backend, es_proxy, identity, sleeps
):
    b = make_backend(es_proxy.url, retries=3)
    b.open(identity)
    b.upsert(synthetic_docs(4, dim=8))
    es_proxy.add("POST", "/_refresh", "status", times=10, code=503)
    assert es_proxy.seen("POST", "/_refresh") == []
    b.close()
    assert len(es_proxy.seen("POST", "/_refresh")) == 1 and sleeps == []
