"""Install the d2s-search saved objects into Kibana (its saved-objects ``_import`` API).

    GET  <kibana>/api/spaces/space/<space>                     (the space must exist; 404 otherwise)
    POST <kibana>[/s/<space>]/api/saved_objects/_import?overwrite=true
         kbn-xsrf: true            (Kibana refuses writes without it: "Request must contain a kbn-xsrf header.")
         multipart/form-data, field "file", a file name ending in .ndjson ("Invalid file extension ...")

Settings: the URL from ``--url``/``D2S_KIBANA_URL``; credentials only from the environment:
``D2S_KIBANA_API_KEY`` else ``D2S_ELASTICSEARCH_API_KEY``; ``D2S_KIBANA_USER``/``_PASSWORD`` else
``D2S_ELASTICSEARCH_USER``/``_PASSWORD`` (Kibana logs users in against Elasticsearch); a private CA
from ``D2S_KIBANA_CA_FILE`` else ``D2S_ELASTICSEARCH_CA_FILE``. Errors are one line and never
show a secret.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from d2s_search.backends.elasticsearch.kibana_objects import (
    retarget,
    saved_objects,
    to_ndjson,
)
from d2s_search.backends.engine.saved_objects import (  # same import-error format
    describe_errors,
    read_ndjson_files,
)
from d2s_search.errors import BackendUnavailableError, D2SError

log = logging.getLogger("d2s_search.kibana")

ENV_URL = "D2S_KIBANA_URL"
ENV_API_KEYS = ("D2S_KIBANA_API_KEY", "D2S_ELASTICSEARCH_API_KEY")
ENV_USERS = (("D2S_KIBANA_USER", "D2S_KIBANA_PASSWORD"), ("D2S_ELASTICSEARCH_USER", "D2S_ELASTICSEARCH_PASSWORD"))
ENV_CA_FILES = ("D2S_KIBANA_CA_FILE", "D2S_ELASTICSEARCH_CA_FILE")
ENV_INSECURE = "D2S_KIBANA_INSECURE"
DEFAULT_SPACE = "default"
IMPORT_PATH = "/api/saved_objects/_import"
# 503 is what Kibana answers while it is starting ("Kibana server is not ready yet").
RETRY_STATUSES = frozenset({502, 503, 504})
RETRY_EXCEPTIONS: tuple[type[Exception], ...] = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
_SPACE_ID = re.compile(r"^[a-z0-9_-]+$")  # Kibana's rule for space ids


class KibanaError(D2SError):
    """Kibana refused the saved objects (bad file, missing references, permissions, no such space)."""


@dataclass
class ImportResult:
    url: str
    space: str
    imported: list[dict[str, str]] = field(default_factory=list)  # {"type", "id", "title"}

    def to_json(self) -> dict[str, Any]:
        return {"kibana": self.url, "space": self.space, "imported": self.imported}


class KibanaClient:
    """Just enough of Kibana's HTTP API, with retries while Kibana is starting."""

    def __init__(
        self,
        url: str,
        *,
        space: str = DEFAULT_SPACE,
        user: str | None = None,
        password: str | None = None,
        api_key: str | None = None,
        ca_file: str | None = None,
        verify: bool = True,
        timeout: float = 60.0,
        retries: int = 4,
        backoff: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        parsed = httpx.URL(url.strip())
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise BackendUnavailableError(
                f"not a Kibana URL: {parsed.copy_with(username=None, password=None)!s} (expected http(s)://host:5601)"
            )
        space = (space or DEFAULT_SPACE).strip()
        if not _SPACE_ID.match(space):
            raise KibanaError(f"invalid Kibana space id {space!r} (lowercase letters, digits, '_' and '-')")
        user = user or parsed.username or None
        password = password or parsed.password or None
        self._secrets = [s for s in (password, api_key) if s]
        self.url = str(parsed.copy_with(username=None, password=None, query=None, fragment=None)).rstrip("/")
        self.space = space
        self.retries = max(0, retries)
        self.backoff = backoff
        self._sleep = sleep
        headers = {"kbn-xsrf": "true", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"ApiKey {api_key}"
        verify_arg: Any = verify
        if verify and ca_file:
            import ssl

            verify_arg = ssl.create_default_context(cafile=ca_file)
        self._client = httpx.Client(
            base_url=self.url,
            auth=httpx.BasicAuth(user, password or "") if user and not api_key else None,
            headers=headers,
            verify=verify_arg,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
        )

    @classmethod
    def from_env(cls, url: str | None = None, env: Mapping[str, str] | None = None, **options: Any) -> KibanaClient:
        env = os.environ if env is None else env
        url = url or env.get(ENV_URL)
        if not url:
            raise BackendUnavailableError(f"no Kibana URL: pass --url or set {ENV_URL}")
        api_key = next((env[v] for v in ENV_API_KEYS if env.get(v)), None)
        user, password = next(((env[u], env.get(p)) for u, p in ENV_USERS if env.get(u)), (None, None))
        options.setdefault("api_key", api_key)
        options.setdefault("user", user)
        options.setdefault("password", password)
        options.setdefault("ca_file", next((env[v] for v in ENV_CA_FILES if env.get(v)), None))
        if env.get(ENV_INSECURE, "").lower() in ("1", "true", "yes"):
            options["verify"] = False
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"KibanaClient({self.url!r}, space={self.space!r})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> KibanaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def space_prefix(self) -> str:
        return "" if self.space == DEFAULT_SPACE else f"/s/{self.space}"

    # -- requests -------------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        # Repeating an import is safe: with overwrite it ends in the same objects.
        attempt = 0
        while True:
            try:
                resp = self._client.request(method, path, **kwargs)
            except RETRY_EXCEPTIONS as exc:
                if "CERTIFICATE_VERIFY_FAILED" in f"{exc} {exc.__cause__} {exc.__context__}":
                    raise BackendUnavailableError(
                        f"TLS certificate of {self.url} is not trusted: set {ENV_CA_FILES[0]} to its CA file"
                    ) from None
                if attempt >= self.retries:
                    raise BackendUnavailableError(
                        f"cannot reach Kibana at {self.url}: {type(exc).__name__} (after {attempt + 1} attempts)"
                    ) from None
            else:
                if resp.status_code not in RETRY_STATUSES or attempt >= self.retries:
                    return resp
            delay = min(30.0, self.backoff * 2**attempt) * (0.5 + random.random() / 2)
            log.info("Kibana not ready, retrying in %.1fs", delay)
            self._sleep(delay)
            attempt += 1

    def check_space(self) -> None:
        """Refuse early when the space does not exist (an import would otherwise fail obscurely)."""
        if self.space == DEFAULT_SPACE:
            return
        resp = self._send("GET", f"/api/spaces/space/{self.space}")
        if resp.status_code == 404:
            raise KibanaError(f"no Kibana space {self.space!r} at {self.url}: create it first (Stack Management > Spaces)")
        if resp.status_code != 200:
            raise KibanaError(self._http_error(resp.status_code, _json(resp)))

    def import_ndjson(self, ndjson: str, overwrite: bool = True) -> tuple[int, list[dict[str, str]] | None]:
        """Import an ndjson export: (objects imported, their type/id/title as Kibana lists them).
        Raises KibanaError when any object is refused."""
        resp = self._send(
            "POST", f"{self.space_prefix}{IMPORT_PATH}",
            params={"overwrite": "true"} if overwrite else None,
            files={"file": ("d2s-search.ndjson", ndjson.encode("utf-8"), "application/ndjson")},
        )
        body = _json(resp)
        if resp.status_code != 200:
            raise KibanaError(self._http_error(resp.status_code, body))
        if not isinstance(body, dict):
            raise KibanaError(f"unexpected answer from {self.url}{IMPORT_PATH}: {self._scrub(str(body))[:200]}")
        errors = body.get("errors") or []
        if not body.get("success") or errors:
            raise KibanaError(f"Kibana at {self.url} refused {len(errors)} object(s): {describe_errors(errors)}")
        listed = [
            {"type": r.get("type", ""), "id": r.get("id", ""), "title": (r.get("meta") or {}).get("title", "")}
            for r in body.get("successResults") or []
        ]
        return int(body.get("successCount", 0)), listed or None

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _http_error(self, status: int, body: Any) -> str:
        message = body.get("message") if isinstance(body, dict) else None
        text = self._scrub(str(message or body))[:300].replace("\n", " ")
        if status == 401:
            return (f"Kibana at {self.url} refused the credentials (401): set D2S_KIBANA_API_KEY, or "
                    "D2S_KIBANA_USER and D2S_KIBANA_PASSWORD (or the D2S_ELASTICSEARCH_* ones)")
        if status == 403:
            return f"Kibana at {self.url} denied the import (403): {text}"
        if status == 404:
            return f"no saved-objects API at {self.url}: is this Kibana's URL (http://localhost:5601), not Elasticsearch's?"
        return f"Kibana at {self.url} answered {status}: {text}"


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text


def load_objects(paths: Sequence[str | Path] = (), index_name: str = "d2s") -> list[dict[str, Any]]:
    """The built-in objects, or those of ndjson files/folders (``*.ndjson``), for ``index_name``."""
    if not paths:
        return saved_objects(index_name)
    objects = read_ndjson_files(paths, KibanaError)
    return retarget(objects, index_name)


def install(client: KibanaClient, objects: list[dict[str, Any]], overwrite: bool = True) -> ImportResult:
    """Import ``objects`` in one request, so references between them resolve together."""
    if not objects:
        raise KibanaError("no saved objects to import")
    client.check_space()
    count, listed = client.import_ndjson(to_ndjson(objects), overwrite=overwrite)
    if listed is None:
        listed = [{"type": o["type"], "id": o["id"], "title": o["attributes"].get("title", "")} for o in objects]
    if count != len(objects):
        raise KibanaError(f"Kibana at {client.url} imported {count} of {len(objects)} objects")
    return ImportResult(url=client.url, space=client.space, imported=listed)
