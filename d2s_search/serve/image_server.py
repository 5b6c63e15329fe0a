"""``d2s-search serve-images DIR``: a read-only static server for one folder of pictures.

It exists so that the ``url`` stored with each image (see :mod:`d2s_search.serve.image_urls`)
resolves, and OpenSearch Dashboards can show thumbnails. It serves image files only:
no listings, no other files, nothing outside ``DIR`` (``..`` in any encoding, and symlinks
whose target lies outside ``DIR``, are refused), GET and HEAD only. Everything refused
answers 404, so a probe cannot tell "outside" from "missing".
"""

from __future__ import annotations

import email.utils
import os
import shutil
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit

from d2s_search.errors import D2SError
from d2s_search.regular_files import open_regular

from .hosts import LOOPBACK_NAMES, host_name  # noqa: F401  (re-exported)

# Explicit, not `mimetypes`: its table depends on the platform (e.g. no webp on older systems).
CONTENT_TYPES = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".jpe": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".gif": "image/gif",
    ".bmp": "image/bmp",
    ".dib": "image/bmp",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
class ImageServerError(D2SError):
    """The folder cannot be served (missing, not a folder) or the address is taken."""


def resolve_request_path(root: Path, target: str) -> Path | None:
    """The real file a request target names inside ``root`` (already resolved), else None.

    ``target`` is the raw request target (``/a%20b/c.jpg?x=1``). Percent-decoding happens
    once, before the ``..`` check, so ``%2e%2e`` is caught; the final check on the resolved
    path catches symlinks (file or folder) that lead out of ``root``.
    """
    path = urlsplit(target).path
    if not path.startswith("/"):
        return None
    # Bytes, like the file system: a name that is not UTF-8 is reachable by its %XX escapes.
    decoded = os.fsdecode(unquote_to_bytes(path))
    if "\x00" in decoded or "\\" in decoded:
        return None
    parts = [p for p in decoded.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        return None
    candidate = root.joinpath(*parts)
    if candidate.suffix.lower() not in CONTENT_TYPES:
        return None
    try:
        real = candidate.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, dangling link, symlink loop
        return None
    if not real.is_relative_to(root) or not real.is_file():
        return None
    if real.suffix.lower() not in CONTENT_TYPES:  # e.g. photo.jpg -> notes.txt inside root
        return None
    return real


class _Handler(BaseHTTPRequestHandler):
    server: ImageServer
    server_version = "d2s-search-images"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds an idle keep-alive connection may hold a thread

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _refuse_method(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_method

    def _serve(self, send_body: bool) -> None:
        if not self._host_allowed():
            self._refuse_host(send_body)
            return
        file = resolve_request_path(self.server.root, self.path)
        if file is None:
            self._not_found(send_body)
            return
        try:
            fh = open_regular(file)  # never hangs on a FIFO swapped in after the check
        except OSError:
            self._not_found(send_body)
            return
        try:
            st = os.fstat(fh.fileno())
            if self._not_modified(st.st_mtime):
                self.send_response(HTTPStatus.NOT_MODIFIED)
                self.end_headers()
                return
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", CONTENT_TYPES[file.suffix.lower()])
            self.send_header("Content-Length", str(st.st_size))
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            self.send_header("Cache-Control", "public, max-age=300")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if send_body:
                shutil.copyfileobj(fh, self.wfile, 256 * 1024)
        finally:
            fh.close()

    def _not_modified(self, mtime: float) -> bool:
        since = self.headers.get("If-Modified-Since")
        if not since:
            return False
        try:
            when = email.utils.parsedate_to_datetime(since)
        except (TypeError, ValueError):
            return False
        return when is not None and int(mtime) <= when.timestamp()

    def _host_allowed(self) -> bool:
        """DNS-rebinding guard (as ``serve``): on loopback, only loopback names in ``Host``."""
        allowed = self.server.allowed_hosts
        if allowed is None:
            return True
        return host_name(self.headers.get("Host", "")) in allowed

    def _refuse_host(self, send_body: bool) -> None:
        body = b"Invalid host header\n"
        self.send_response(HTTPStatus.BAD_REQUEST)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if send_body:
            self.wfile.write(body)

    def _not_found(self, send_body: bool) -> None:
        body = b"not found\n"
        self.send_response(HTTPStatus.NOT_FOUND)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 -- stdlib signature
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {format % args}")


class ImageServer(ThreadingHTTPServer):
    """``ImageServer(root).url`` is the ``--url-base`` that makes ingested URLs resolve."""

    daemon_threads = True

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 8765,
                 log: Callable[[str], None] | None = None) -> None:
        folder = Path(root).expanduser()
        if not folder.is_dir():
            raise ImageServerError(f"cannot serve {folder}: not a folder")
        self.root = folder.resolve(strict=True)
        self.log = log
        # Bound to loopback: a page elsewhere must not reach us through a rebound DNS name.
        self.allowed_hosts = LOOPBACK_NAMES if host in LOOPBACK_HOSTS else None
        if ":" in host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise ImageServerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/"

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, embedding); ``shutdown()`` stops it."""
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                  name="d2s-images", daemon=True)
        thread.start()
        return thread
