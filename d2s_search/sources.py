"""Where pictures come from: local paths, or object stores and other file systems by URI.

A path with a scheme (``s3://bucket/photos``, ``gs://...``, ``hdfs://...``, ``file:///...``) is
read through ``pyarrow.fs`` (the ``ray`` extra brings pyarrow; credentials as pyarrow reads them:
the AWS and Google variables and files). The index stores such a picture's path as its URI; every
place that asks whether a stored picture still exists, or reads it again (ingest's copies and
moves, ``index stats``, ``index prune``, ``index reindex``), goes through :func:`exists` and
:func:`read`, so a URI is never taken for a missing local file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ImageRejected
from .pathtext import stored_path

if TYPE_CHECKING:
    from .images import Skip, Skipped

# images.py (and PIL with it) is imported where pictures are listed or read: `index stats`
# asks exists() of every stored path and decodes nothing.

# Schemes pyarrow.fs.FileSystem.from_uri opens (http(s) is not a file system).
_URI = re.compile(r"^(s3|gs|gcs|hdfs|viewfs|abfs|abfss|file)://", re.IGNORECASE)

Source = Path | str  # a local path, or a URI (str)


def is_uri(path: object) -> bool:
    return isinstance(path, str) and bool(_URI.match(path))


def _filesystem(uri: str):
    from .extras import require

    require("ray", ("pyarrow",), who=f"reading {uri.split('://', 1)[0]}:// paths")
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as exc:  # pyarrow's errors are both
        raise ImageRejected(f"cannot open {uri}: {' '.join(str(exc).split())[:200]}") from None


def exists(path: str) -> bool:
    """Whether the stored path (text, as the index keeps it) still names a regular file."""
    if not is_uri(path):
        return stored_path(path).is_file()
    import pyarrow.fs as pafs

    try:
        fs, inner = _filesystem(path)
        return fs.get_file_info(inner).type == pafs.FileType.File
    except (ImageRejected, OSError):
        return False


def read(path: Source, max_bytes: int | None = None) -> bytes:
    """The bytes of a local path (a regular file) or of a URI, at most ``max_bytes`` (default:
    ingest's limit); ImageRejected with the reason."""
    from .images import DEFAULT_MAX_BYTES, read_bytes

    max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if not is_uri(path):
        return read_bytes(Path(path) if not isinstance(path, Path) else path, max_bytes)
    import pyarrow.fs as pafs

    fs, inner = _filesystem(path)
    try:
        info = fs.get_file_info(inner)
        if info.type != pafs.FileType.File:
            raise ImageRejected("not found" if info.type == pafs.FileType.NotFound else "not a file")
        if info.size is not None and info.size > max_bytes:
            raise ImageRejected(f"file is {info.size / 2**20:.0f} MiB, over the {max_bytes / 2**20:.0f} MiB limit")
        with fs.open_input_file(inner) as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ImageRejected(f"cannot read: {' '.join(str(exc).split())[:200]}") from None
    if len(data) > max_bytes:
        raise ImageRejected(f"file is over the {max_bytes / 2**20:.0f} MiB limit")
    return data


class _Name:
    """What :meth:`Skip.reason` looks at of a listed entry: its name (no Windows attributes)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def stat(self, follow_symlinks: bool = False):
        raise OSError("not a local file")


def discover_sources(paths: Iterable[str | Path], skip: Skip) -> tuple[list[Source], list[tuple[Source, str]], Skipped]:
    """:func:`~d2s_search.images.discover` for local paths, and the pictures under each URI
    (a URI of a file is taken whatever its suffix), with the same skip rules. Local files first,
    then each URI's pictures in name order."""
    from .images import Skipped, discover

    given = list(paths)
    local = [p for p in given if not is_uri(p)]
    found: list[Source] = []
    problems: list[tuple[Source, str]] = []
    skipped = Skipped()
    if local or not given:
        found_local = discover(local, skip)
        found += found_local[0]
        problems += found_local[1]
        skipped = found_local[2]
    for uri in (p for p in given if is_uri(p)):
        files, trouble = _list_uri(str(uri), skip, skipped)
        found += files
        problems += trouble
    return found, problems, skipped


def _list_uri(uri: str, skip: Skip, skipped: Skipped) -> tuple[list[str], list[tuple[Source, str]]]:
    import pyarrow.fs as pafs

    from .images import IMAGE_SUFFIXES

    try:
        fs, inner = _filesystem(uri)
        info = fs.get_file_info(inner)
    except (ImageRejected, OSError) as exc:
        return [], [(uri, str(exc))]
    if info.type == pafs.FileType.File:
        return [uri], []
    if info.type != pafs.FileType.Directory:
        return [], [(uri, "not found")]
    prefix = uri.rstrip("/")
    root = inner.rstrip("/")
    try:
        entries = fs.get_file_info(pafs.FileSelector(inner, recursive=True))
    except OSError as exc:
        return [], [(uri, f"cannot list: {' '.join(str(exc).split())[:200]}")]
    left_out: set[str] = set()  # folders skipped: nothing below them is taken
    files: list[str] = []
    for entry in sorted(entries, key=lambda e: e.path):
        relative = entry.path[len(root):].lstrip("/")
        if any(relative.startswith(folder + "/") for folder in left_out):
            continue
        is_dir = entry.type == pafs.FileType.Directory
        reason = skip.reason(_Name(entry.base_name), relative, is_dir)
        if reason:
            if is_dir:
                left_out.add(relative)
            if is_dir or Path(entry.base_name).suffix.lower() in IMAGE_SUFFIXES:
                skipped.add(reason)
            continue
        if entry.type == pafs.FileType.File and Path(entry.base_name).suffix.lower() in IMAGE_SUFFIXES:
            files.append(f"{prefix}/{relative}")
    return files, []
