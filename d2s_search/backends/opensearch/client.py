"""The connection to OpenSearch: opensearch-py's transport, with d2s-search's retry policy.

* **Hosts**: one URL or several (``--url`` repeated, or a comma-separated
  ``D2S_OPENSEARCH_URL``). opensearch-py's ``ConnectionPool`` spreads requests round-robin
  and marks a host that drops connections dead for a while; a request that could not reach
  one host goes straight to the next live one (no back-off while another host is left).
  Sniffing (``sniff=True``) asks the cluster for its other nodes; leave it off behind Docker
  or a load balancer (the addresses nodes publish are then unreachable).
* **Retries** (:class:`RetryPolicy`): 429, 5xx, timeouts and dropped connections are repeated
  with exponential back-off (``Retry-After`` honoured). They run here, around one
  connection's ``perform_request``, because opensearch-py's own loop retries at once, ignores
  ``Retry-After`` and hides the status of a retried answer. Every request the backend makes
  is idempotent (documents are indexed by content-hash id), so repeating one whose answer
  was lost cannot duplicate anything.
* :attr:`OpenSearchHTTP.client` is an ``opensearchpy.OpenSearch`` whose transport sends
  through the same policy, so ``opensearchpy.helpers`` (bulk) get the retries and failover.
* **Auth**: basic (user/password, also from the URL), API key, or AWS SigV4 for Amazon
  OpenSearch Service (``es``) and Serverless (``aoss``) -- the ``aws`` extra (botocore);
  credentials from the standard AWS chain (environment, shared files, instance role).

Credentials live only in the connection objects: ``repr``, errors and logs name the URL
without user info and show secrets as ``***``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opensearchpy import OpenSearch, Transport, Urllib3HttpConnection
from opensearchpy.connection_pool import DummyConnectionPool
from opensearchpy.exceptions import HTTP_EXCEPTIONS, ConnectionError, SSLError, TransportError

from d2s_search import redact
from d2s_search.errors import BackendUnavailableError

log = logging.getLogger("d2s_search.opensearch")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_EVERY_STATUS = tuple(range(100, 600))  # connection-level: hand every answer back to us
AWS_SERVICES = ("es", "aoss")
ENV_AWS_REGION = "D2S_OPENSEARCH_AWS_REGION"
ENV_AWS_SERVICE = "D2S_OPENSEARCH_AWS_SERVICE"


@dataclass
class Reply:
    status: int
    body: Any  # parsed JSON, or the raw text when the answer is not JSON
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error_reason(self) -> str:
        """One line from an OpenSearch error body: ``type: reason``, scrubbed of credentials
        (a proxy may reflect the request's Authorization header into its error page)."""
        err = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(err, dict):
            root = (err.get("root_cause") or [err])[0]
            if isinstance(root, dict):
                return redact.one_line(f"{root.get('type', 'error')}: {root.get('reason', '')}".strip())
        text = err if isinstance(err, str) else str(self.body)
        return redact.one_line(text) or f"status {self.status}"


def split_url(url: str) -> tuple[str, str | None, str | None]:
    """``https://u:p@host:9200/`` -> (``https://host:9200``, u, p)."""
    parsed = urlsplit(url.strip())
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme not in ("http", "https") or not parsed.hostname or port == -1:
        shown = parsed.hostname or "?"
        raise BackendUnavailableError(
            f"not an OpenSearch URL: {parsed.scheme}://{shown}... (expected http(s)://host:port)"
        )
    host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
    clean = f"{parsed.scheme}://{host}{':' + str(port) if port else ''}{parsed.path.rstrip('/')}"
    return clean, parsed.username or None, parsed.password or None


def split_hosts(urls: str | Sequence[str]) -> list[str]:
    """``--url`` values / ``D2S_OPENSEARCH_URL``: each may hold several comma-separated URLs."""
    items = [urls] if isinstance(urls, str) else list(urls)
    hosts = [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    if not hosts:
        raise BackendUnavailableError("no OpenSearch URL given")
    return hosts


def tls_verify(verify: bool, ca_file: str | None) -> Any:
    """An ``ssl.SSLContext`` for a private CA, else ``verify`` (for httpx clients)."""
    import ssl

    if ca_file:
        try:
            return ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise BackendUnavailableError(f"cannot read the CA file {ca_file}: {exc}") from None
    return verify


@dataclass
class RetryPolicy:
    """How transient failures are repeated (see the module docstring)."""

    retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    statuses: frozenset[int] = RETRY_STATUSES
    sleep: Callable[[float], None] = time.sleep
    retried: int = 0  # how many requests were repeated (for stats and tests)
    # False: a request that got no answer (dropped, timed out) is not sent again, as it may
    # have been applied (a write that is not idempotent: Serverless assigns the ids)
    resend_unanswered: bool = True

    def wait(self, attempt: int, retry_after: str | None, why: str) -> None:
        delay = min(self.max_backoff, self.backoff * (2**attempt)) * (0.5 + random.random() / 2)
        if retry_after:
            with contextlib.suppress(ValueError):  # an HTTP date: keep our own delay
                delay = min(self.max_backoff, max(delay, float(retry_after)))
        self.retried += 1
        log.info("retrying in %.2fs after %s", delay, why)
        self.sleep(delay)


def aws_auth(region: str | None, service: str, env: Mapping[str, str] | None = None) -> Any:
    """SigV4 signing for opensearch-py's urllib3 connections, credentials from the AWS chain."""
    env = os.environ if env is None else env
    if service not in AWS_SERVICES:
        raise BackendUnavailableError(f"unknown AWS service {service!r} (use es or aoss)")
    region = region or env.get(ENV_AWS_REGION) or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    try:
        import botocore.session
        from opensearchpy import Urllib3AWSV4SignerAuth
    except ImportError:
        raise BackendUnavailableError(
            "AWS SigV4 signing needs botocore: pip install 'd2s-search[aws]'"
        ) from None
    session = botocore.session.Session()
    region = region or session.get_config_variable("region")
    if not region:
        raise BackendUnavailableError(
            f"AWS SigV4 needs a region: --aws-region, {ENV_AWS_REGION} or AWS_REGION"
        )
    credentials = session.get_credentials()
    if credentials is None:
        raise BackendUnavailableError(
            "no AWS credentials found (environment, ~/.aws/credentials, SSO or an instance role)"
        )
    return Urllib3AWSV4SignerAuth(credentials, region, service)


def request_args(serializer: Any, params: Mapping[str, Any] | None, body: Any, ignore: Collection[int] | int,
                 timeout: float | None) -> tuple[dict[str, Any] | None, Any, Collection[int], float | None]:
    """What ``Transport.perform_request`` does with its arguments before sending, done here for
    every supported opensearch-py: the body serialized and UTF-8 encoded; ``request_timeout``
    (or ``timeout``) and ``ignore`` taken out of ``params`` unless given explicitly.

    Not ``Transport._resolve_request_args``: a private method whose signature changed in 2.8.0
    (``opensearchpy/transport.py``: ``(method, params, body)`` up to v2.7.1, ``(method, params,
    body, ignore, timeout)`` from v2.8.0), so calling it either way breaks the other releases.
    """
    if body is not None:
        body = serializer.dumps(body)
        with contextlib.suppress(UnicodeDecodeError, AttributeError):  # bytes stay bytes
            body = body.encode("utf-8", "surrogatepass")
    params = dict(params) if params else None
    if params:
        if not timeout:
            timeout = params.pop("request_timeout", None) or params.pop("timeout", None)
        if not ignore:
            ignore = params.pop("ignore", ())
    return params, body, (ignore,) if isinstance(ignore, int) else ignore, timeout


class _PolicyTransport(Transport):
    """opensearch-py's Transport whose requests go through :meth:`OpenSearchHTTP.send`
    (so ``OpenSearch`` client methods and ``helpers`` share the retry policy)."""

    owner: OpenSearchHTTP

    def perform_request(self, method: str, url: str, params: Mapping[str, Any] | None = None,
                        body: Any = None, timeout: float | None = None, ignore: Collection[int] = (),
                        headers: Mapping[str, str] | None = None) -> Any:
        params, body, ignore, timeout = request_args(self.serializer, params, body, ignore, timeout)
        status, resp_headers, raw = self.owner.send(method, url, params=params, body=body,
                                                    headers=headers, timeout=timeout)
        if method == "HEAD":
            return 200 <= status < 300
        if not (200 <= status < 300) and status not in ignore:
            try:
                info: Any = json.loads(raw) if raw else {}
            except ValueError:
                info = raw
            error = info.get("error", raw) if isinstance(info, dict) else raw
            raise HTTP_EXCEPTIONS.get(status, TransportError)(status, error, info)
        if not raw:
            return raw
        try:
            return json.loads(raw)
        except ValueError:
            # A login wall or a proxy's page (opensearch-py would raise SerializationError).
            raise self.owner.not_json(method, url, status, resp_headers, raw) from None


class OpenSearchHTTP:
    """JSON over HTTP to one OpenSearch cluster (one or more hosts), with retries."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        user: str | None = None,
        password: str | None = None,
        api_key: str | None = None,
        ca_file: str | None = None,
        verify: bool = True,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        aws_region: str | None = None,
        aws_service: str | None = None,
        sniff: bool = False,
        headers: Mapping[str, str] | None = None,
        retry_statuses: Collection[int] = RETRY_STATUSES,
        service_name: str = "OpenSearch",
    ) -> None:
        parsed = [split_url(u) for u in split_hosts(url)]
        self.hosts = [clean for clean, _, _ in parsed]
        self.url = self.hosts[0] if len(self.hosts) == 1 else ", ".join(self.hosts)
        url_user = next((u for _, u, _ in parsed if u), None)
        url_password = next((p for _, u, p in parsed if u), None)
        user = user or url_user
        password = password or url_password
        self.user = user
        redact.remember(password, user=user)  # masked in every message, also as Basic auth
        redact.remember(api_key)
        self.service_name = service_name
        self._has_password = bool(password)
        self._has_api_key = bool(api_key)
        self.aws_service: str | None = aws_service or None  # "es" / "aoss" when SigV4-signed
        self.policy = RetryPolicy(max(0, int(retries)), backoff, max_backoff, frozenset(retry_statuses), sleep)
        if ca_file and not os.path.isfile(ca_file):
            raise BackendUnavailableError(f"cannot read the CA file {ca_file}: no such file")
        extra_headers = {"accept": "application/json", **{k.lower(): v for k, v in (headers or {}).items()}}
        http_auth: Any = None
        if self.aws_service:
            http_auth = aws_auth(aws_region, self.aws_service)
        elif api_key:
            extra_headers["authorization"] = f"ApiKey {api_key}"
        elif user:
            http_auth = (user, password or "")
        self.timeout = timeout
        tls: dict[str, Any] = {"verify_certs": bool(verify or ca_file), "ssl_show_warn": False}
        if ca_file:
            tls["ca_certs"] = ca_file
        self.client = OpenSearch(
            hosts=[_host_dict(h) for h in self.hosts],
            transport_class=_PolicyTransport,
            connection_class=Urllib3HttpConnection,
            http_auth=http_auth,
            headers=extra_headers,
            timeout=timeout,
            max_retries=0,
            sniff_on_start=sniff,
            sniff_on_connection_fail=sniff,
            sniffer_timeout=60 if sniff else None,
            **tls,
        )
        self.transport: _PolicyTransport = self.client.transport
        self.transport.owner = self

    @property
    def retries(self) -> int:
        return self.policy.retries

    @property
    def retried(self) -> int:
        return self.policy.retried

    def __repr__(self) -> str:
        auth = ""
        if self.aws_service:
            auth = f", aws_sigv4={self.aws_service!r}"
        elif self._has_api_key:
            auth = ", api_key='***'"
        elif self.user:
            auth = f", user={self.user!r}, password='***'" if self._has_password else f", user={self.user!r}"
        return f"OpenSearchHTTP({self.url!r}{auth})"

    __str__ = __repr__

    def close(self) -> None:
        self.transport.close()

    # -- requests -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        ndjson: str | None = None,
        content: bytes | None = None,
        content_type: str = "application/json",
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        raise_auth: bool = True,
    ) -> Reply:
        """Send one request, repeating it on transient failures; non-2xx answers are returned.

        401/403 raise BackendUnavailableError unless ``raise_auth`` is False (for reads the
        caller can do without, such as cluster settings a restricted user may not see).
        """
        headers: dict[str, str] = {}
        body: bytes | None = None
        if content is not None:
            body, headers["content-type"] = content, content_type
        elif ndjson is not None:
            body, headers["content-type"] = ndjson.encode("utf-8"), "application/x-ndjson"
        elif json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False, allow_nan=False).encode("utf-8")
            headers["content-type"] = "application/json"
        status, resp_headers, raw = self.send(method, path, params=params, body=body, headers=headers,
                                              timeout=timeout, raise_auth=raise_auth)
        reply = Reply(status, _decode(raw), resp_headers)
        if reply.ok and isinstance(reply.body, str) and method != "HEAD":
            raise self.not_json(method, path, status, resp_headers, raw)  # never taken for an answer
        return reply

    def not_json(self, method: str, path: str, status: int, headers: Mapping[str, str],
                 raw: str | bytes) -> BackendUnavailableError:
        """The one-line error for a 2xx answer that is not JSON: a login page or a proxy's HTML
        stands where the cluster should (its text scrubbed: such pages may reflect credentials)."""
        headers = {k.lower(): v for k, v in headers.items()}
        kind = headers.get("content-type", "").split(";")[0].strip() or "no content type"
        page = Reply(status, _decode(raw)).error_reason()[:80]
        return BackendUnavailableError(
            f"{self.url} answered {method} {path} with {status} {kind}, not JSON: is this the {self.service_name} "
            f"URL (and not a proxy or login page)? ({page})"
        )

    def send(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: bytes | None = None,
             headers: Mapping[str, str] | None = None, timeout: float | None = None,
             raise_auth: bool = True) -> tuple[int, Mapping[str, str], str]:
        """One request through the pool: (status, headers, raw text); retries per the policy."""
        params = {k: _param(v) for k, v in (params or {}).items()} or None
        attempt = 0
        while True:
            conn = self.transport.get_connection()
            try:
                status, resp_headers, raw = conn.perform_request(
                    method, path, params, body, timeout=timeout or self.timeout, ignore=_EVERY_STATUS,
                    headers=headers,
                )
            except ConnectionError as exc:  # includes timeouts and TLS failures
                if _is_tls_failure(exc):
                    raise BackendUnavailableError(
                        f"TLS certificate of {conn.host} is not trusted: set D2S_OPENSEARCH_CA_FILE to "
                        "its CA certificate (PEM), or D2S_OPENSEARCH_INSECURE=1 for a local demo certificate"
                    ) from None
                failover = self._mark_dead(conn)
                if attempt >= self.policy.retries or not self.policy.resend_unanswered:
                    raise BackendUnavailableError(
                        f"cannot reach {self.service_name} at {self.url}: {_describe(exc)} "
                        f"(after {attempt + 1} attempts)"
                    ) from None
                if failover:
                    self.policy.retried += 1
                    log.info("%s %s: %s unreachable, trying another host", method, path, conn.host)
                else:
                    self.policy.wait(attempt, None, f"{method} {path}: {_describe(exc)}")
                attempt += 1
                continue
            self.transport.connection_pool.mark_live(conn)
            if status in self.policy.statuses and attempt < self.policy.retries:
                self.policy.wait(attempt, resp_headers.get("Retry-After"), f"{method} {path}: {status}")
                attempt += 1
                continue
            if status in self.policy.statuses:
                reason = Reply(status, _decode(raw)).error_reason()
                raise BackendUnavailableError(
                    f"{self.service_name} at {self.url} answered {status} ({reason}) after {attempt + 1} attempts"
                )
            if status in (401, 403) and raise_auth:
                raise BackendUnavailableError(auth_message(self.url, status, Reply(status, _decode(raw))))
            return status, {k.lower(): v for k, v in resp_headers.items()}, raw

    def _mark_dead(self, conn: Any) -> bool:
        """Take ``conn`` out of rotation; True when another live host is left to try now."""
        pool = self.transport.connection_pool
        if isinstance(pool, DummyConnectionPool):
            return False
        with contextlib.suppress(TransportError):
            self.transport.mark_dead(conn)
        return bool(pool.connections)


def _host_dict(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    host: dict[str, Any] = {"host": parts.hostname, "port": parts.port or (443 if parts.scheme == "https" else 80),
                            "use_ssl": parts.scheme == "https"}
    if parts.path and parts.path != "/":
        host["url_prefix"] = parts.path
    return host


def _param(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _decode(raw: str | bytes | None) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


def _describe(exc: Exception) -> str:
    cause = getattr(exc, "info", None) or exc
    kind = type(cause).__name__ if isinstance(cause, Exception) else type(exc).__name__
    if isinstance(exc, TransportError) and exc.status_code == "TIMEOUT":
        return "timed out"
    text = redact.scrub(str(cause).splitlines()[0]) if str(cause) else ""
    # urllib3 names the pool (host, port) in its messages; keep the reason only
    text = text.split(": ", 1)[-1] if "Pool(" in text else text
    return f"{kind}{': ' + text[:160] if text else ''}"


def _is_tls_failure(exc: Exception) -> bool:
    text = f"{exc} {getattr(exc, 'info', '')}"
    return isinstance(exc, SSLError) or "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text


def auth_message(url: str, status: int, reply: Reply) -> str:
    if status == 401:
        return (
            f"OpenSearch at {url} refused the credentials (401): set D2S_OPENSEARCH_USER and "
            "D2S_OPENSEARCH_PASSWORD, or D2S_OPENSEARCH_API_KEY"
        )
    return f"OpenSearch at {url} denied the request (403): {reply.error_reason()}"
