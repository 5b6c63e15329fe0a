"""A small retrying HTTP client for OpenSearch (sync httpx).

Retries with exponential back-off (and ``Retry-After`` when given) on 429, 5xx, timeouts and
dropped connections; everything else is handed back to the caller as a :class:`Reply`.
Every request the backend makes is idempotent (documents are indexed by content-hash id),
so repeating one whose answer was lost cannot duplicate anything.

Credentials live only in the httpx auth/headers: ``repr``, errors and logs name the URL
without user info and show secrets as ``***``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from d2s_search.errors import BackendUnavailableError

log = logging.getLogger("d2s_search.opensearch")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Transport failures worth another try: timeouts, refused/reset connections, a server that
# closed the connection without answering.
RETRY_EXCEPTIONS: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


@dataclass
class Reply:
    status: int
    body: Any  # parsed JSON, or the raw text when the answer is not JSON

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error_reason(self) -> str:
        """One line from an OpenSearch error body: ``type: reason``."""
        err = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(err, dict):
            root = (err.get("root_cause") or [err])[0]
            if isinstance(root, dict):
                return f"{root.get('type', 'error')}: {root.get('reason', '')}".strip()
        text = err if isinstance(err, str) else str(self.body)
        return text.replace("\n", " ")[:300]


def split_url(url: str) -> tuple[str, str | None, str | None]:
    """``https://u:p@host:9200/`` -> (``https://host:9200``, u, p)."""
    parsed = httpx.URL(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BackendUnavailableError(
            f"not an OpenSearch URL: {parsed.copy_with(username=None, password=None)!s} "
            "(expected http(s)://host:port)"
        )
    user = parsed.username or None
    password = parsed.password or None
    clean = parsed.copy_with(username=None, password=None, query=None, fragment=None)
    return str(clean).rstrip("/"), user, password


def tls_verify(verify: bool, ca_file: str | None) -> ssl.SSLContext | bool:
    if ca_file:
        try:
            return ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise BackendUnavailableError(f"cannot read the CA file {ca_file}: {exc}") from None
    return verify


class OpenSearchHTTP:
    """JSON over HTTP to one OpenSearch endpoint, with retries."""

    def __init__(
        self,
        url: str,
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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, url_user, url_password = split_url(url)
        user = user or url_user
        password = password or url_password
        self.user = user
        self._has_password = bool(password)
        self._has_api_key = bool(api_key)
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        self.retried = 0  # how many requests were repeated (for stats and tests)
        self.aws_service: str | None = None  # "es" / "aoss" when requests are SigV4-signed
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"ApiKey {api_key}"
        auth = httpx.BasicAuth(user, password or "") if user and not api_key else None
        self._client = httpx.Client(
            base_url=self.url,
            auth=auth,
            headers=headers,
            verify=tls_verify(verify, ca_file),
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
        )

    def __repr__(self) -> str:
        auth = ""
        if self._has_api_key:
            auth = ", api_key='***'"
        elif self.user:
            auth = f", user={self.user!r}, password='***'" if self._has_password else f", user={self.user!r}"
        return f"OpenSearchHTTP({self.url!r}{auth})"

    __str__ = __repr__

    def close(self) -> None:
        self._client.close()

    # -- requests -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        ndjson: str | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        raise_auth: bool = True,
    ) -> Reply:
        """Send one request, repeating it on transient failures; non-2xx answers are returned.

        401/403 raise BackendUnavailableError unless ``raise_auth`` is False (for reads the
        caller can do without, such as cluster settings a restricted user may not see).
        """
        content: bytes | None = None
        headers: dict[str, str] = {}
        if ndjson is not None:
            content = ndjson.encode("utf-8")
            headers["Content-Type"] = "application/x-ndjson"
        elif json_body is not None:
            content = json.dumps(json_body, ensure_ascii=False, allow_nan=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        extra = {} if timeout is None else {"timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0))}
        attempt = 0
        while True:
            try:
                resp = self._client.request(
                    method, path, content=content, headers=headers, params=params, **extra
                )
            except RETRY_EXCEPTIONS as exc:
                if _is_tls_failure(exc):
                    raise BackendUnavailableError(
                        f"TLS certificate of {self.url} is not trusted: pass its CA with "
                        "--ca-file or D2S_OPENSEARCH_CA_FILE"
                    ) from None
                if attempt >= self.retries:
                    raise BackendUnavailableError(
                        f"cannot reach OpenSearch at {self.url}: {_describe(exc)} "
                        f"(after {attempt + 1} attempts)"
                    ) from None
                self._wait(attempt, None, f"{method} {path}: {_describe(exc)}")
                attempt += 1
                continue
            if resp.status_code in RETRY_STATUSES and attempt < self.retries:
                self._wait(attempt, resp.headers.get("Retry-After"), f"{method} {path}: {resp.status_code}")
                attempt += 1
                continue
            reply = Reply(resp.status_code, _decode(resp))
            if resp.status_code in RETRY_STATUSES:
                raise BackendUnavailableError(
                    f"OpenSearch at {self.url} answered {resp.status_code} "
                    f"({reply.error_reason()}) after {attempt + 1} attempts"
                )
            if resp.status_code in (401, 403) and raise_auth:
                raise BackendUnavailableError(auth_message(self.url, resp.status_code, reply))
            return reply

    def _wait(self, attempt: int, retry_after: str | None, why: str) -> None:
        delay = min(self.max_backoff, self.backoff * (2**attempt)) * (0.5 + random.random() / 2)
        if retry_after:
            with contextlib.suppress(ValueError):  # an HTTP date: keep our own delay
                delay = min(self.max_backoff, max(delay, float(retry_after)))
        self.retried += 1
        log.info("retrying in %.2fs after %s", delay, why)
        self._sleep(delay)


def _decode(resp: httpx.Response) -> Any:
    if not resp.content:
        return {}
    try:
        return resp.json()
    except ValueError:
        return resp.text


def _describe(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}{': ' + text[:200] if text else ''}"


def _is_tls_failure(exc: Exception) -> bool:
    text = f"{exc} {exc.__cause__ or ''} {exc.__context__ or ''}"
    return "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text


def auth_message(url: str, status: int, reply: Reply) -> str:
    if status == 401:
        return (
            f"OpenSearch at {url} refused the credentials (401): set D2S_OPENSEARCH_USER and "
            "D2S_OPENSEARCH_PASSWORD, or D2S_OPENSEARCH_API_KEY"
        )
    return f"OpenSearch at {url} denied the request (403): {reply.error_reason()}"
