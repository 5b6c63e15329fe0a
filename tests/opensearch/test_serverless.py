"""Amazon OpenSearch Serverless vector search collections: the stand-in in its Serverless mode
(plugins.py: explicit ids refused per item, no ``_refresh``, no scroll) in front of osmem.

Documents are found by their content hash in the ``content_id`` field: a re-ingest replaces
what is stored (no duplicates), nothing is refreshed, paths are listed with ``search_after``,
a write whose answer was lost is not sent again, and reindex is refused in one line.
"""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest
from d2s_os_faultproxy import FaultProxy
from d2s_os_plugins import SERVERLESS_ID_REFUSED, PluginStandIn
from d2s_os_reference import ranking, synthetic_docs
from opensearchpy.helpers import expand_action

from d2s_search.backends.opensearch import queries as q
from d2s_search.errors import BackendUnavailableError, IndexStoreError


@pytest.fixture
def aws_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")


@pytest.fixture
def collection(osmem_url):
    proxy = FaultProxy(osmem_url, stub=PluginStandIn(osmem_url, serverless=True))
    yield proxy
    proxy.close()


@pytest.fixture
def store(collection, make_backend, identity, aws_credentials):
    b = make_backend(collection.url, aws_service="aoss", aws_region="eu-west-1")
    b.open(identity)
    return b


def _stored(collection) -> list[dict]:
    httpx.post(f"{collection.upstream}/_refresh")
    hits = httpx.post(f"{collection.upstream}/d2s-test/_search", json={"size": 1000}).json()[
        "hits"
    ]["hits"]
    return [h["_source"] for h in hits]


def _parsed(line):
    return json.loads(line) if isinstance(line, (str, bytes)) else line


def test_bodies_match_the_spec(spec, identity):
    index = q.index_body(identity, serverless=True)
    assert (
        "number_of_shards" not in index["settings"]["index"]
        and index["settings"]["index"]["knn"] is True
    )
    assert index["mappings"]["properties"][q.CONTENT_ID] == {"type": "keyword"}
    spec.validate("PUT", "/{index}", index)
    docs = synthetic_docs(2, dim=8)
    lines = []
    for action in q.bulk_create_actions(
        "d2s", [(d.id, q.doc_source(d)) for d in docs]
    ) + q.bulk_update_stored("d2s", [(docs[1].id, "server-2", {"path": ["a.jpg", "b.jpg"]})]) + q.bulk_delete_stored(
        "d2s", [(docs[0].id, "server-1")]
    ):
        head, source = expand_action(dict(action))
        lines += [_parsed(head)] + ([_parsed(source)] if source is not None else [])
    assert "_id" not in lines[0]["index"] and lines[1][q.CONTENT_ID] == docs[0].id
    assert lines[-3:-1] == [{"update": {"_index": "d2s", "_id": "server-2"}},
                            {"doc": {"path": ["a.jpg", "b.jpg"]}}]
    assert lines[-1] == {"delete": {"_index": "d2s", "_id": "server-1"}}
    spec.validate("POST", "/_bulk", lines)
    spec.validate(
        "POST",
        "/{index}/_search",
        q.content_lookup_body([d.id for d in docs], [q.CONTENT_ID, "path"]),
    )
    spec.validate("POST", "/{index}/_search", q.content_page_body(100, ["abc"], ["path"]))


def _collection_refuses_ids_refresh_and_scroll(collection) -> None:
    """What a vector search collection answers (the stand-in, as plugins.py cites)."""
    httpx.put(
        f"{collection.url}/raw", json={"mappings": {"properties": {"path": {"type": "keyword"}}}}
    )
    lines = '{"index":{"_index":"raw","_id":"x"}}\n{"path":"a"}\n{"index":{"_index":"raw"}}\n{"path":"b"}\n'
    items = httpx.post(
        f"{collection.url}/_bulk", content=lines, headers={"content-type": "application/x-ndjson"}
    ).json()["items"]
    assert (
        items[0]["index"]["status"] == 400
        and items[0]["index"]["error"]["reason"] == SERVERLESS_ID_REFUSED
    )
    assert items[1]["index"]["status"] == 201
    for method, path in (
        ("POST", "/raw/_refresh"),
        ("POST", "/raw/_search?scroll=5m"),
        ("GET", "/"),
    ):
        reply = httpx.request(method, collection.url + path, json={} if method == "POST" else None)
        assert reply.status_code == 404 and reply.content == b""
    httpx.delete(f"{collection.url}/raw")


def test_ingest_search_and_reingest_without_ids_refresh_or_duplicates(store, collection):
    _collection_refuses_ids_refresh_and_scroll(collection)
    start = len(collection.log)
    docs = synthetic_docs(30, dim=8)
    store.upsert(docs[:20])
    store.upsert(docs[20:])
    index_actions = [
        json.loads(line)
        for s in collection.log[start:]
        if s.method == "POST" and "/_bulk" in s.path
        for line in s.body.decode().splitlines()
        if '"index"' in line[:10]
    ]
    assert index_actions and all("_id" not in a["index"] for a in index_actions)
    assert store.ids_present([d.id for d in docs] + ["f" * 64]) == {d.id for d in docs}
    query = dict(list(docs[5].sparse.items())[:6])
    assert [h.id for h in store.sparse_search(query, 5)] == [i for i, _ in ranking(query, docs)[:5]]
    # the same pictures again, one of them moved: replaced, not duplicated
    moved = replace(docs[3], path="photos/elsewhere/0003.jpg")
    store.upsert([*docs[:10], moved])
    stored = _stored(collection)
    assert len(stored) == 30 and sorted(s[q.CONTENT_ID] for s in stored) == sorted(
        d.id for d in docs
    )
    assert store.paths_of([docs[3].id]) == {docs[3].id: ["photos/elsewhere/0003.jpg"]}
    assert dict(store.document_paths(page=7))[docs[3].id] == "photos/elsewhere/0003.jpg"
    assert len(dict(store.document_paths(page=7))) == 30
    got = store.get([docs[8].id])[0]
    assert got.id == docs[8].id and got.path == docs[8].path
    assert store.delete([docs[0].id, docs[1].id]) == 2 and len(_stored(collection)) == 28
    # a copy found, the original gone, then the copy gone: the server's own ids are updated
    store.relink(found={"photos/copy/0004.jpg": docs[4].id})
    assert store.paths_of([docs[4].id]) == {docs[4].id: [docs[4].path, "photos/copy/0004.jpg"]}
    assert store.relink(gone=[docs[4].path]) == 0
    assert store.paths_of([docs[4].id]) == {docs[4].id: ["photos/copy/0004.jpg"]}
    assert store.relink(gone=["photos/copy/0004.jpg"]) == 1
    assert len(_stored(collection)) == 27 and docs[4].id not in {s[q.CONTENT_ID] for s in _stored(collection)}
    store.close()
    assert not [s for s in collection.log[start:] if "_refresh" in s.path or "scroll" in s.path]
    assert not collection.seen("POST", "/_mget")


def test_reindex_is_refused_in_one_line(store, collection):
    store.upsert(synthetic_docs(3, dim=8))
    before = len(collection.log)
    with pytest.raises(IndexStoreError) as info:
        store.reindex()
    assert "not offered on Amazon OpenSearch Serverless" in str(info.value) and "\n" not in str(
        info.value
    )
    assert all(s.method in ("GET", "HEAD") for s in collection.log[before:])


def test_a_write_whose_answer_was_lost_is_not_sent_again(store, collection, sleeps):
    docs = synthetic_docs(6, dim=8)
    collection.add("POST", "/_bulk", "drop_after")
    with pytest.raises(BackendUnavailableError):
        store.upsert(docs)
    assert len(collection.seen("POST", "/_bulk")) == 1 and len(_stored(collection)) == 6
    store.upsert(docs)  # the next ingest finds them by their hash
    assert len(_stored(collection)) == 6


def test_the_index_is_made_without_shard_counts_or_alias(store, collection):
    (put,) = [s for s in collection.log if s.method == "PUT" and s.path == "/d2s-test"]
    body = json.loads(put.body)
    assert "aliases" not in body and set(body["settings"]["index"]) == {"knn"}
    assert store.stats()["document_ids"].startswith("content_id")


def test_a_document_stored_twice_shows_once_and_is_replaced_with_its_twin(store, collection):
    docs = synthetic_docs(10, dim=8)
    store.upsert(docs)
    twin = {
        **q.doc_source(docs[2]),
        q.CONTENT_ID: docs[2].id,
    }  # a write whose answer was lost, sent again
    httpx.post(f"{collection.upstream}/d2s-test/_doc", json=twin, params={"refresh": "true"})
    assert sum(s[q.CONTENT_ID] == docs[2].id for s in _stored(collection)) == 2
    query = dict(list(docs[2].sparse.items())[:8])
    hits = store.sparse_search(query, 10)
    assert [h.id for h in hits].count(docs[2].id) == 1 and len(hits) == len({h.id for h in hits})
    store.upsert([docs[2]])  # re-ingest: both copies go, one comes
    assert sum(s[q.CONTENT_ID] == docs[2].id for s in _stored(collection)) == 1
    httpx.post(f"{collection.upstream}/d2s-test/_doc", json=twin, params={"refresh": "true"})
    assert store.delete([docs[2].id]) >= 1
    assert not [s for s in _stored(collection) if s[q.CONTENT_ID] == docs[2].id]
