"""The public encoder: a model bundle's two graphs, giving texts and pictures as sparse
``{word: weight}`` bags and dense vectors (what an index stores and searches with)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..bundle import Bundle
from ..encoder import Encoder as _RuntimeEncoder
from ..errors import ImageInputError, QueryError, SettingsError
from ..index_access import load_bundle
from ..pathtext import path_to_text
from ..search import text_terms

if TYPE_CHECKING:
    from PIL import Image

    ImageInput = str | os.PathLike | Image.Image

BATCH = 32  # texts or pictures per run of a graph


@dataclass(frozen=True)
class Encoding:
    """One text or picture, encoded. ``sparse``: the head's weight per vocabulary word
    (positive weights only; special tokens never appear). ``dense``: the frozen model's
    L2-normalised vector (float32)."""

    sparse: dict[str, float]
    dense: np.ndarray

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The ``n`` strongest (word, weight) pairs, strongest first (ties by word)."""
        return sorted(self.sparse.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


class Encoder:
    """A bundle's text and image encoders (ONNX Runtime; no torch). Make one with
    :meth:`load`; :meth:`encode_text` and :meth:`encode_images` take lists and return one
    :class:`Encoding` each, in order."""

    def __init__(self, runtime: _RuntimeEncoder) -> None:
        self._runtime = runtime  # internal: use Encoder.load

    @classmethod
    def load(cls, bundle: str | os.PathLike | None = None, *, device: str = "auto",
             threads: int | None = None) -> Encoder:
        """Load the bundle at ``bundle`` (a folder written by ``d2s-search export-onnx``; None:
        the one exported last) and both of its graphs, so a broken graph fails here.
        ``device``: "auto" (CUDA when it loads, else CPU), "cpu" or "cuda"."""
        if device not in ("auto", "cpu", "cuda"):
            raise SettingsError(f"unknown device {device!r}: use auto, cpu or cuda")
        loaded = load_bundle(os.fspath(bundle) if bundle is not None else None)
        runtime = _RuntimeEncoder(loaded, device=device, threads=threads)
        runtime.text_session, runtime.image_session  # noqa: B018 (created now: errors surface at load)
        return cls(runtime)

    @property
    def bundle(self) -> Bundle:
        return self._runtime.bundle

    @property
    def bundle_path(self) -> Path:
        return self._runtime.bundle.path

    @property
    def model(self) -> str:
        return self._runtime.bundle.model_name

    @property
    def dense_dim(self) -> int:
        return self._runtime.bundle.dense_dim

    def encode_text(self, texts: Sequence[str], *, top_k: int | None = None) -> list[Encoding]:
        """Each text as a query is searched with (``top_k``: keep only its k strongest words)."""
        texts = _as_list(texts, str, "encode_text", "texts")
        out: list[Encoding] = []
        for start in range(0, len(texts), BATCH):
            enc = self._runtime.encode_texts(texts[start:start + BATCH])
            out += [Encoding(text_terms(self._runtime, enc, row, top_k), enc.dense[row])
                    for row in range(len(enc.dense))]
        return out

    def encode_images(self, images: Sequence[ImageInput], *, top_k: int | None = None) -> list[Encoding]:
        """Each picture (a file path, or a PIL image) as an index stores it (``top_k``: keep
        only its k strongest words; ``ingest(top_k=...)`` does the same)."""
        images = _as_list(images, object, "encode_images", "images")
        out: list[Encoding] = []
        for start in range(0, len(images), BATCH):
            decoded = [picture(item, draft_size=self._draft_size) for item in images[start:start + BATCH]]
            dense, sparse = self._runtime.encode_images(decoded)
            out += [Encoding(self._runtime.to_terms(sparse[row], top_k=top_k), dense[row])
                    for row in range(len(decoded))]
        return out

    @property
    def _draft_size(self) -> int:
        """JPEGs decode at a reduced scale down to twice the model's input, as ingest does."""
        return int(self._runtime.bundle.image_settings["size"]) * 2

    def __repr__(self) -> str:
        return f"Encoder(bundle={path_to_text(str(self.bundle_path))!r}, model={self.model!r})"


def picture(item: ImageInput, as_query: bool = False, draft_size: int | None = None) -> Image.Image:
    """A PIL image as given, or the picture at a path (or an http(s) URL) decoded as ingest decodes it (EXIF
    orientation, size limit); a file that is missing or not a picture is an ImageInputError
    (a QueryImageError ``as_query``). PIL is imported here: encoding texts never needs it."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return item
    if not isinstance(item, (str, os.PathLike)):
        raise ImageInputError(f"not a picture: {type(item).__name__} (give a file path or a PIL image)")
    from ..errors import ImageRejected, QueryImageError
    from ..images import DEFAULT_MAX_PIXELS, decode, load_image
    from ..remote_image import fetch_image, is_url

    if isinstance(item, str) and is_url(item):  # an http(s) URL: fetched with the same limits as query --image
        from ..redact import strip_url_credentials

        error, role = (QueryImageError, " as a query") if as_query else (ImageInputError, "")
        try:
            return decode(fetch_image(item), max_pixels=DEFAULT_MAX_PIXELS, draft_size=draft_size)[0]
        except ImageRejected as exc:
            raise error(f"cannot use {strip_url_credentials(item)}{role}: {exc}") from None
    try:
        return load_image(Path(item), max_pixels=DEFAULT_MAX_PIXELS, draft_size=draft_size).image
    except ImageRejected as exc:
        error, role = (QueryImageError, " as a query") if as_query else (ImageInputError, "")
        raise error(f"cannot use {path_to_text(os.fspath(item))}{role}: {exc}") from None


def _as_list(items, kind: type, method: str, name: str) -> list:
    """A bare string is one text, not a list of characters: refused, saying what to pass."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise QueryError(f"{method} takes a list of {name}, e.g. {method}([...])")
    wrong = [type(x).__name__ for x in items if not isinstance(x, kind)]
    if wrong:
        raise QueryError(f"{method}: every item must be a {kind.__name__}, not {wrong[0]}")
    return list(items)
