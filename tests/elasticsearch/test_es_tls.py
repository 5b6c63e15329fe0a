"""TLS with the official client: certificates verified by default, a CA file makes a private
CA trusted, errors stay one line without secrets (osmem behind an HTTPS CompatProxy)."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import pytest
from d2s_es_proxy import CompatProxy

from d2s_search.errors import BackendUnavailableError

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=d2s test CA",
        "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "srv.key", "-out", "srv.csr")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "ext.cnf", "-out", "srv.pem")
    return d


@pytest.fixture
def https_proxy(certs, osmem_url):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "srv.pem", certs / "srv.key")
    p = CompatProxy(osmem_url, ssl_context=ctx)
    yield p
    p.close()


def test_unknown_ca_is_refused_with_advice(make_backend, https_proxy):
    b = make_backend(https_proxy.url, user="elastic", password="tls-s3cret", retries=0)
    with pytest.raises(BackendUnavailableError) as err:
        b.exists()
    text = str(err.value)
    assert "D2S_ELASTICSEARCH_CA_FILE" in text and "tls-s3cret" not in text and "\n" not in text


def test_ca_file_makes_it_trusted(make_backend, https_proxy, certs, identity):
    b = make_backend(https_proxy.url, ca_file=str(certs / "ca.pem"))
    b.open(identity)
    assert b.exists()


def test_verification_can_be_switched_off(make_backend, https_proxy):
    assert make_backend(https_proxy.url, verify=False).exists() is False


def test_missing_ca_file(make_backend, https_proxy, tmp_path):
    with pytest.raises(BackendUnavailableError, match="CA file .*nope.pem is not a readable file"):
        make_backend(https_proxy.url, ca_file=str(tmp_path / "nope.pem"))
