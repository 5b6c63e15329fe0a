"""Captioned images for aligning the offline model, their splits and cached frozen features.

Sources (both readable offline):

* ``flickr8k``: ``../shared/data/flickr8k-800`` (``captions.txt``: ``image,caption``, five
  captions per photo). Photos are split once, seeded: ``test`` (held out, for the reported
  numbers), ``val`` (model selection) and ``train``.
* ``openclipart``: Debian's public-domain ``openclipart-png`` (``/usr/share/openclipart/png``).
  It ships no titles, so a drawing's caption is built from its file name and folders,
  with author names (tokens seen across many categories) removed. Training only.

Features are computed once through the same preprocessing the runtime uses
(:func:`d2s_search.encoder.preprocess_image`) and cached as ``.npz`` keyed by everything that
changes them (backbone weights, image settings, views, file list).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from d2s_search.errors import D2SError

OPENCLIPART_ROOT = Path("/usr/share/openclipart/png")
VIEWS = ("center", "flip", "full", "full-flip")  # training-time augmentation of photos


class AlignDataError(D2SError):
    """The captioned images are missing or unreadable."""


@dataclass
class Captioned:
    image_id: str
    path: Path
    captions: list[str]
    source: str


# ----------------------------------------------------------------------------- sources


def flickr_photos(root: str | Path) -> list[Captioned]:
    root = Path(root)
    path = root / "captions.txt"
    if not path.is_file():
        raise AlignDataError(f"no captions.txt in {root} (expected flickr8k-800: image,caption rows)")
    by_image: dict[str, list[str]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            by_image.setdefault(row["image"], []).append(row["caption"].strip())
    return [Captioned(name, root / "images" / name, caps, "flickr8k") for name, caps in sorted(by_image.items())]


def split_photos(items: Sequence[Captioned], n_test: int = 200, n_val: int = 100, seed: int = 0) -> dict[str, list[Captioned]]:
    """Seeded split by photo (sorted names, then a permutation): test, val, train."""
    order = np.random.default_rng(seed).permutation(len(items))
    ranked = [items[i] for i in order]
    return {"test": ranked[:n_test], "val": ranked[n_test : n_test + n_val], "train": ranked[n_test + n_val :]}


_WORD = re.compile(r"[a-z]+")


def openclipart_items(
    root: str | Path = OPENCLIPART_ROOT, limit: int = 0, seed: int = 0, categories: Sequence[str] = ()
) -> list[Captioned]:
    """Drawings with a caption from their name and folders: ``a drawing of a beagle (animals, dogs)``.

    ``categories`` keeps only these top-level folders (e.g. ``animals,people``)."""
    root = Path(root)
    if not root.is_dir():
        raise AlignDataError(f"openclipart not found at {root} (apt-get install openclipart-png)")
    files = sorted(p for p in root.rglob("*.png") if p.is_file())
    tokens = {p: _WORD.findall(p.stem.lower().replace("_", " ")) for p in files}
    # Author names follow the title in the file names; they recur across unrelated categories.
    spread: dict[str, set[str]] = {}
    for p, toks in tokens.items():
        for t in toks:
            spread.setdefault(t, set()).add(p.relative_to(root).parts[0])
    counts = Counter(t for toks in tokens.values() for t in set(toks))
    noise = {t for t, cats in spread.items() if len(cats) >= 4 and counts[t] >= 12}
    items = []
    for p in files:
        if categories and p.relative_to(root).parts[0] not in categories:
            continue
        if _pixels(p) > MAX_CLIPART_PIXELS:  # a few posters are hundreds of megapixels
            continue
        title = [t for t in tokens[p] if t not in noise and len(t) > 1]
        folders = [f.replace("_", " ") for f in p.relative_to(root).parts[:-1]]
        if not title:
            title = folders[-1:]
        if not title:
            continue
        caption = f"a drawing of {' '.join(title)} ({', '.join(folders)})"
        items.append(Captioned(str(p.relative_to(root)), p, [caption], "openclipart"))
    if limit and len(items) > limit:
        keep = np.sort(np.random.default_rng(seed).permutation(len(items))[:limit])
        items = [items[i] for i in keep]
    return items


# ----------------------------------------------------------------------------- images

MAX_CLIPART_PIXELS = 16_000_000


def _pixels(path: Path) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:  # reads the header only
                return im.size[0] * im.size[1]
    except (OSError, Image.DecompressionBombError):
        return MAX_CLIPART_PIXELS + 1


def open_rgb(path: Path) -> Image.Image:
    """RGB image; transparent drawings are put on white (not on black, as convert() would)."""
    image = Image.open(path)
    if image.mode in ("RGBA", "LA", "P"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return image.convert("RGB")


def view_pixels(image: Image.Image, settings: dict, view: str) -> np.ndarray:
    from d2s_search.encoder import preprocess_image

    s = dict(settings)
    if view.startswith("full"):
        s.update(resize="exact", crop=False)  # the whole picture, squeezed: another crop
    pixels = preprocess_image(image, s)
    return np.ascontiguousarray(pixels[:, :, ::-1]) if view.endswith("flip") else pixels


# ----------------------------------------------------------------------------- cache


def cache_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached(path: Path, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if path.is_file():
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    arrays = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return arrays
