"""Remember that a bundle's files were hashed, so every run can check them for free.

Hashing the ONNX files takes a noticeable moment; checking sizes alone misses a same-size
edit. So the first run hashes every file and writes a stamp: for each file its size,
``mtime_ns``, ``ctime_ns``, inode and device, and the hash it was found to have. Later runs
compare ``stat`` with the stamp and hash again only when anything differs. Any write to a
file moves its ``ctime`` (which no user call can set back), so an edit that keeps size and
mtime is still caught.

The stamp lives beside the bundle (``.d2s-verified.json``) or, when that folder is
read-only, in the user's cache dir. It is read as untrusted bytes: anything unexpected
just means "not verified yet".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .regular_files import open_regular

STAMP_NAME = ".d2s-verified.json"
STAMP_FORMAT = "d2s-bundle-stamp/1"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "d2s-search" / "bundle-stamps"


def stamp_paths(bundle_dir: Path) -> list[Path]:
    """Where the stamp may be, preferred first."""
    key = hashlib.sha256(os.fsencode(bundle_dir.resolve())).hexdigest()[:32]
    return [bundle_dir / STAMP_NAME, cache_dir() / f"{key}.json"]


def file_state(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino, "device": st.st_dev}


def is_verified(bundle_dir: Path, fingerprint: str, expected: Mapping[str, tuple[os.stat_result, str]]) -> bool:
    """True when a stamp says each file, in exactly its current state, had the expected hash.

    ``expected`` maps file name -> (its stat now, the sha256 the manifest wants).
    """
    wanted = {name: file_state(st) | {"sha256": sha} for name, (st, sha) in expected.items()}
    for path in stamp_paths(bundle_dir):
        stamp = _read(path)
        if stamp and stamp.get("fingerprint") == fingerprint and stamp.get("files") == wanted:
            return True
    return False


def write_stamp(bundle_dir: Path, fingerprint: str, verified: Mapping[str, tuple[os.stat_result, str]]) -> Path | None:
    """Record a successful full check; returns where (None if nowhere is writable)."""
    body = json.dumps({
        "format": STAMP_FORMAT,
        "fingerprint": fingerprint,
        "files": {name: file_state(st) | {"sha256": sha} for name, (st, sha) in verified.items()},
    }, indent=1, sort_keys=True)
    for path in stamp_paths(bundle_dir):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".stamp-", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(body)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return path
        except OSError:
            continue  # read-only bundle folder: try the cache dir
    return None


def _read(path: Path) -> dict | None:
    try:
        with open_regular(path) as fh:
            raw = fh.read((1 << 20) + 1)
        if len(raw) > 1 << 20:
            return None
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != STAMP_FORMAT or not isinstance(data.get("files"), dict):
        return None
    return data
