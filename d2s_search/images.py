"""Finding and decoding images safely; content-hash document ids.

Everything that can go wrong with one file raises :class:`ImageRejected` with a short
reason, so the caller can report it and go on with the others.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from .errors import ImageRejected
from .regular_files import NotRegularFile, check_regular, open_regular

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".png", ".webp", ".gif", ".bmp", ".dib", ".tif", ".tiff"})
# Phones' pictures: HEIC/HEIF through the `heif` extra (pillow-heif), AVIF through Pillow itself
# when it is built with libavif (its wheels are); read when the decoder is there, else reported.
HEIF_SUFFIXES = frozenset({".heic", ".heif", ".hif"})
AVIF_SUFFIXES = frozenset({".avif"})
# Picture formats we do not decode: reported as skipped ("format not supported"), not ignored
# silently like other files (a phone's .heic photos would otherwise just be missing).
UNSUPPORTED_IMAGE_SUFFIXES = frozenset({
    *HEIF_SUFFIXES, *AVIF_SUFFIXES, ".jxl", ".jp2", ".j2k", ".svg", ".dng", ".cr2", ".cr3", ".nef", ".arw",
    ".orf", ".raf", ".rw2",
})
FORMAT_NOT_SUPPORTED = "format not supported"
NEEDS_HEIF = "HEIC/HEIF needs the heif extra: pip install 'd2s-search[heif]'"
NEEDS_AVIF = "this Pillow decodes no AVIF: pip install --upgrade pillow (its wheels do)"
READ_FORMATS = "JPEG, PNG, WebP, GIF, BMP or TIFF"  # what decode() is tested with (IMAGE_SUFFIXES)
DEFAULT_MAX_PIXELS = 120_000_000  # ~ a 108 MP phone photo; larger is refused as a likely bomb
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
# A query picture (serve's uploads, query --image URL): smaller caps, it is shrunk to the model's input anyway.
QUERY_MAX_BYTES = 20 * 1024 * 1024
QUERY_MAX_PIXELS = 50_000_000

# Never decode partial files into half-grey pictures: a truncated file is an error.
ImageFile.LOAD_TRUNCATED_IMAGES = False
# PIL's own bomb check fires at open with a cryptic message; ours (decode's max_pixels) runs
# on the header size before any pixel is decoded and says what the limit is.
Image.MAX_IMAGE_PIXELS = None


@dataclass
class Candidate:
    """A file found by discovery (not yet read)."""

    path: Path


@dataclass
class LoadedImage:
    path: Path
    id: str  # sha256 of the file bytes
    size_bytes: int
    image: Image.Image  # RGB, EXIF orientation applied
    width: int  # after orientation, before any resizing
    height: int


# Folders no one means to search: system, sync and package folders that are not hidden by name.
# Synology keeps thumbnails in @eaDir and deleted files in #recycle; macOS zips hold __MACOSX.
SYSTEM_FOLDERS = frozenset({"@eaDir", "#recycle", "#snapshot", "node_modules", "__MACOSX", "$RECYCLE.BIN",
                            "System Volume Information"})
_WINDOWS_HIDDEN = getattr(stat, "FILE_ATTRIBUTE_HIDDEN", 0) | getattr(stat, "FILE_ATTRIBUTE_SYSTEM", 0)


@dataclass(frozen=True)
class Skip:
    """What a walk leaves out below the folders it is given (a path given is never skipped).

    ``hidden``: names starting with a dot (``.git``, ``.thumbnails``, macOS ``._IMG_1.jpg``), the
    :data:`SYSTEM_FOLDERS`, and on Windows what the file system marks hidden or system.
    ``exclude``: globs (``fnmatch``: ``*`` also crosses ``/``) matched against the path relative
    to the folder given, with ``/`` between names, and against the name alone; a glob ending
    in ``/`` matches folders only.
    """

    hidden: bool = True
    exclude: tuple[str, ...] = ()

    def reason(self, entry: os.DirEntry, relative: str, is_dir: bool) -> str | None:
        """``"hidden"``, ``"excluded"`` or None (kept)."""
        if self.hidden and (entry.name.startswith(".") or (is_dir and entry.name in SYSTEM_FOLDERS)
                            or _hidden_attribute(entry)):
            return "hidden"
        for pattern in self.exclude:
            folder_only = pattern.endswith("/")
            pattern = pattern.rstrip("/")
            if (is_dir or not folder_only) and (fnmatch.fnmatch(relative, pattern)
                                                 or fnmatch.fnmatch(entry.name, pattern)):
                return "excluded"
        return None


def _hidden_attribute(entry: os.DirEntry) -> bool:
    if not _WINDOWS_HIDDEN:
        return False  # not Windows: hidden means a leading dot
    try:
        return bool(getattr(entry.stat(follow_symlinks=False), "st_file_attributes", 0) & _WINDOWS_HIDDEN)
    except OSError:
        return False


@dataclass
class Skipped:
    """How many folders (not entered) and picture files a walk left out, by reason."""

    hidden: int = 0
    excluded: int = 0

    def add(self, reason: str) -> None:
        setattr(self, reason, getattr(self, reason) + 1)

    @property
    def total(self) -> int:
        return self.hidden + self.excluded


DEFAULT_SKIP = Skip()  # hidden and system folders and files


def heif_available() -> bool:
    """pillow-heif is installed (found, not imported: discovery stays cheap)."""
    from .extras import missing

    return not missing(["pillow_heif"])


def avif_available() -> bool:
    from PIL import features

    return bool(features.check("avif"))


class Formats(NamedTuple):
    """Which suffixes this install reads, and why it refuses the others."""

    readable: frozenset[str]
    refused: dict[str, str]  # suffix -> reason

    @classmethod
    def here(cls) -> Formats:
        readable, refused = set(IMAGE_SUFFIXES), {}
        optional = ((HEIF_SUFFIXES, heif_available(), NEEDS_HEIF), (AVIF_SUFFIXES, avif_available(), NEEDS_AVIF))
        for suffixes, available, why in optional:
            if available:
                readable |= suffixes
            else:
                refused |= {s: f"{FORMAT_NOT_SUPPORTED} ({s[1:]}): {why}" for s in suffixes}
        for suffix in UNSUPPORTED_IMAGE_SUFFIXES - readable - set(refused):
            refused[suffix] = f"{FORMAT_NOT_SUPPORTED} ({suffix[1:]})"
        return cls(frozenset(readable), refused)


class Discovery(NamedTuple):
    files: list[Path]  # in a stable order
    problems: list[tuple[Path, str]]
    skipped: Skipped


def discover(paths: Iterable[str | Path], skip: Skip = DEFAULT_SKIP) -> Discovery:
    """Image files under ``paths`` (files given directly are taken whatever their suffix).

    Folders are walked recursively, following symlinks but never entering the same
    directory twice (symlink loops end); below them, what ``skip`` names is left out (and
    counted). Returns (files in a stable order, problems, what was skipped).
    """
    found: list[Path] = []
    problems: list[tuple[Path, str]] = []
    skipped = Skipped()
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: set[Path] = set()
    formats = Formats.here()

    def add(file: Path) -> None:
        key = file.absolute()
        if key not in seen_files:
            seen_files.add(key)
            found.append(file)

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for file in _walk(path, "", seen_dirs, problems, skip, skipped, formats):
                add(file)
        elif path.suffix.lower() in formats.refused and path.is_file():
            problems.append((path, formats.refused[path.suffix.lower()]))
        elif path.is_file() or path.is_symlink():
            add(path)  # read_bytes refuses it with its reason if it is not a regular file
        elif path.exists():
            problems.append((path, _not_regular_reason(path)))
        else:
            problems.append((path, "no such file or folder"))
    return Discovery(found, problems, skipped)


def _walk(root: Path, relative: str, seen_dirs: set[tuple[int, int]], problems: list[tuple[Path, str]],
          skip: Skip, skipped: Skipped, formats: Formats) -> Iterator[Path]:
    """Image files under ``root`` (``relative``: its path below the folder given, "" for that one)."""
    try:
        st = root.stat()
    except OSError as exc:
        problems.append((root, f"cannot open folder: {exc.strerror or exc}"))
        return
    key = (st.st_dev, st.st_ino)
    if key in seen_dirs:
        return  # a symlink loop or a folder reached twice
    seen_dirs.add(key)
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        problems.append((root, f"cannot list folder: {exc.strerror or exc}"))
        return
    for entry in entries:
        path = Path(entry.path)
        try:
            is_dir = entry.is_dir(follow_symlinks=True)
        except OSError:
            is_dir = False
        suffix = path.suffix.lower()
        below = f"{relative}/{entry.name}" if relative else entry.name
        if is_dir or suffix in formats.readable or suffix in formats.refused:
            reason = skip.reason(entry, below, is_dir)
            if reason is not None:
                skipped.add(reason)  # a folder is not entered: its files are not counted
                continue
        if is_dir:
            yield from _walk(path, below, seen_dirs, problems, skip, skipped, formats)
        elif suffix in formats.readable:
            try:
                check_regular(entry.stat(follow_symlinks=True))
            except NotRegularFile as exc:
                problems.append((path, str(exc)))
                continue
            except OSError:
                pass  # a broken link: read_bytes reports it
            yield path
        elif suffix in formats.refused:
            problems.append((path, formats.refused[suffix]))


def _not_regular_reason(path: Path) -> str:
    try:
        check_regular(path.stat())
    except OSError as exc:
        return str(exc) if isinstance(exc, NotRegularFile) else f"cannot open: {exc.strerror or exc}"
    return "not a regular file"


def read_bytes(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of ``path``, a regular file (never blocks on a FIFO or device)."""
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > max_bytes:
                raise ImageRejected(f"file is {size / 2**20:.0f} MiB, over the {max_bytes / 2**20:.0f} MiB limit")
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:  # grew while we read it
            raise ImageRejected(f"file is over the {max_bytes / 2**20:.0f} MiB limit")
    except ImageRejected:
        raise
    except NotRegularFile as exc:
        raise ImageRejected(str(exc)) from None
    except FileNotFoundError:
        raise ImageRejected("file not found (broken link or removed)") from None
    except PermissionError:
        raise ImageRejected("permission denied") from None
    except IsADirectoryError:
        raise ImageRejected("is a folder") from None
    except OSError as exc:
        raise ImageRejected(f"cannot read: {exc.strerror or exc}") from None
    if not data:
        raise ImageRejected("empty file (0 bytes)")
    return data


def content_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode(
    data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, draft_size: int | None = None, shrink_to: int | None = None
) -> tuple[Image.Image, int, int]:
    """Bytes -> (RGB image, width, height). Applies EXIF orientation; flattens alpha on white;
    takes the first frame of animations; refuses images over ``max_pixels`` before decoding.

    ``draft_size`` lets JPEG decode at a reduced scale (much faster for big photos) when
    the model only needs a small input anyway. ``shrink_to`` (a query picture) brings the
    longest side down to that many pixels right after decoding, before any conversion, so
    a huge 16-bit PNG costs one decoded copy, not several full-size float ones.
    """
    import io

    container = _container(data)
    if container == "heif" and heif_available():
        _register_heif()
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise ImageRejected(
                f"{width}x{height} is over the {max_pixels / 1e6:.0f} MP limit (possible decompression bomb)"
            )
        if getattr(image, "n_frames", 1) > 1:
            image.seek(0)
        if draft_size and image.format == "JPEG":
            image.draft("RGB", (draft_size, draft_size))
        orientation = image.getexif().get(0x0112, 1)
        image.load()
        if shrink_to and max(image.size) > shrink_to:
            image = _shrink(image, shrink_to)
            if orientation in _TRANSPOSE:  # the resized copy may not carry the EXIF block
                image = image.transpose(_TRANSPOSE[orientation])
        else:
            image = ImageOps.exif_transpose(image)
        if orientation in (5, 6, 7, 8):  # rotated by 90 degrees: report the upright size
            width, height = height, width
        return _to_rgb(image), width, height
    except ImageRejected:
        raise
    except UnidentifiedImageError:
        if container == "heif" and not heif_available():
            raise ImageRejected(f"{FORMAT_NOT_SUPPORTED} (heic): {NEEDS_HEIF}") from None
        if container == "avif" and not avif_available():
            raise ImageRejected(f"{FORMAT_NOT_SUPPORTED} (avif): {NEEDS_AVIF}") from None
        if container:
            raise ImageRejected(f"corrupt or truncated image: not a readable {container.upper()} picture") from None
        raise ImageRejected(f"not an image in a format we read ({READ_FORMATS})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise ImageRejected(f"corrupt or truncated image: {reason}") from None


_HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs", b"mif1", b"msf1"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})


def _container(data: bytes) -> str | None:
    """"heif" or "avif" for an ISO-BMFF picture (its ``ftyp`` box's brands), else None:
    whatever its file is called."""
    if data[4:8] != b"ftyp":
        return None
    size = min(int.from_bytes(data[:4], "big"), 256)
    brands = {data[8:12]} | {data[i:i + 4] for i in range(16, max(16, size - 3), 4)}
    if brands & _AVIF_BRANDS:
        return "avif"
    return "heif" if brands & _HEIF_BRANDS else None


@functools.cache
def _register_heif() -> None:
    """Teach Pillow HEIC/HEIF (pillow-heif's opener), once, when the first such picture comes."""
    import pillow_heif

    pillow_heif.register_heif_opener()


# EXIF orientation -> the transpose that makes the picture upright (as ImageOps.exif_transpose).
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _shrink(image: Image.Image, longest: int) -> Image.Image:
    """Box-filter ``image`` down so its longest side is ``longest`` (never up)."""
    width, height = image.size
    if max(width, height) <= longest:
        return image
    scale = longest / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    try:
        return image.resize(size, Image.Resampling.BOX)
    except ValueError:  # modes BOX cannot resample (palette, 1-bit): convert first
        return _to_rgb(image).resize(size, Image.Resampling.BOX)


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "RGBa"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit greyscale: scale to 8 bits rather than clip.
        import numpy as np

        arr = np.asarray(image, dtype=np.float64)
        peak = arr.max() or 1.0
        image = Image.fromarray((arr * (255.0 / peak)).astype("uint8"), mode="L")
    return image.convert("RGB")


def load_image(path: Path, max_pixels: int = DEFAULT_MAX_PIXELS, draft_size: int | None = None) -> LoadedImage:
    data = read_bytes(path)
    image, width, height = decode(data, max_pixels=max_pixels, draft_size=draft_size)
    return LoadedImage(path=path, id=content_id(data), size_bytes=len(data), image=image, width=width, height=height)
