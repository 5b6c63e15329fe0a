"""Remember which files of a cache state were read in full, so later opens compare ``stat`` only.

Reading every byte of the cache on every open would cost more than the search (330 MB at
123,000 documents, GBs at a million); checking sizes alone misses bytes changed in place.
So each file is checked once against the CRC-32 recorded when it was written, and a stamp
remembers it: per file its size, ``mtime_ns``, ``ctime_ns``, inode and device and the CRC it
had (as :mod:`d2s_search.bundle_stamp` does for bundles). Later opens read a file again only
when its ``stat`` differs: any write moves ``ctime``, which no user call can set back.

File times move in clock ticks (a few ms; a second on some file systems), so a file changed
twice within one tick keeps its ``ctime``. A stamp therefore records only files whose
``ctime`` is older than the moment the stamp was begun, as the file system's clock tells it
(the ``mtime`` of the stamp's temp file, created before the files are looked at): any later
change gets a newer ``ctime``. Where the stamp cannot be written beside the files (a
read-only index; it then lives in the user's cache dir, perhaps on another file system with
another tick) a file must be older by :data:`FOREIGN_CLOCK_MARGIN_NS`.

The stamp (``verified.json`` in the state folder) is untrusted bytes: it only ever spares
the reading of a file whose ``stat`` it matches exactly, for the header it names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from ...regular_files import open_regular

STAMP_NAME = "verified.json"
STAMP_FORMAT = "d2s-cache-stamp/1"
MAX_STAMP_BYTES = 1 << 22
FOREIGN_CLOCK_MARGIN_NS = 2_000_000_000  # FAT keeps times in 2 s steps


def entry(st: os.stat_result, crc: int) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, crc]


def _fallback(state_dir: Path) -> Path:
    from ...settings import cache_dir  # only for an index that cannot be written

    key = hashlib.sha256(os.fsencode(os.path.realpath(state_dir))).hexdigest()[:32]
    return cache_dir() / "index-stamps" / f"{key}.json"


def read(state_dir: Path, header_crc: int) -> dict[str, list[int]]:
    """File name -> the entry a stamp of this header recorded ({} when there is none)."""
    for path in (state_dir / STAMP_NAME, None):
        try:
            with open_regular(path or _fallback(state_dir)) as fh:
                raw = fh.read(MAX_STAMP_BYTES + 1)
            body = json.loads(raw) if len(raw) <= MAX_STAMP_BYTES else None
        except (OSError, ValueError):
            continue
        if (
            isinstance(body, dict)
            and body.get("format") == STAMP_FORMAT
            and body.get("header_crc") == header_crc
            and isinstance(body.get("files"), dict)
        ):
            return body["files"]
    return {}


class Stamp:
    """A stamp being made: begin it before looking at the files it will record, :meth:`add`
    each file (its ``stat`` taken after the stamp was begun) and :meth:`commit`. Never raises:
    where nothing can be written, nothing is recorded."""

    def __init__(self, state_dir: Path, header_crc: int) -> None:
        self.header_crc = header_crc
        self.files: dict[str, list[int]] = {}
        self._fd: int | None = None
        self._tmp = self._path = None
        self._margin = 0
        self.limit_ns = 0
        for path, margin in ((state_dir / STAMP_NAME, 0), (None, FOREIGN_CLOCK_MARGIN_NS)):
            try:
                # the state's own folder is never made again (it may be going away)
                if path is None:
                    path = _fallback(state_dir)
                    path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".tmp-{os.getpid()}-{os.urandom(4).hex()}-{path.name}")
                self._fd = os.open(
                    tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644
                )
            except OSError:
                continue
            self._tmp, self._path, self._margin = tmp, path, margin
            self.limit_ns = os.fstat(self._fd).st_mtime_ns - margin  # the file system's "now"
            break

    def wait_past(self, ctime_ns: int, most_s: float = 0.1) -> None:
        """Move the stamp's moment past ``ctime_ns`` (files the caller just wrote) by waiting
        for the next tick of the file system's clock, for at most ``most_s``."""
        deadline = time.monotonic() + most_s
        while (
            self._fd is not None
            and not self._margin
            and os.utime in os.supports_fd
            and self.limit_ns <= ctime_ns
            and time.monotonic() < deadline
        ):
            time.sleep(0.002)
            try:
                os.utime(self._fd)
                self.limit_ns = os.fstat(self._fd).st_mtime_ns
            except OSError:
                return

    def add(self, name: str, st: os.stat_result, crc: int) -> bool:
        """Record ``name`` as holding ``crc`` in state ``st``; False when it changed too recently."""
        if self._fd is None or st.st_ctime_ns >= self.limit_ns:
            return False
        self.files[name] = entry(st, crc)
        return True

    def commit(self) -> Path | None:
        """Write the stamp (replacing any older one); where, or None."""
        if self._fd is None:
            return None
        body = json.dumps(
            {"format": STAMP_FORMAT, "header_crc": self.header_crc, "files": self.files}
        ).encode()
        try:
            with os.fdopen(self._fd, "wb") as fh:
                self._fd = None
                fh.write(body)
            os.replace(self._tmp, self._path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            return None
        return self._path

    def discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
