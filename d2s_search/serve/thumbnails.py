"""Thumbnails and previews of stored documents, made once and cached on disk.

Only documents already in the index get pictures, looked up by id (never by a path a
client sends), and only if the file still has the bytes that were indexed: the id is the
SHA-256 of those bytes, so a file replaced since ingest is refused rather than shown under
the old document's words. Every picture is re-encoded as JPEG by PIL through the same safe
decoder ingest uses, so nothing a user put in the folder is served as-is.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ..backends.base import Document
from ..errors import ImageRejected
from ..images import content_id, decode, read_bytes
from ..pathtext import stored_path

DOC_ID = re.compile(r"^[0-9a-f]{64}$")
# Longest side in pixels (never upscaled); None: the whole picture, re-encoded like the others.
SIZES: dict[str, int | None] = {"thumbnail": 320, "preview": 1024, "original": None}


class PictureUnavailable(Exception):
    """The stored document has no usable picture on this machine; carries the reason."""


def default_cache_dir() -> Path:
    """``$D2S_THUMBNAIL_DIR``, else ``$XDG_CACHE_HOME/d2s-search/thumbnails`` (``~/.cache/...``)."""
    if os.environ.get("D2S_THUMBNAIL_DIR"):
        return Path(os.environ["D2S_THUMBNAIL_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "d2s-search" / "thumbnails"


@dataclass
class PictureCache:
    root: Path
    quality: int = 85

    def path_for(self, doc_id: str, kind: str) -> Path:
        if not DOC_ID.match(doc_id) or kind not in SIZES:
            raise ValueError("not a document id or picture kind")  # callers validate first
        # Two-level fan-out keeps folders small on big collections.
        return self.root / kind / doc_id[:2] / f"{doc_id}.jpg"

    def cached(self, doc_id: str, kind: str) -> Path | None:
        path = self.path_for(doc_id, kind)
        return path if path.is_file() else None

    def make(self, doc: Document, kind: str) -> Path:
        """Render and store the picture of ``doc``; safe to race (atomic rename)."""
        target = self.path_for(doc.id, kind)
        if target.is_file():
            return target
        data = self._original_bytes(doc)
        size = SIZES[kind]
        try:
            image, _, _ = decode(data, draft_size=size)
        except ImageRejected as exc:
            raise PictureUnavailable(f"the stored file cannot be decoded: {exc}") from None
        if size is not None:
            image.thumbnail((size, size), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=self.quality if size is not None else 92, optimize=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{id(buf)}.tmp")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, target)
        return target

    @staticmethod
    def _original_bytes(doc: Document) -> bytes:
        if not doc.path:
            raise PictureUnavailable("the document has no file path on this machine")
        try:
            data = read_bytes(stored_path(doc.path))  # regular files only, never blocks
        except ImageRejected as exc:
            raise PictureUnavailable(f"the image file is not readable here ({exc})") from None
        if content_id(data) != doc.id:
            raise PictureUnavailable("the image file has changed since it was indexed; ingest it again")
        return data
