"""Install the d2s-search saved objects into OpenSearch Dashboards (its ``_import`` API).

    POST <dashboards>/api/saved_objects/_import?overwrite=true
         osd-xsrf: true                 (Dashboards refuses writes without it)
         securitytenant: global         (security plugin: which tenant receives the objects)
         multipart/form-data, field "file", a file name ending in .ndjson

Settings: the URL from ``--url``/``D2S_DASHBOARDS_URL``; credentials only from the
environment, ``D2S_DASHBOARDS_USER``/``_PASSWORD`` else ``D2S_OPENSEARCH_USER``/``_PASSWORD``
(the compose file's Dashboards logs in with the OpenSearch users); a private CA from
``D2S_DASHBOARDS_CA_FILE`` else ``D2S_OPENSEARCH_CA_FILE``. Requests go through the same
connection class as OpenSearch (:class:`~d2s_search.backends.opensearch.client.OpenSearchHTTP`:
opensearch-py's pool, TLS and auth, the same retry policy), retrying only what Dashboards
answers while it starts (502-504). Errors are one line and never show a password.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d2s_search import redact
from d2s_search.backends.engine.saved_objects import describe_errors, read_ndjson_files
from d2s_search.backends.opensearch.client import OpenSearchHTTP, Reply
from d2s_search.backends.opensearch.dashboards_objects import (
    retarget,
    saved_objects,
    to_ndjson,
)
from d2s_search.errors import BackendUnavailableError, D2SError

log = logging.getLogger("d2s_search.dashboards")

ENV_URL = "D2S_DASHBOARDS_URL"
ENV_CA_FILE = "D2S_DASHBOARDS_CA_FILE"
ENV_OPENSEARCH_CA_FILE = "D2S_OPENSEARCH_CA_FILE"
ENV_INSECURE = "D2S_DASHBOARDS_INSECURE"
# Dashboards' own users first; the compose setup shares the OpenSearch users.
ENV_USERS = (("D2S_DASHBOARDS_USER", "D2S_DASHBOARDS_PASSWORD"), ("D2S_OPENSEARCH_USER", "D2S_OPENSEARCH_PASSWORD"))
IMPORT_PATH = "/api/saved_objects/_import"
# 503 is what Dashboards answers while it is still starting ("server is not ready yet").
RETRY_STATUSES = frozenset({502, 503, 504})


class DashboardsError(D2SError):
    """Dashboards refused the saved objects (bad file, missing references, permissions)."""


@dataclass
class ImportResult:
    url: str
    tenant: str | None
    imported: list[dict[str, str]] = field(default_factory=list)  # {"type", "id", "title"}

    def to_json(self) -> dict[str, Any]:
        return {"dashboards": self.url, "tenant": self.tenant, "imported": self.imported}


def credentials_from_env(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    for user_var, password_var in ENV_USERS:
        if env.get(user_var):
            return env[user_var], env.get(password_var)
    return None, None


class DashboardsClient:
    """Just enough of the Dashboards HTTP API, with retries while Dashboards is starting."""

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        ca_file: str | None = None,
        verify: bool = True,
        tenant: str | None = "global",
        timeout: float = 60.0,
        retries: int = 4,
        backoff: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.tenant = tenant or None
        headers = {"osd-xsrf": "true"}
        if self.tenant:
            headers["securitytenant"] = self.tenant
        try:
            self.http = OpenSearchHTTP(
                url, user=user, password=password, ca_file=ca_file, verify=verify, timeout=timeout,
                retries=retries, backoff=backoff, sleep=sleep, headers=headers, retry_statuses=RETRY_STATUSES,
                service_name="OpenSearch Dashboards",
            )
        except BackendUnavailableError as exc:
            raise BackendUnavailableError(str(exc).replace("OpenSearch URL", "Dashboards URL")
                                          .replace("host:port", "host:5601")) from None
        self.url = self.http.url

    @classmethod
    def from_env(cls, url: str | None = None, env: Mapping[str, str] | None = None, **options: Any) -> DashboardsClient:
        env = os.environ if env is None else env
        url = url or env.get(ENV_URL)
        if not url:
            raise BackendUnavailableError(f"no Dashboards URL: pass --url or set {ENV_URL}")
        user, password = credentials_from_env(env)
        options.setdefault("user", user)
        options.setdefault("password", password)
        # OpenSearch's CA only matters (and is only read) for an https Dashboards URL
        shared_ca = env.get(ENV_OPENSEARCH_CA_FILE) if url.strip().lower().startswith("https:") else None
        options.setdefault("ca_file", env.get(ENV_CA_FILE) or shared_ca or None)
        if env.get(ENV_INSECURE, "").lower() in ("1", "true", "yes"):
            options["verify"] = False
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"DashboardsClient({self.url!r}, tenant={self.tenant!r})"

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> DashboardsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------

    def import_ndjson(self, ndjson: str, overwrite: bool = True) -> tuple[int, list[dict[str, str]] | None]:
        """Import an ndjson export: (objects imported, their type/id/title when Dashboards lists
        them). Raises DashboardsError when any object is refused."""
        # Repeating an import is safe: with overwrite it ends in the same objects.
        content, content_type = multipart_file("file", "d2s-search.ndjson", ndjson.encode("utf-8"), "application/ndjson")
        try:
            reply: Reply = self.http.request(
                "POST", IMPORT_PATH, content=content, content_type=content_type,
                params={"overwrite": "true"} if overwrite else None, raise_auth=False,
            )
        except BackendUnavailableError as exc:
            raise BackendUnavailableError(str(exc).replace("D2S_OPENSEARCH_CA_FILE", ENV_CA_FILE)) from None
        body = reply.body
        if reply.status != 200:
            raise DashboardsError(self._http_error(reply.status, body))
        if not isinstance(body, dict):
            raise DashboardsError(f"unexpected answer from {self.url}{IMPORT_PATH}: {str(body)[:200]}")
        errors = body.get("errors") or []
        if not body.get("success") or errors:
            raise DashboardsError(f"Dashboards at {self.url} refused {len(errors)} object(s): {describe_errors(errors)}")
        results = body.get("successResults")  # listed by newer Dashboards versions only
        listed = None if results is None else [
            {"type": r.get("type", ""), "id": r.get("id", ""), "title": (r.get("meta") or {}).get("title", "")}
            for r in results
        ]
        return int(body.get("successCount", 0)), listed

    def _http_error(self, status: int, body: Any) -> str:
        message = body.get("message") if isinstance(body, dict) else None
        text = redact.one_line(str(message or body))
        if status == 401:
            return (f"OpenSearch Dashboards at {self.url} refused the credentials (401): set "
                    "D2S_DASHBOARDS_USER and D2S_DASHBOARDS_PASSWORD (or D2S_OPENSEARCH_USER/_PASSWORD)")
        if status == 403:
            return f"OpenSearch Dashboards at {self.url} denied the import (403): {text}"
        if status == 404 or "no handler found" in text:
            return (f"no saved-objects API at {self.url}: is this the Dashboards URL "
                    "(http://localhost:5601), not OpenSearch's?")
        return f"OpenSearch Dashboards at {self.url} answered {status}: {text}"


def multipart_file(field_name: str, file_name: str, data: bytes, content_type: str) -> tuple[bytes, str]:
    """One file as ``multipart/form-data`` (RFC 7578): (body, Content-Type header)."""
    boundary = f"d2s-{uuid.uuid4().hex}"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{field_name}"; filename="{file_name}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n").encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def load_objects(paths: Sequence[str | Path] = (), index_name: str = "d2s") -> list[dict[str, Any]]:
    """The built-in objects, or those of ndjson files/folders (``*.ndjson``), for ``index_name``."""
    if not paths:
        return saved_objects(index_name)
    objects = read_ndjson_files(paths, DashboardsError)
    return retarget(objects, index_name)


def install(client: DashboardsClient, objects: list[dict[str, Any]], overwrite: bool = True) -> ImportResult:
    """Import ``objects`` in one request, so references between them resolve together."""
    if not objects:
        raise DashboardsError("no saved objects to import")
    count, listed = client.import_ndjson(to_ndjson(objects), overwrite=overwrite)
    if listed is None:
        listed = [{"type": o["type"], "id": o["id"], "title": o["attributes"].get("title", "")} for o in objects]
    if count != len(objects):
        raise DashboardsError(f"Dashboards at {client.url} imported {count} of {len(objects)} objects")
    return ImportResult(url=client.url, tenant=client.tenant, imported=listed)
