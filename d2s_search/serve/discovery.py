"""Let ``d2s-search query`` ask a running ``d2s-search serve`` instead of loading anything.

``serve`` (on a loopback address only) writes a small discovery file when it accepts
connections and removes it on exit: ``<cache dir>/serve/<hash of the index path>.json`` with
its address, pid, index path, the index's random id (SQLite ``meta``), bundle fingerprint and a
random token (mode 0600, in a 0700 folder).

``query`` treats every byte of it as untrusted: the folder must be a real folder of the current
user that nobody else can write, the file a regular file (no symlink) of the current user that
nobody else can read or write, at most 4 KB of ASCII JSON with exactly the expected keys and
types; the same index path, index id and fingerprint as the index itself records; a loopback
IP literal; a live pid.

A file that passes proves nothing about who listens at its port (the serve may have died and
another program taken the port). So the token never travels: ``query`` sends a fresh random
nonce, and the serve answers with ``HMAC-SHA256(token, nonce, index id, request target,
response body)`` (:func:`answer_proof`). Only the holder of the token can make it; it is good
for this one request; it binds the index the serve answers for, the words and options asked,
and every byte of the hits, so a program in between can neither replay an old answer nor swap
the hits. Any failure (no file, a stale, foreign or unsafe one, a timeout, a slow or wrong
answer, a bad proof) means "search locally", silently.

No FastAPI here: ``query`` imports this module without the ``serve`` extra.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from .. import settings
from ..processes import pid_alive

CHALLENGE_HEADER = "X-D2S-Serve-Challenge"  # request: the client's fresh nonce (hex)
PROOF_HEADER = "X-D2S-Serve-Proof"  # response: answer_proof(...) as hex
# response: the index id the serve answers for (also inside the proof)
INDEX_HEADER = "X-D2S-Serve-Index"
PROOF_CONTEXT = b"d2s-search serve answer 1"  # a proof made for anything else never matches
NONCE_BYTES = 16
NONCE_HEX_CHARS = range(32, 129)  # what a serve accepts as a nonce (hex digits)
MAX_FILE_BYTES = 4096
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # 200 hits with long paths and 50 words each stay far below
# The whole exchange: a loaded machine answers in tens of ms; past this, searching here is quicker.
TIMEOUT_S = 2.0
LOOPBACK_IPS = ("127.0.0.1", "::1")
API_K_MAX = 200  # the API's limits (serve/api.py): beyond them the query runs locally
API_EXPLAIN_MAX = 50
FORMAT = 2
FIELDS = {
    "format": int,
    "host": str,
    "port": int,
    "pid": int,
    "index": str,
    "index_id": str,
    "fingerprint": str,
    "token": str,
}
MAX_PID = 2**31 - 1  # larger ones overflow os.kill
_HEX = frozenset("0123456789abcdef")
_ID_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_")


def index_key(index: str | os.PathLike[str]) -> str:
    """The index folder, absolute and with symlinks resolved, as text (undecodable bytes kept)."""
    return os.fsdecode(os.path.realpath(os.fsencode(index)))


def discovery_path(index: str | os.PathLike[str]) -> Path:
    digest = hashlib.sha256(index_key(index).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return settings.cache_dir() / "serve" / f"{digest}.json"


def new_token() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def valid_nonce(nonce: str) -> bool:
    return len(nonce) in NONCE_HEX_CHARS and set(nonce) <= _HEX


def valid_index_id(index_id: object) -> bool:
    return isinstance(index_id, str) and 0 < len(index_id) <= 128 and set(index_id) <= _ID_CHARS


def answer_proof(token: str, nonce: str, index_id: str, target: bytes, body: bytes) -> str:
    """HMAC-SHA256 keyed by the serve's token over the client's nonce, the index id the serve
    answers for, the request target (path and query string: the words and every option) and
    the response body, each part length-prefixed so no two messages share an encoding."""
    mac = hmac.new(token.encode("ascii"), digestmod=hashlib.sha256)
    for part in (PROOF_CONTEXT, nonce.encode("ascii"), index_id.encode("ascii"), target, body):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()


def announce(
    index: str | os.PathLike[str], host: str, port: int, fingerprint: str, index_id: str, token: str
) -> Path | None:
    """Write the discovery file (atomically, 0600, in a 0700 folder of this user); None when
    not written (never an error)."""
    if host not in LOOPBACK_IPS or not valid_index_id(index_id):
        return None
    path = discovery_path(index)
    entry = {
        "format": FORMAT,
        "host": host,
        "port": port,
        "pid": os.getpid(),
        "index": index_key(index),
        "index_id": index_id,
        "fingerprint": fingerprint,
        "token": token,
    }
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    if not _own_private_folder(path.parent):
        return None
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(json.dumps(entry, ensure_ascii=True))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return None
    return path


def _own_private_folder(folder: Path) -> bool:
    """Make the discovery folder (0700), or take back group and other access from this user's
    own one (readers refuse a folder others can write); False when it is not this user's folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        if st.st_mode & 0o077:
            os.chmod(folder, 0o700, follow_symlinks=False)
    except (OSError, NotImplementedError):
        return False
    return True


def withdraw(index: str | os.PathLike[str], token: str) -> None:
    """Remove the discovery file if it is still ours (another serve may have replaced it)."""
    path = discovery_path(index)
    entry = _read(path)
    if entry is not None and hmac.compare_digest(entry["token"], token):
        with contextlib.suppress(OSError):
            path.unlink()


def _read(path: Path) -> dict | None:
    """The file's entry when only this user can have written it and every field has the
    expected type and range, else None."""
    try:
        raw = _read_private(path)
    except OSError:
        return None
    return _parse(raw)


def _private(st: os.stat_result, others_may: int) -> bool:
    """Owned by this user, and nobody else has the permission bits outside ``others_may``."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o077 & ~others_may


def _read_private(path: Path) -> bytes:
    """The bytes of ``path``: a regular file (not a symlink) only this user can read or write,
    in a real folder (not a symlink) only this user can write; else OSError. Opened through the
    folder's descriptor, so neither can be swapped between the check and the read."""
    dir_fd = os.open(
        path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        if not _private(os.fstat(dir_fd), others_may=0o055):
            raise OSError(
                f"{path.parent} is not a folder of this user that only this user can write"
            )
        flags = (
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
        )
        # A symlink fails (ELOOP); a FIFO opens at once instead of waiting for a writer.
        fd = os.open(path.name, flags, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or not _private(st, others_may=0)
            or st.st_size > MAX_FILE_BYTES
        ):
            raise OSError(
                f"{path} is not a small regular file that only this user can read and write"
            )
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise OSError(f"{path} grew over {MAX_FILE_BYTES} bytes")
    return b"".join(chunks)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    entry = dict(pairs)
    if len(entry) != len(pairs):
        raise ValueError("a key appears twice")
    return entry


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _parse(raw: bytes) -> dict | None:
    """The entry in ``raw`` when it is exactly the expected JSON object, else None."""
    try:
        entry = json.loads(
            raw.decode("ascii"), object_pairs_hook=_unique_keys, parse_constant=_no_constant
        )
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(entry, dict) or entry.keys() != FIELDS.keys():
        return None
    if any(type(entry[key]) is not kind for key, kind in FIELDS.items()):  # bool is not int here
        return None
    if (
        entry["format"] != FORMAT
        or entry["host"] not in LOOPBACK_IPS
        or not 0 < entry["port"] < 65536
    ):
        return None
    if (
        not 0 < entry["pid"] <= MAX_PID
        or not entry["index"]
        or not valid_index_id(entry["index_id"])
    ):
        return None
    if not 0 < len(entry["fingerprint"]) <= 128 or not set(entry["fingerprint"]) <= _HEX:
        return None
    if len(entry["token"]) != 64 or not set(entry["token"]) <= _HEX:
        return None
    return entry


def find(index: str | os.PathLike[str], fingerprint: str, index_id: str) -> dict | None:
    """The running serve of this index (its path and its random id, as the index's own
    database records it) and bundle, or None. The file of a serve that is gone is removed."""
    path = discovery_path(index)
    entry = _read(path)
    if entry is not None and not pid_alive(entry["pid"]):
        _forget(path, entry)
        return None
    if (
        entry is None
        or not fingerprint
        or not valid_index_id(index_id)
        or entry["index"] != index_key(index)
    ):
        return None
    if entry["index_id"] != index_id or entry["fingerprint"] != fingerprint:
        return None  # another index's serve (a copied or stale file), or another bundle
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


def ask(entry: dict, text: str, options, index_id: str) -> dict | None:
    """The serve's /api/search answer (parsed JSON) when it proves to come from the holder of
    the entry's token, for this request and the index ``index_id``; None on any failure. The
    whole exchange ends at TIMEOUT_S, however slowly the other side sends."""
    import http.client
    import threading
    import time
    from urllib.parse import urlencode

    if options.k > API_K_MAX or options.explain > API_EXPLAIN_MAX:
        return None
    params = {
        "q": text,
        "mode": options.mode,
        "k": options.k,
        "fusion": options.fusion,
        "alpha": options.alpha,
        "explain": options.explain,
    }
    if options.window is not None:
        params["window"] = options.window
    target = "/api/search?" + urlencode(params)  # ASCII: urlencode escapes the rest
    nonce = new_nonce()
    conn = http.client.HTTPConnection(entry["host"], entry["port"], timeout=TIMEOUT_S)
    deadline = None
    try:
        started = time.monotonic()
        conn.connect()
        # The socket itself, not conn.sock: http.client drops that once a response says it
        # closes the connection, and reads on through the response's own file.
        deadline = threading.Timer(TIMEOUT_S - (time.monotonic() - started), _hang_up, (conn.sock,))
        deadline.daemon = True
        deadline.start()
        # A loopback serve accepts its own host names only (DNS rebinding guard); Starlette
        # cuts the Host header at the first ':', so "[::1]" would not pass: "localhost" does.
        # The token itself is never sent: only the nonce the answer's proof must cover.
        conn.request(
            "GET",
            target,
            headers={"Host": "localhost", CHALLENGE_HEADER: nonce, "Accept": "application/json"},
        )
        response = conn.getresponse()
        proof = response.getheader(PROOF_HEADER) or ""
        if (
            response.status != 200
            or response.getheader(INDEX_HEADER) != index_id
            or len(proof) != 64
        ):
            return None
        body = response.read(MAX_ANSWER_BYTES + 1)
        if len(body) > MAX_ANSWER_BYTES:
            return None
        expected = answer_proof(entry["token"], nonce, index_id, target.encode("ascii"), body)
        if not hmac.compare_digest(expected.encode("ascii"), proof.encode("latin-1", "replace")):
            return None
        answer = json.loads(body)
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        if deadline is not None:
            deadline.cancel()
        conn.close()
    return answer if isinstance(answer, dict) else None


def _hang_up(sock) -> None:
    """Past the deadline: end the exchange (a blocked read returns at once, short)."""
    import socket

    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def to_result(answer: dict):
    """A :class:`~d2s_search.search.SearchResult` from the API's JSON, or None if it has
    the wrong shape."""
    from ..backends.base import Hit
    from ..inflections import Word
    from ..search import SearchResult

    try:
        hits = [
            Hit(
                id=str(r["id"]),
                score=float(r["score"]),
                path=str(r["path"]),
                url=None if r.get("url") is None else str(r["url"]),
                matched=[(str(m["term"]), float(m["contribution"])) for m in r["matched"]],
                parts={str(k): float(v) for k, v in (r.get("parts") or {}).items()},
                words=[Word(str(w["word"]), float(w["contribution"]), tuple(str(t) for t in w["terms"]))
                       for w in r["words"]],
            )
            for r in answer["results"]
        ]
        terms = [(str(t["term"]), float(t["weight"])) for t in answer["query_terms"]]
        fusion = answer.get("fusion")
        weak = answer.get("weak_query", False)
        unknown = answer.get("unrecognised_words") or []
        if not isinstance(weak, bool) or not isinstance(unknown, list):
            return None
        return SearchResult(
            mode=str(answer["mode"]),
            hits=hits,
            took_ms=float(answer["search_ms"]),
            query_terms=terms,
            fusion=None if fusion is None else str(fusion),
            weak_query=weak,  # the note a query prints is the same whoever searched
            unrecognised_words=[str(w) for w in unknown],
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
