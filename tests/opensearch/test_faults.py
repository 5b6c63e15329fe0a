"""Fault injection through a local proxy: retries happen, nothing is lost or duplicated."""

from __future__ import annotations

import httpx
import pytest
from d2s_os_reference import synthetic_docs

from d2s_search.errors import BackendUnavailableError, DocumentsRejectedError

N = 40


def _count(osmem_url: str) -> int:
    httpx.post(f"{osmem_url}/d2s-test/_refresh")
    return httpx.get(f"{osmem_url}/d2s-test/_count").json()["count"]


def _all_ids(osmem_url: str) -> list[str]:
    body = {"size": 1000, "_source": False, "query": {"match_all": {}}}
    return [h["_id"] for h in httpx.post(f"{osmem_url}/d2s-test/_search", json=body).json()["hits"]["hits"]]


def _stored_exactly(osmem_url, docs):
    ids = _all_ids(osmem_url)
    assert len(ids) == len(set(ids)) == _count(osmem_url) == len(docs)
    assert set(ids) == {d.id for d in docs}


@pytest.fixture
def via_proxy(make_backend, proxy, identity):
    b = make_backend(proxy.url, chunk_docs=10)
    b.open(identity)
    return b


@pytest.mark.parametrize("code", [429, 502, 503, 504])
def test_bulk_retried_after_busy_or_failing_server(via_proxy, proxy, osmem_url, sleeps, code):
    docs = synthetic_docs(N, dim=8)
    proxy.add("POST", "/_bulk", "status", code=code)
    proxy.add("POST", "/_bulk", "status", code=code)
    via_proxy.upsert(docs)
    bulks = proxy.seen("POST", "/_bulk")
    assert [s.action for s in bulks[:3]] == ["status", "status", "forward"]
    assert len(bulks) == N // 10 + 2  # four chunks, the first sent three times
    assert via_proxy.http.retried == 2 and len(sleeps) == 2
    assert sleeps[1] > 0 and sleeps[0] > 0
    _stored_exactly(osmem_url, docs)


def test_retry_after_header_is_honoured(via_proxy, proxy, sleeps):
    proxy.add("POST", "/_bulk", "status", code=429, retry_after=7)
    via_proxy.upsert(synthetic_docs(5, dim=8))
    assert sleeps == [7.0]


def test_dropped_connection_before_request_is_applied(via_proxy, proxy, osmem_url):
    docs = synthetic_docs(N, dim=8)
    proxy.add("POST", "/_bulk", "drop_before")
    via_proxy.upsert(docs)
    assert [s.action for s in proxy.seen("POST", "/_bulk")][:2] == ["drop_before", "forward"]
    _stored_exactly(osmem_url, docs)


def test_dropped_answer_after_request_was_applied_does_not_duplicate(via_proxy, proxy, osmem_url):
    docs = synthetic_docs(N, dim=8)
    proxy.add("POST", "/_bulk", "drop_after", times=2)
    via_proxy.upsert(docs)
    bulks = proxy.seen("POST", "/_bulk")
    assert [s.action for s in bulks][:3] == ["drop_after", "drop_after", "forward"]
    assert bulks[0].ids == bulks[2].ids  # the very same chunk was sent again...
    _stored_exactly(osmem_url, docs)  # ...and stored once
    version = httpx.get(f"{osmem_url}/d2s-test/_doc/{bulks[0].ids[0]}").json()["_version"]
    assert version == 3  # overwritten in place by id, not added


def test_timeout_is_retried(make_backend, proxy, osmem_url, identity):
    b = make_backend(proxy.url, chunk_docs=10, timeout=0.5)
    b.open(identity)
    docs = synthetic_docs(20, dim=8)
    proxy.add("POST", "/_bulk", "delay", seconds=1.2)
    b.upsert(docs)
    assert [s.action for s in proxy.seen("POST", "/_bulk")][:2] == ["delay", "forward"]
    assert b.http.retried == 1
    _stored_exactly(osmem_url, docs)


def test_partial_bulk_resends_only_refused_items(via_proxy, proxy, osmem_url, sleeps):
    docs = synthetic_docs(N, dim=8)
    proxy.add("POST", "/_bulk", "busy_items", every=2)
    via_proxy.upsert(docs)
    bulks = proxy.seen("POST", "/_bulk")
    assert bulks[0].action == "busy_items" and bulks[0].items == 10
    first_pass, again = bulks[: N // 10], bulks[N // 10 :]
    assert [b.items for b in first_pass] == [10] * (N // 10)
    assert [b.items for b in again] == [5]  # only the five refused items went again, once
    assert again[0].ids == bulks[0].ids[0::2]
    assert len(sleeps) == 1
    _stored_exactly(osmem_url, docs)


def test_chunk_refused_as_too_large_is_sent_again_in_halves(via_proxy, proxy, osmem_url, sleeps):
    docs = synthetic_docs(20, dim=8)
    proxy.add("POST", "/_bulk", "status", code=413)
    via_proxy.upsert(docs)  # chunks of 10: the first is refused, then sent as two of 5
    assert [s.items for s in proxy.seen("POST", "/_bulk")] == [10, 10, 5, 5]
    assert sleeps == []  # a smaller request is not a retry of a busy server: no back-off
    _stored_exactly(osmem_url, docs)


def test_permanent_item_failures_reported_rest_stored(via_proxy, proxy, osmem_url):
    docs = synthetic_docs(N, dim=8)
    bad = {docs[3].id, docs[17].id}
    proxy.add("POST", "/_bulk", "reject_items", times=4, ids=bad)
    with pytest.raises(DocumentsRejectedError) as err:
        via_proxy.upsert(docs)
    assert set(err.value.failures) == bad
    assert all("mapper_parsing_exception" in r for r in err.value.failures.values())
    assert err.value.exit_code == 3 and "2 document(s)" in str(err.value)
    assert len(proxy.seen("POST", "/_bulk")) == N // 10  # permanent failures are not retried
    _stored_exactly(osmem_url, [d for d in docs if d.id not in bad])


def test_search_retried(via_proxy, proxy):
    docs = synthetic_docs(N, dim=8)
    via_proxy.upsert(docs)
    expected = [h.id for h in via_proxy.sparse_search({"w000": 1.0, "dog": 2.0}, 10)]
    proxy.add("POST", "/_search", "status", code=503)
    proxy.add("POST", "/_search", "drop_before")
    assert [h.id for h in via_proxy.sparse_search({"w000": 1.0, "dog": 2.0}, 10)] == expected
    assert [s.action for s in proxy.seen("POST", "/_search")][-3:] == ["status", "drop_before", "forward"]


def test_gives_up_with_one_line_error_naming_url(make_backend, proxy, identity):
    b = make_backend(proxy.url, retries=3, user="admin", password="pw-s3cret")
    proxy.add("HEAD", "/d2s-test", "status", code=503, times=10)
    with pytest.raises(BackendUnavailableError) as err:
        b.exists()
    msg = str(err.value)
    assert proxy.url in msg and "503" in msg and "4 attempts" in msg
    assert "pw-s3cret" not in msg and "\n" not in msg
    assert len(proxy.seen("HEAD", "/d2s-test")) == 4


def test_unreachable_server(make_backend, sleeps):
    b = make_backend("http://127.0.0.1:9", retries=2)  # discard port: nothing listens
    with pytest.raises(BackendUnavailableError, match=r"cannot reach OpenSearch at http://127\.0\.0\.1:9"):
        b.exists()
    assert len(sleeps) == 2


def test_auth_failure_is_not_retried(make_backend, proxy, sleeps):
    b = make_backend(proxy.url, user="admin", password="wrong-pw")
    proxy.add("HEAD", "/d2s-test", "status", code=401)
    with pytest.raises(BackendUnavailableError, match="401") as err:
        b.exists()
    assert "wrong-pw" not in str(err.value) and sleeps == []


def test_credentials_are_sent(make_backend, proxy):
    import base64

    make_backend(proxy.url, user="admin", password="pw").exists()
    make_backend(proxy.url, api_key="the-key").exists()
    make_backend("http://u2:pw2@" + proxy.url.removeprefix("http://")).exists()
    auths = [s.auth for s in proxy.seen("HEAD", "/d2s-test")]
    assert auths == [
        "Basic " + base64.b64encode(b"admin:pw").decode(),
        "ApiKey the-key",
        "Basic " + base64.b64encode(b"u2:pw2").decode(),
    ]
