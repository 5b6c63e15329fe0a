"""Let ``d2s-search query`` ask a running ``d2s-search serve`` instead of loading anything.

``serve`` (on a loopback address only) writes a small discovery file when it accepts
connections and removes it on exit: ``<cache dir>/serve/<hash of the index path>.json`` with
its address, pid, index path, bundle fingerprint and a random token (mode 0600). ``query``
reads it as untrusted bytes: a regular file of the current user, at most 4 KB, every field of
the expected type; the same index and fingerprint; a loopback IP literal; a live pid. The
token travels in a request header and the serve confirms it in a response header, so a
process that took the port after the serve died is never believed. Any failure (no file,
a stale or foreign one, a timeout, an HTTP error, a reply of the wrong shape) means "search
locally", silently.

No FastAPI here: ``query`` imports this module without the ``serve`` extra.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from .. import settings
from ..processes import pid_alive
from ..regular_files import read_regular

TOKEN_HEADER = "X-D2S-Serve-Token"
CONFIRM_HEADER = "X-D2S-Serve-Token-Ok"
MAX_FILE_BYTES = 4096
TIMEOUT_S = 2.0  # a loaded machine answers in tens of ms; past this, searching here is quicker
LOOPBACK_IPS = ("127.0.0.1", "::1")
API_K_MAX = 200  # the API's limits (serve/api.py): beyond them the query runs locally
API_EXPLAIN_MAX = 50
FORMAT = 1


def index_key(index: str | os.PathLike[str]) -> str:
    """The index folder, absolute and with symlinks resolved, as text (undecodable bytes kept)."""
    return os.fsdecode(os.path.realpath(os.fsencode(index)))


def discovery_path(index: str | os.PathLike[str]) -> Path:
    digest = hashlib.sha256(index_key(index).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return settings.cache_dir() / "serve" / f"{digest}.json"


def new_token() -> str:
    return secrets.token_hex(32)


def announce(index: str | os.PathLike[str], host: str, port: int, fingerprint: str, token: str) -> Path | None:
    """Write the discovery file (atomically, 0600); None when not written (never an error)."""
    if host not in LOOPBACK_IPS:
        return None
    path = discovery_path(index)
    entry = {"format": FORMAT, "host": host, "port": port, "pid": os.getpid(), "index": index_key(index),
             "fingerprint": fingerprint, "token": token}
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, ensure_ascii=True))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return None
    return path


def withdraw(index: str | os.PathLike[str], token: str) -> None:
    """Remove the discovery file if it is still ours (another serve may have replaced it)."""
    path = discovery_path(index)
    entry = _read(path)
    if entry is not None and hmac.compare_digest(entry["token"], token):
        with contextlib.suppress(OSError):
            path.unlink()


def _read(path: Path) -> dict | None:
    """The file's entry when every field has the expected type and range, else None."""
    try:
        if os.lstat(path).st_uid != os.getuid():
            return None  # someone else's file in our cache dir: ignore it
        entry = json.loads(read_regular(path, MAX_FILE_BYTES))
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None
    host, port, pid = entry.get("host"), entry.get("port"), entry.get("pid")
    token, fingerprint, index = entry.get("token"), entry.get("fingerprint"), entry.get("index")
    if host not in LOOPBACK_IPS or type(port) is not int or not 0 < port < 65536:
        return None
    if type(pid) is not int or pid <= 0 or not isinstance(index, str) or not isinstance(fingerprint, str):
        return None
    if not isinstance(token, str) or len(token) != 64 or any(c not in "0123456789abcdef" for c in token):
        return None
    return entry


def find(index: str | os.PathLike[str], fingerprint: str) -> dict | None:
    """The running serve of this index and bundle, or None."""
    path = discovery_path(index)
    entry = _read(path)
    if entry is not None and not pid_alive(entry["pid"]):
        _forget(path, entry)
        return None
    if entry is None or entry["index"] != index_key(index) or not fingerprint:
        return None
    if not hmac.compare_digest(entry["fingerprint"].encode(), fingerprint.encode()):
        return None
    return entry


def _forget(path: Path, entry: dict) -> None:
    """Remove the file of a serve that is gone without removing it (killed: SIGKILL, a crash),
    unless another serve has replaced it since it was read."""
    again = _read(path)
    if again is not None and hmac.compare_digest(again["token"], entry["token"]) and not pid_alive(again["pid"]):
        with contextlib.suppress(OSError):
            path.unlink()




def address(entry: dict) -> str:
    host = f"[{entry['host']}]" if ":" in entry["host"] else entry["host"]
    return f"http://{host}:{entry['port']}"


def ask(entry: dict, text: str, options) -> dict | None:
    """The serve's /api/search answer (parsed JSON), or None on any failure."""
    import http.client
    from urllib.parse import urlencode

    if options.k > API_K_MAX or options.explain > API_EXPLAIN_MAX:
        return None
    params = {"q": text, "mode": options.mode, "k": options.k, "fusion": options.fusion, "alpha": options.alpha,
              "explain": options.explain}
    if options.window is not None:
        params["window"] = options.window
    conn = http.client.HTTPConnection(entry["host"], entry["port"], timeout=TIMEOUT_S)
    try:
        # A loopback serve accepts its own host names only (DNS rebinding guard); Starlette
        # cuts the Host header at the first ':', so "[::1]" would not pass: "localhost" does.
        conn.request("GET", "/api/search?" + urlencode(params),
                     headers={"Host": "localhost",
                              TOKEN_HEADER: entry["token"], "Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(64 * 1024 * 1024)
        if response.status != 200 or response.getheader(CONFIRM_HEADER) != "1":
            return None
        answer = json.loads(body)
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    return answer if isinstance(answer, dict) else None


def to_result(answer: dict):
    """A :class:`~d2s_search.search.SearchResult` from the API's JSON, or None if it has
    the wrong shape."""
    from ..backends.base import Hit
    from ..search import SearchResult

    try:
        hits = [
            Hit(id=str(r["id"]), score=float(r["score"]), path=str(r["path"]),
                url=None if r.get("url") is None else str(r["url"]),
                matched=[(str(m["term"]), float(m["contribution"])) for m in r["matched"]],
                parts={str(k): float(v) for k, v in (r.get("parts") or {}).items()})
            for r in answer["results"]
        ]
        terms = [(str(t["term"]), float(t["weight"])) for t in answer["query_terms"]]
        fusion = answer.get("fusion")
        return SearchResult(mode=str(answer["mode"]), hits=hits, took_ms=float(answer["search_ms"]),
                            query_terms=terms, fusion=None if fusion is None else str(fusion))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def token_matches(expected: str | None, given: str | None) -> bool:
    return bool(expected) and given is not None and hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))
