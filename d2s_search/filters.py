"""What a search is narrowed to: a date range, folders, field conditions, a place.

``query --after 2019-06-01 --before 2019-07-01 --folder trips --where camera=Pixel
--where rating>=4 --near 48.85,2.35,10`` is one :class:`SearchFilter`. Every backend applies
it before the top k are taken (so k hits come back when k pass), and :meth:`SearchFilter.allows`
is the reference every backend is tested against. The rules:

* ``after`` keeps pictures taken at or after it, ``before`` those taken before it (a day given
  alone starts at its midnight, UTC: ``--after 2019-06-01 --before 2019-07-01`` is June);
  a picture without a date passes neither.
* ``folders``: any of the document's paths lies under one of them.
* ``where``: every condition holds, except that several ``field=value`` of one field are
  alternatives (``--where camera=A --where camera=B``: either). ``=`` and ``!=`` work on every
  field, ``<``, ``<=``, ``>``, ``>=`` on numbers and dates; a document without the field fails
  every condition on it but ``!=``.
* ``near``: within the distance (km, great circle on the mean Earth radius, as OpenSearch's
  and Elasticsearch's ``geo_distance``) of a point; a picture without GPS does not pass.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import QueryError
from .metadata import FieldValue, Metadata, parse_time

EARTH_RADIUS_M = 6371008.7714  # Lucene's GeoUtils.EARTH_MEAN_RADIUS, what geo_distance uses
# Fields every index has beside the user's own, with their types.
BUILT_IN_FIELDS = {"camera": "keyword", "width": "number", "height": "number", "size_bytes": "number",
                   "taken": "date"}
OPERATORS = ("!=", ">=", "<=", "=", ">", "<")
_WHERE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)\s*(!=|>=|<=|=|>|<)(.*)$", re.DOTALL)


@dataclass(frozen=True)
class Condition:
    field: str
    op: str  # one of OPERATORS
    value: FieldValue  # typed by the field (a date as seconds since 1970, UTC)

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "op": self.op, "value": self.value}


@dataclass(frozen=True)
class SearchFilter:
    after: float | None = None
    before: float | None = None
    folders: tuple[str, ...] = ()  # as the index stores paths: absolute, or a URI
    where: tuple[Condition, ...] = ()
    near: tuple[float, float, float] | None = None  # latitude, longitude, kilometres

    def __bool__(self) -> bool:
        return self.after is not None or self.before is not None or bool(self.folders) or bool(self.where) \
            or self.near is not None

    def to_json(self) -> dict[str, Any]:
        from .metadata import iso_time

        out: dict[str, Any] = {}
        if self.after is not None:
            out["after"] = iso_time(self.after)
        if self.before is not None:
            out["before"] = iso_time(self.before)
        if self.folders:
            out["folders"] = list(self.folders)
        if self.where:
            out["where"] = [c.to_json() for c in self.where]
        if self.near is not None:
            out["near"] = {"lat": self.near[0], "lon": self.near[1], "km": self.near[2]}
        return out

    def describe(self) -> str:
        """One line for people: ``taken 2019-06-01 to 2019-07-01, in /photos/trips, camera = Pixel 7``."""
        from .metadata import iso_time

        parts = []
        if self.after is not None or self.before is not None:
            low = iso_time(self.after).removesuffix("T00:00:00Z") if self.after is not None else "..."
            high = iso_time(self.before).removesuffix("T00:00:00Z") if self.before is not None else "..."
            parts.append(f"taken from {low}, before {high}" if self.after is not None and self.before is not None
                         else f"taken from {low}" if self.after is not None else f"taken before {high}")
        if self.folders:
            parts.append("in " + " or ".join(self.folders))
        for c in self.where:
            value = iso_time(float(c.value)).removesuffix("T00:00:00Z") if c.field == "taken" else c.value
            parts.append(f"{c.field} {c.op} {str(value).lower() if isinstance(value, bool) else value}")
        if self.near is not None:
            parts.append(f"within {self.near[2]:g} km of {self.near[0]:g},{self.near[1]:g}")
        return ", ".join(parts)

    def alternatives(self) -> list[list[Condition]]:
        """The conditions as a conjunction of groups, each group any-of: the ``=`` conditions
        of one field share a group, every other condition is a group of its own."""
        groups: dict[str, list[Condition]] = {}
        out: list[list[Condition]] = []
        for c in self.where:
            if c.op == "=":
                if c.field not in groups:
                    groups[c.field] = []
                    out.append(groups[c.field])
                groups[c.field].append(c)
            else:
                out.append([c])
        return out

    # -- the reference ------------------------------------------------------------------------

    def allows(self, paths: Sequence[str], metadata: Metadata, width: int = 0, height: int = 0,
               size_bytes: int = 0) -> bool:
        """Whether a document with these paths and metadata passes: the definition every
        backend's filtering is tested against."""
        taken = metadata.taken_at
        if self.after is not None and (taken is None or taken < self.after):
            return False
        if self.before is not None and (taken is None or taken >= self.before):
            return False
        if self.folders and not any(under(p, f) for p in paths for f in self.folders):
            return False
        if self.near is not None:
            if metadata.location is None:
                return False
            if distance_m(self.near[0], self.near[1], *metadata.location) > self.near[2] * 1000:
                return False
        values: dict[str, Any] = {"camera": metadata.camera, "width": float(width), "height": float(height),
                                  "size_bytes": float(size_bytes), "taken": taken, **dict(metadata.fields)}
        return all(any(holds(values.get(c.field), c) for c in group) for group in self.alternatives())


def holds(value: Any, condition: Condition) -> bool:
    if condition.op == "!=":
        return value is None or value != condition.value
    if value is None:
        return False
    if condition.op == "=":
        return value == condition.value
    if isinstance(value, (bool, str)):
        return False
    target = float(condition.value)
    return {">=": value >= target, "<=": value <= target, ">": value > target, "<": value < target}[condition.op]


def under(path: str, folder: str) -> bool:
    """Whether ``path`` lies in ``folder`` or below it (whole names: /a/b is not under /a/bc)."""
    return path.startswith(folder_prefix(folder))


def folder_prefix(folder: str) -> str:
    return folder if folder.endswith("/") else folder + "/"


def distance_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in metres (haversine on the mean Earth radius)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(h)))


# --- from what a user types ---------------------------------------------------------------


def parse_date(text: str, option: str) -> float:
    when = parse_time(text)
    if when is None:
        raise QueryError(f"{option} {text!r}: give a date as YYYY-MM-DD (or YYYY-MM-DDTHH:MM, with a zone if wanted)")
    return when


def parse_near(text: str) -> tuple[float, float, float]:
    parts = [p.strip() for p in text.split(",")]
    try:
        lat, lon, km = (float(p) for p in parts)
    except ValueError:
        raise QueryError(f"--near {text!r}: give LAT,LON,KM, e.g. 48.8566,2.3522,10") from None
    if not (-90 <= lat <= 90 and -180 <= lon <= 180) or not (km > 0 and math.isfinite(km)):
        raise QueryError(f"--near {text!r}: latitude -90..90, longitude -180..180, a positive distance in km")
    return lat, lon, km


def parse_where(text: str) -> tuple[str, str, str]:
    """``field=value``, ``field!=value``, ``field>=x`` ... -> (field, op, value as typed)."""
    m = _WHERE.match(text)
    if not m or not m.group(3).strip():
        raise QueryError(f"--where {text!r}: give FIELD=VALUE, FIELD!=VALUE or FIELD>=, >, <=, < a number or date")
    return m.group(1), m.group(2), m.group(3).strip()


def typed_condition(field: str, op: str, text: str, types: Mapping[str, str]) -> Condition:
    """A condition with its value read as the field's type; errors name the fields there are."""
    kind = types.get(field)
    if kind is None:
        known = ", ".join(sorted(types)) or "none"
        raise QueryError(f"--where {field}{op}{text}: the index has no field {field!r} (fields: {known})")
    if op in (">=", "<=", ">", "<") and kind not in ("number", "date"):
        raise QueryError(f"--where {field}{op}{text}: {field} is {kind}; compare it with = or !=")
    value: FieldValue
    if kind == "number":
        try:
            value = float(text)
        except ValueError:
            raise QueryError(f"--where {field}{op}{text}: {field} is a number") from None
        if not math.isfinite(value):
            raise QueryError(f"--where {field}{op}{text}: {field} is a number")
    elif kind == "date":
        value = parse_date(text, f"--where {field}{op}")
    elif kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise QueryError(f"--where {field}{op}{text}: {field} is true or false")
        value = text.lower() == "true"
    else:
        value = text
    return Condition(field, op, value)


def build_filter(*, after: str | None = None, before: str | None = None, folders: Sequence[str] = (),
                 where: Sequence[str] = (), near: str | None = None,
                 types: Mapping[str, str] | None = None) -> SearchFilter:
    """A filter from what a user typed; ``types``: the index's fields (``where`` needs them)."""
    from .ingest import index_path
    from .pathtext import stored_path
    from .sources import is_uri

    conditions = []
    for text in where:
        field, op, value = parse_where(text)
        conditions.append(typed_condition(field, op, value, types or BUILT_IN_FIELDS))
    low = parse_date(after, "--after") if after else None
    high = parse_date(before, "--before") if before else None
    if low is not None and high is not None and low >= high:
        raise QueryError(f"--after {after} is not before --before {before}: nothing could pass")
    folder_paths = tuple(f if is_uri(f) else index_path(stored_path(f.rstrip("/") or "/")) for f in folders)
    return SearchFilter(after=low, before=high, folders=folder_paths, where=tuple(conditions),
                        near=parse_near(near) if near else None)
