"""The URL stored with each image, so OpenSearch Dashboards can show it as a thumbnail.

``ingest --url-base http://127.0.0.1:8765/`` stores ``url = url_base + <path of the image
relative to the folder it was found under>``, each path segment percent-encoded (UTF-8), so
``photos/beach day/ü.jpg`` becomes ``http://127.0.0.1:8765/beach%20day/%C3%BC.jpg``. That is
exactly the URL ``d2s-search serve-images photos`` answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from urllib.parse import quote, urlsplit

from d2s_search.errors import EXIT_USAGE, D2SError


class UrlBaseError(D2SError):
    """``--url-base`` is not an absolute http(s) URL."""

    exit_code = EXIT_USAGE


def normalize_url_base(url_base: str) -> str:
    """Check ``url_base`` and give it exactly one trailing ``/`` (so relative paths append)."""
    base = url_base.strip()
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UrlBaseError(f"--url-base must be an absolute http(s) URL such as http://127.0.0.1:8765/, got {url_base!r}")
    if parts.query or parts.fragment:
        raise UrlBaseError(f"--url-base cannot have a query or fragment: {url_base!r}")
    if parts.username or parts.password:
        # It would be stored in every document and shown to every Dashboards user.
        raise UrlBaseError("--url-base must not contain credentials")
    return base.rstrip("/") + "/"


def quote_relative(relative: PurePath) -> str:
    """``a b/ü.jpg`` -> ``a%20b/%C3%BC.jpg`` (every segment quoted, ``/`` kept as separator).

    Segments are quoted as the file system's bytes, so a name that is not UTF-8 still gets a
    URL (``bad\xff.jpg`` -> ``bad%FF.jpg``) that ``serve-images`` maps back to the same file.
    """
    return "/".join(quote(os.fsencode(part), safe="") for part in relative.parts)


def image_url(url_base: str, root: str | Path, file: str | Path) -> str:
    """URL of ``file`` found under the folder ``root`` (``root`` may also be the file itself)."""
    base = normalize_url_base(url_base)
    root_path, file_path = Path(os.path.abspath(root)), Path(os.path.abspath(file))
    if root_path == file_path:
        return base + quote_relative(PurePath(file_path.name))
    return base + quote_relative(file_path.relative_to(root_path))


def url_builder(url_base: str, roots: Sequence[str | Path]) -> Callable[[Path], str | None]:
    """``url_for(path)`` for ``ingest``: the path relative to the ingest argument it was found under.

    With nested arguments (``ingest photos photos/2024``) the outermost one wins, so one
    ``serve-images photos`` serves them all. A file given directly gets its own name.
    Paths are compared without resolving symlinks, like ``ingest`` walks them.
    """
    base = normalize_url_base(url_base)
    folders = sorted(
        (Path(os.path.abspath(r)) for r in roots if Path(r).is_dir()), key=lambda p: len(p.parts)
    )

    def url_for(path: Path) -> str | None:
        absolute = Path(os.path.abspath(path))
        for folder in folders:  # shallowest first
            if absolute.is_relative_to(folder):
                return base + quote_relative(absolute.relative_to(folder))
        return base + quote_relative(PurePath(absolute.name))

    return url_for
