"""What a picture says about itself (EXIF) and what the user says about it (a sidecar file).

Every document carries a :class:`Metadata`: when the picture was taken (EXIF
``DateTimeOriginal``, else the file's modification time), the camera (EXIF make and model),
where (EXIF GPS, as latitude and longitude in degrees) and the user's own fields from
``ingest --metadata FILE`` (a CSV or JSON Lines file keyed by path or file name). Filters
(:mod:`d2s_search.filters`) narrow searches by them on every backend.

Times are seconds since 1970 in UTC. An EXIF time without ``OffsetTimeOriginal`` is the
camera's wall clock with no zone: it is read as UTC, and dates typed in filters are read the
same way, so "taken on 2019-06-01" means what the camera showed.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .errors import MetadataError

FieldValue = Union[str, float, bool]  # noqa: UP007 (Python 3.10 evaluates this at import)
FIELD_TYPES = ("keyword", "number", "date", "boolean")
# Names the index uses itself: a sidecar column of one of these names would be ambiguous.
RESERVED_FIELDS = frozenset({
    "id", "path", "file", "url", "folder", "taken", "taken_at", "camera", "location", "near", "width", "height",
    "size_bytes", "ingested_at", "sparse", "dense", "terms", "fields",
})
_FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")

EXIF_IFD, GPS_IFD = 0x8769, 0x8825
MAKE, MODEL = 0x010F, 0x0110
DATETIME, DATETIME_ORIGINAL, DATETIME_DIGITIZED, OFFSET_TIME_ORIGINAL = 0x0132, 0x9003, 0x9004, 0x9011


@dataclass(frozen=True)
class Metadata:
    """A document's metadata; every part may be missing (None, or no fields)."""

    taken_at: float | None = None  # seconds since 1970, UTC
    camera: str | None = None  # "Make Model", e.g. "Canon Canon EOS 5D" as the camera writes it
    location: tuple[float, float] | None = None  # (latitude, longitude) in degrees
    fields: Mapping[str, FieldValue] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.taken_at is not None or bool(self.camera) or self.location is not None or bool(self.fields)

    def with_fields(self, fields: Mapping[str, FieldValue]) -> Metadata:
        return Metadata(self.taken_at, self.camera, self.location, dict(fields))

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at": iso_time(self.taken_at) if self.taken_at is not None else None,
            "camera": self.camera,
            "location": {"lat": self.location[0], "lon": self.location[1]} if self.location else None,
            "fields": dict(self.fields),
        }


NO_METADATA = Metadata()


def iso_time(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat().replace("+00:00", "Z")


# --- EXIF ---------------------------------------------------------------------------------


def picture_metadata(image, file_time: float | None = None) -> Metadata:
    """The EXIF metadata of an opened PIL image (``file_time``: the file's modification time,
    used when the picture has no EXIF date). Values that are missing or malformed are left
    out, never guessed: a damaged EXIF block costs its fields, not the picture."""
    try:
        exif = image.getexif()
    except Exception:  # PIL raises many kinds on a damaged block
        exif = {}
    taken = _exif_time(exif)
    camera = _camera(exif)
    location = _gps(exif)
    if taken is None and file_time is not None and math.isfinite(file_time):
        taken = float(file_time)
    return Metadata(taken_at=taken, camera=camera, location=location)


def read_metadata(data: bytes, file_time: float | None = None) -> Metadata:
    """:func:`picture_metadata` of a picture's bytes (headers only: nothing is decoded)."""
    from PIL import Image

    from .images import _container, _register_heif, heif_available

    if _container(data) == "heif" and heif_available():
        _register_heif()
    try:
        with Image.open(io.BytesIO(data)) as image:
            return picture_metadata(image, file_time)
    except Exception:
        return Metadata(taken_at=file_time if file_time is not None and math.isfinite(file_time) else None)


def _ifd(exif, tag: int) -> Mapping:
    try:
        return exif.get_ifd(tag) or {}
    except Exception:
        return {}


def _exif_time(exif) -> float | None:
    sub = _ifd(exif, EXIF_IFD)
    for value in (sub.get(DATETIME_ORIGINAL), sub.get(DATETIME_DIGITIZED), exif.get(DATETIME)):
        when = _parse_exif_time(value, sub.get(OFFSET_TIME_ORIGINAL))
        if when is not None:
            return when
    return None


def _parse_exif_time(value, offset) -> float | None:
    if not isinstance(value, str):
        return None
    text = value.strip().rstrip("\x00")
    try:
        when = dt.datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None
    zone = dt.timezone.utc
    if isinstance(offset, str) and re.fullmatch(r"[+-]\d\d:\d\d", offset.strip().rstrip("\x00")):
        sign = -1 if offset.strip()[0] == "-" else 1
        hours, minutes = int(offset.strip()[1:3]), int(offset.strip()[4:6])
        zone = dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
    return when.replace(tzinfo=zone).timestamp()


def _text(value) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return " ".join(str(value).replace("\x00", " ").split()) if value is not None else ""


def _camera(exif) -> str | None:
    make, model = _text(exif.get(MAKE)), _text(exif.get(MODEL))
    if model.lower().startswith(make.lower()):  # "Canon" + "Canon EOS 5D": said once
        make = ""
    camera = " ".join(p for p in (make, model) if p)[:200]
    return camera or None


def _gps(exif) -> tuple[float, float] | None:
    gps = _ifd(exif, GPS_IFD)
    lat = _degrees(gps.get(2), gps.get(1), "S")
    lon = _degrees(gps.get(4), gps.get(3), "W")
    if lat is None or lon is None or not (-90 <= lat <= 90 and -180 <= lon <= 180) or (lat == 0 and lon == 0):
        return None  # (0, 0) is what cameras write when they had no fix
    return round(lat, 7), round(lon, 7)


def _degrees(value, ref, negative: str) -> float | None:
    try:
        d, m, s = (float(x) for x in value)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    total = d + m / 60 + s / 3600
    if not math.isfinite(total):
        return None
    return -total if _text(ref).upper().startswith(negative) else total


# --- the user's own fields: sidecar files ---------------------------------------------------


@dataclass
class Sidecar:
    """User fields from a CSV or JSON Lines file: by path (resolved against the file's folder)
    and by file name (a row keyed by a bare name applies to every picture of that name)."""

    source: str
    types: dict[str, str]
    by_path: dict[str, dict[str, FieldValue]]
    by_name: dict[str, dict[str, FieldValue]]

    def fields_for(self, path: str) -> dict[str, FieldValue] | None:
        """The fields of the picture at ``path`` (as the index stores it), or None."""
        found = self.by_path.get(path)
        if found is None:
            found = self.by_name.get(path.replace("\\", "/").rsplit("/", 1)[-1])
        return found


def is_field_name(name: object) -> bool:
    """Whether ``name`` may name a field of the user's (what check_field_name enforces)."""
    return isinstance(name, str) and bool(_FIELD_NAME.match(name)) and name not in RESERVED_FIELDS


def check_field_name(name: str, where: str) -> str:
    if not _FIELD_NAME.match(name):
        raise MetadataError(f"{where}: field name {name!r} must start with a letter and hold only letters, digits "
                         "and _ (at most 63)")
    if name in RESERVED_FIELDS:
        raise MetadataError(f"{where}: {name!r} is a name the index uses itself; rename the column")
    return name


def read_sidecar(path: str | Path) -> Sidecar:
    """Read ``path`` (.csv, .jsonl or .ndjson). A CSV names its columns in the first row; a
    column is declared ``name:type`` (keyword, number, date, boolean) or its type inferred
    from its values (all numbers: number; all dates: date; all true/false: boolean; else
    keyword). A JSON line is an object; its values' JSON types say number, boolean and
    text, and text columns are inferred as for CSV. The key of a row is its ``path`` (or
    ``file``) value. Errors name the file and the row."""
    from .regular_files import NotRegularFile, open_regular

    source = str(path)
    try:
        with open_regular(Path(path)) as fh:
            raw = fh.read()
    except NotRegularFile as exc:
        raise MetadataError(f"--metadata {source}: {exc}") from None
    except OSError as exc:
        raise MetadataError(f"--metadata {source}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MetadataError(f"--metadata {source}: not UTF-8 text") from None
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        rows, declared = _csv_rows(text, source)
    elif suffix in (".jsonl", ".ndjson", ".json"):
        rows, declared = _jsonl_rows(text, source), {}
    else:
        raise MetadataError(f"--metadata {source}: use a .csv or .jsonl file")
    types = _column_types(rows, declared, source)
    base = Path(path).resolve().parent
    by_path: dict[str, dict[str, FieldValue]] = {}
    by_name: dict[str, dict[str, FieldValue]] = {}
    for label, key, values in rows:
        fields = {name: _typed(values[name], types[name], source, label, name)
                  for name in values if values[name] not in (None, "")}
        if "/" in key or "\\" in key or key.startswith("."):
            from .pathtext import path_to_text

            by_path[path_to_text((base / key).resolve()) if "://" not in key else key] = fields
        else:
            by_name[key] = fields
    return Sidecar(source=source, types=types, by_path=by_path, by_name=by_name)


Row = tuple[str, str, dict[str, Any]]  # where it is ("row 2", "line 1"), its key, its values


def _key(values: dict[str, Any], source: str, label: str) -> str:
    key = values.pop("path", None)
    name = values.pop("file", None)
    key = key if key not in (None, "") else name
    if not isinstance(key, str) or not key.strip():
        raise MetadataError(f"--metadata {source}, {label}: no 'path' or 'file' to say which picture it is about")
    return key.strip()


def _csv_rows(text: str, source: str) -> tuple[list[Row], dict[str, str]]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise MetadataError(f"--metadata {source}: the file is empty") from None
    except csv.Error as exc:
        raise MetadataError(f"--metadata {source}: not CSV ({exc})") from None
    names, declared = [], {}
    for column in header:
        name, _, kind = column.strip().partition(":")
        name = name.strip()
        if name not in ("path", "file"):
            check_field_name(name, f"--metadata {source}")
        if kind:
            if kind.strip() not in FIELD_TYPES:
                raise MetadataError(f"--metadata {source}: column {name!r} declares type {kind!r}; use one of "
                                 f"{', '.join(FIELD_TYPES)}")
            declared[name] = kind.strip()
        names.append(name)
    if "path" not in names and "file" not in names:
        raise MetadataError(f"--metadata {source}: no 'path' or 'file' column")
    rows = []
    try:
        for number, record in enumerate(reader, start=2):
            if not any(cell.strip() for cell in record):
                continue
            if len(record) != len(names):
                raise MetadataError(f"--metadata {source}, row {number}: {len(record)} values for {len(names)} columns")
            values: dict[str, Any] = {n: v.strip() for n, v in zip(names, record)}
            rows.append((f"row {number}", _key(values, source, f"row {number}"), values))
    except csv.Error as exc:
        raise MetadataError(f"--metadata {source}: not CSV ({exc})") from None
    return rows, declared


def _jsonl_rows(text: str, source: str) -> list[Row]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values = json.loads(line)
        except ValueError:
            raise MetadataError(f"--metadata {source}, line {number}: not JSON") from None
        if not isinstance(values, dict):
            raise MetadataError(f"--metadata {source}, line {number}: not a JSON object")
        key = _key(values, source, f"line {number}")
        for name, value in values.items():
            check_field_name(name, f"--metadata {source}, line {number}")
            if not (value is None or isinstance(value, (str, bool, int, float))):
                raise MetadataError(f"--metadata {source}, line {number}: {name!r} is not a string, number or boolean")
        rows.append((f"line {number}", key, values))
    return rows


def _column_types(rows: list[Row], declared: dict[str, str], source: str) -> dict[str, str]:
    seen: dict[str, list[Any]] = {}
    for _, _, values in rows:
        for name, value in values.items():
            if value not in (None, ""):
                seen.setdefault(name, []).append(value)
    types = dict(declared)
    for name, values in seen.items():
        if name not in types:
            types[name] = infer_type(values)
    return types


def infer_type(values: list[Any]) -> str:
    if all(isinstance(v, bool) or (isinstance(v, str) and v.lower() in ("true", "false")) for v in values):
        return "boolean"
    if all(not isinstance(v, bool) and (isinstance(v, (int, float)) or _number(v) is not None) for v in values):
        return "number"
    if all(isinstance(v, str) and parse_time(v) is not None for v in values):
        return "date"
    return "keyword"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _typed(value: Any, kind: str, source: str, label: str, name: str) -> FieldValue:
    problem = f"--metadata {source}, {label}: {name}={value!r} is not a {kind}"
    if kind == "keyword":
        return str(value).lower() if isinstance(value, bool) else str(value)
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise MetadataError(problem)
    if kind == "number":
        got = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _number(value)
        if got is None or not math.isfinite(got):
            raise MetadataError(problem)
        return got
    when = parse_time(value) if isinstance(value, str) else None
    if when is None:
        raise MetadataError(problem)
    return when


def parse_time(text: str, end_of_day: bool = False) -> float | None:
    """Seconds since 1970 of an ISO date (``2019-06-01``) or date and time
    (``2019-06-01T14:30``, ``2019-06-01 14:30:00+02:00``); no zone: UTC. ``end_of_day``: a
    bare date means its last moment (the day after's first, exclusive) rather than its first."""
    text = text.strip()
    if not re.match(r"^\d{4}-\d{2}-\d{2}", text):
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    if end_of_day and len(text) == 10:
        when += dt.timedelta(days=1)
    return when.timestamp()


def fields_from_json(value: Any) -> dict[str, FieldValue]:
    """User fields read back from disk or a server: only names and values of the allowed
    kinds survive (bytes read back are untrusted)."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, FieldValue] = {}
    for name, v in value.items():
        if is_field_name(name):
            if isinstance(v, bool) or (isinstance(v, str) and len(v) <= 10_000):
                out[name] = v
            elif isinstance(v, (int, float)) and math.isfinite(float(v)):
                out[name] = float(v)
    return out
