"""The connection: several hosts with failover, and AWS SigV4 signing, through real local servers."""

from __future__ import annotations

import hashlib
import hmac
import socket
from urllib.parse import quote, urlsplit

import pytest
from d2s_os_reference import synthetic_docs

from d2s_search.backends.opensearch.backend import OpenSearchBackend, connection_options
from d2s_search.errors import BackendUnavailableError


def free_port() -> int:
    """A port nothing listens on (bound, then released): the 'host that is down'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- several hosts -------------------------------------------------------------------------------

def test_hosts_from_repeated_or_comma_separated_urls():
    opts = connection_options(env={"D2S_OPENSEARCH_URL": "https://a:9200, https://b:9200"})
    assert opts["url"] == ["https://a:9200", "https://b:9200"]
    opts = connection_options(["http://a:9200", "http://b:9200,http://c:9200"], env={})
    assert opts["url"] == ["http://a:9200", "http://b:9200", "http://c:9200"]
    b = OpenSearchBackend(["http://a:9200", "http://u:pw@b:9201"], sleep=lambda s: None)
    assert b.http.hosts == ["http://a:9200", "http://b:9201"] and "pw" not in repr(b)
    b.close()


def test_one_host_down_fails_over_without_losing_or_doubling(make_backend, proxy, osmem_url, identity, sleeps):
    down = f"http://127.0.0.1:{free_port()}"
    b = make_backend([down, proxy.url], retries=3)
    docs = synthetic_docs(30, dim=8)
    b.open(identity)
    b.upsert(docs)
    hits = b.sparse_search(dict(list(docs[0].sparse.items())[:5]), 5)
    assert hits and b.ids_present([d.id for d in docs]) == {d.id for d in docs}
    assert b._count(b.index_name) == 30  # stored once each
    assert sleeps == []  # another host was live: no back-off, straight to it
    assert b.http.retried >= 1  # the down host was tried (round-robin) and skipped
    # the dead host is out of rotation: later requests all reach the live one
    before = len(proxy.log)
    for _ in range(4):
        assert b.exists()
    assert len(proxy.log) == before + 4


def test_all_hosts_down_is_one_line_naming_them(make_backend, sleeps):
    hosts = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    b = make_backend(hosts, retries=2)
    with pytest.raises(BackendUnavailableError, match="cannot reach OpenSearch") as err:
        b.exists()
    assert all(h in str(err.value) for h in hosts) and "\n" not in str(err.value)


def test_busy_host_is_retried_with_backoff(make_backend, proxy, sleeps):
    b = make_backend([proxy.url], retries=3)
    proxy.add("HEAD", "/d2s-test", "status", code=503, retry_after=2)
    assert b.exists() is False
    assert len(sleeps) == 1 and sleeps[0] >= 2


# -- AWS SigV4 -----------------------------------------------------------------------------------

ACCESS, SECRET, TOKEN = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token-example"


def sigv4(method: str, path: str, query: str, headers: dict[str, str], signed: list[str], body: bytes,
          amz_date: str, region: str, service: str, secret: str) -> str:
    """SigV4 from AWS's description ("Create a signed AWS API request"), independent of botocore."""
    pairs = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~"))
                   for k, _, v in (p.partition("=") for p in query.split("&") if p))
    canonical = "\n".join([
        method, quote(path, safe="/-_.~"), "&".join(f"{k}={v}" for k, v in pairs),
        "".join(f"{h}:{' '.join(headers[h].split())}\n" for h in signed), ";".join(signed),
        hashlib.sha256(body).hexdigest(),
    ])
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (amz_date[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def test_reference_signer_reproduces_the_aws_known_answer():
    """AWS SigV4 test suite, get-vanilla: GET / on example.amazonaws.com at 20150830T123600Z."""
    got = sigv4("GET", "/", "", {"host": "example.amazonaws.com", "x-amz-date": "20150830T123600Z"},
                ["host", "x-amz-date"], b"", "20150830T123600Z", "us-east-1", "service", SECRET)
    assert got == "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Credentials through the standard AWS chain (environment), nothing from this machine."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)


@pytest.mark.parametrize("service", ["es", "aoss"])
def test_sigv4_headers_verify_on_every_request(aws_env, make_backend, proxy, identity, service):
    pytest.importorskip("botocore")
    b = make_backend(proxy.url, aws_region="eu-west-1", aws_service=service)
    assert "aws_sigv4" in repr(b) and SECRET not in repr(b)
    b.open(identity)
    b.upsert(synthetic_docs(5, dim=8))
    b.sparse_search({"dog": 1.0, "w001": 0.5}, 3, path_prefix="photos/")
    assert len(proxy.log) >= 5
    for seen in proxy.log:
        auth = seen.headers["authorization"]
        fields = dict(part.strip().split("=", 1) for part in auth.removeprefix("AWS4-HMAC-SHA256 ").split(","))
        amz_date = seen.headers["x-amz-date"]
        assert fields["Credential"] == f"{ACCESS}/{amz_date[:8]}/eu-west-1/{service}/aws4_request"
        signed = fields["SignedHeaders"].split(";")
        assert {"host", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"} <= set(signed)
        assert seen.headers["x-amz-security-token"] == TOKEN
        assert seen.headers["x-amz-content-sha256"] == hashlib.sha256(seen.body).hexdigest()
        url = urlsplit(seen.path)
        want = sigv4(seen.method, url.path, url.query, seen.headers, signed, seen.body, amz_date,
                     "eu-west-1", service, SECRET)
        assert fields["Signature"] == want, (seen.method, seen.path)


def test_sigv4_without_a_region_is_a_clear_error(aws_env, proxy):
    pytest.importorskip("botocore")
    with pytest.raises(BackendUnavailableError, match="needs a region"):
        OpenSearchBackend(proxy.url, aws_service="es")
    with pytest.raises(BackendUnavailableError, match="unknown AWS service"):
        OpenSearchBackend(proxy.url, aws_service="s3", aws_region="eu-west-1")


def test_refresh_once_before_reading_not_per_batch(make_backend, proxy, identity):
    b = make_backend(proxy.url)
    b.open(identity)
    docs = synthetic_docs(30, dim=8)
    for start in range(0, 30, 10):  # three ingest batches
        b.upsert(docs[start : start + 10])
    assert proxy.seen("POST", "/_refresh") == []
    hits = b.sparse_search(dict(list(docs[25].sparse.items())[:5]), 30)
    assert docs[25].id in {h.id for h in hits}  # the search sees every write
    assert len(proxy.seen("POST", "/_refresh")) == 1
    b.sparse_search(dict(list(docs[3].sparse.items())[:5]), 5)
    assert len(proxy.seen("POST", "/_refresh")) == 1  # nothing written since
    b.upsert(docs[:1])
    b.close()
    assert len(proxy.seen("POST", "/_refresh")) == 2  # once at the end of an ingest
