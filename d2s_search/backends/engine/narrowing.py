"""Metadata on OpenSearch and Elasticsearch: the stored fields, the filter clauses a
:class:`~d2s_search.filters.SearchFilter` becomes, and the library order and facet bodies
(pure, no I/O; both engines take them in the same form).

Stored beside the vectors of every document (``dynamic: strict``, so a field must be mapped
before a document carries it):

* ``taken_at`` (``date``, epoch milliseconds), ``camera`` (``keyword``), ``location``
  (``geo_point``, ``{lat, lon}``);
* ``folder`` (``keyword``, one value per folder holding one of the document's paths): the
  folder facet. The ``--folder`` filter is a ``prefix`` on ``path``, which holds every path;
* ``content_id`` (``keyword``): the document's id again, the library order's tiebreak
  (Elasticsearch 8+ refuses to sort on ``_id``; OpenSearch sorts on it through fielddata on
  the heap, deprecated), and on Amazon OpenSearch Serverless the id itself;
* ``fields``: an object whose properties are the user's fields, ``keyword``, ``double``,
  ``date`` (epoch milliseconds) or ``boolean``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from d2s_search.errors import MetadataError
from d2s_search.filters import BUILT_IN_FIELDS, Condition, SearchFilter, folder_prefix
from d2s_search.metadata import (
    FIELD_TYPES,
    FieldValue,
    Metadata,
    check_field_name,
    fields_from_json,
    is_field_name,
)

CONTENT_ID = "content_id"
USER_FIELDS = "fields"
# The mapping of a user field of each type (metadata.FIELD_TYPES).
USER_PROPERTY: dict[str, dict[str, Any]] = {
    "keyword": {"type": "keyword"},
    "number": {"type": "double"},
    "date": {"type": "date", "format": "epoch_millis"},
    "boolean": {"type": "boolean"},
}
# What a mapped user field's engine type reads back as (an index edited by hand may use others).
_ENGINE_TYPES = {
    "keyword": "keyword", "constant_keyword": "keyword", "double": "number", "float": "number",
    "half_float": "number", "scaled_float": "number", "long": "number", "integer": "number", "short": "number",
    "byte": "number", "unsigned_long": "number", "date": "date", "date_nanos": "date", "boolean": "boolean",
}
# Built-in fields a filter names -> (stored field, how its values are stored).
_STORED = {"taken": ("taken_at", "date"), "camera": ("camera", "keyword"), "width": ("width", "integer"),
           "height": ("height", "integer"), "size_bytes": ("size_bytes", "integer")}
METADATA_KEYS = ("taken_at", "camera", "location", "folder", CONTENT_ID, USER_FIELDS)


def metadata_properties() -> dict[str, Any]:
    """The mapping of the built-in metadata fields (the user's come with ``declare_fields``)."""
    return {
        "taken_at": {"type": "date", "format": "epoch_millis"},
        "camera": {"type": "keyword"},
        "location": {"type": "geo_point"},
        "folder": {"type": "keyword"},
        CONTENT_ID: {"type": "keyword"},
        USER_FIELDS: {"type": "object", "properties": {}},
    }


def missing_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The built-in metadata properties an index's mapping lacks (an index made before them)."""
    return {name: spec for name, spec in metadata_properties().items() if name not in properties}


def user_field_types(properties: Mapping[str, Any]) -> dict[str, str]:
    """The user's fields (name -> keyword/number/date/boolean) from a mapping's properties;
    properties of other types are left out (a filter could not compare them)."""
    user = properties.get(USER_FIELDS) if isinstance(properties, Mapping) else None
    props = user.get("properties") if isinstance(user, Mapping) else None
    out: dict[str, str] = {}
    for name, spec in (props or {}).items():
        kind = _ENGINE_TYPES.get(spec.get("type", "")) if isinstance(spec, Mapping) else None
        if kind and is_field_name(name):  # the mapping is read back: a name we would not write is left out
            out[name] = kind
    return out


def declared_properties(types: Mapping[str, str], known: Mapping[str, str]) -> dict[str, Any]:
    """The ``PUT _mapping`` body adding the new fields of ``types`` (None when there are none);
    MetadataError naming the first that exists with another type."""
    new: dict[str, Any] = {}
    for name, kind in types.items():
        check_field_name(name, "declare_fields")
        if kind not in FIELD_TYPES:
            raise MetadataError(f"field {name!r}: unknown type {kind!r} (use {', '.join(FIELD_TYPES)})")
        have = known.get(name)
        if have is not None and have != kind:
            raise MetadataError(f"field {name!r} is already a {have} field in this index; it cannot become {kind}")
        if have is None:
            new[name] = dict(USER_PROPERTY[kind])
    return {"properties": {USER_FIELDS: {"properties": new}}} if new else {}


# -- _source ----------------------------------------------------------------------------------


def folder_of(path: str) -> str:
    """The folder holding ``path`` (as the local index counts it: "" for a bare name)."""
    return path.rsplit("/", 1)[0] if "/" in path else ""


def folders(paths: Sequence[str]) -> str | list[str]:
    """The ``folder`` field: each folder once, one as a string."""
    out = list(dict.fromkeys(folder_of(p) for p in paths))
    return out[0] if len(out) == 1 else out


def millis(seconds: float) -> int:
    return int(round(float(seconds) * 1000))


def _stored_value(value: FieldValue, kind: str | None) -> Any:
    if kind == "date" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return millis(value)
    return value


def check_fields(metadata: Metadata, types: Mapping[str, str]) -> None:
    """ValueError naming a user field the index does not know or a value of the wrong type."""
    for name, value in metadata.fields.items():
        kind = types.get(name)
        if kind is None:
            raise ValueError(f"field {name!r} is not declared in the index (declare_fields first)")
        fits = (isinstance(value, bool) if kind == "boolean" else isinstance(value, str) if kind == "keyword"
                else isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
        if not fits:
            raise ValueError(f"field {name!r} is a {kind} field; {value!r} is not")


def metadata_source(doc_id: str, paths: Sequence[str], metadata: Metadata, types: Mapping[str, str],
                    *, update: bool = False) -> dict[str, Any]:
    """The metadata fields of a document's ``_source``. ``update``: for a partial update, which
    merges objects and keeps fields it does not name, so every absent part is sent as null
    (every declared user field too: the user's fields are replaced, not merged)."""
    check_fields(metadata, types)
    src: dict[str, Any] = {CONTENT_ID: doc_id}
    if paths:
        src["folder"] = folders(paths)
    m = metadata
    if m.taken_at is not None and math.isfinite(m.taken_at):
        src["taken_at"] = millis(m.taken_at)
    elif update:
        src["taken_at"] = None
    if m.camera:
        src["camera"] = m.camera
    elif update:
        src["camera"] = None
    if m.location is not None:
        src["location"] = {"lat": float(m.location[0]), "lon": float(m.location[1])}
    elif update:
        src["location"] = None
    user = {name: _stored_value(v, types.get(name)) for name, v in m.fields.items()}
    if update:
        user = {**{name: None for name in types}, **user}
    if user:
        src[USER_FIELDS] = user
    return src


def document_metadata(src: Mapping[str, Any], types: Mapping[str, str]) -> Metadata:
    """The metadata of a stored ``_source`` (untrusted: malformed values are left out)."""
    taken = _finite(src.get("taken_at"))
    camera = src.get("camera")
    location = None
    loc = src.get("location")
    if isinstance(loc, Mapping):
        lat, lon = _finite(loc.get("lat")), _finite(loc.get("lon"))
        if lat is not None and lon is not None and -90 <= lat <= 90 and -180 <= lon <= 180:
            location = (lat, lon)
    fields: dict[str, FieldValue] = {}
    for name, value in fields_from_json(src.get(USER_FIELDS)).items():
        kind = types.get(name)
        if kind == "date" and isinstance(value, float):
            fields[name] = value / 1000.0
        elif kind is None or _KINDS[kind](value):  # a value of another type than the field's: left out
            fields[name] = value
    return Metadata(
        taken_at=taken / 1000.0 if taken is not None else None,
        camera=camera[:200] if isinstance(camera, str) and camera else None,
        location=location,
        fields=fields,
    )


_KINDS = {"keyword": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
          "number": lambda v: isinstance(v, float), "date": lambda v: isinstance(v, float)}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        out = float(value)
    except ValueError:
        return None
    return out if math.isfinite(out) else None


# -- filter clauses ---------------------------------------------------------------------------


def filter_clauses(f: SearchFilter, types: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(filter, must_not) clauses equal to ``f.allows`` (``types``: the user's fields).

    ``!=`` is a ``must_not``: a document without the field passes it, as ``allows`` says.
    """
    out: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    if f.after is not None or f.before is not None:
        bounds: dict[str, Any] = {}  # numbers: epoch millis, the fields' format
        if f.after is not None:
            bounds["gte"] = millis(f.after)
        if f.before is not None:
            bounds["lt"] = millis(f.before)
        out.append({"range": {"taken_at": bounds}})
    if f.folders:
        prefixes = [{"prefix": {"path": {"value": folder_prefix(folder)}}} for folder in dict.fromkeys(f.folders)]
        out.append(_any(prefixes))
    for group in f.alternatives():
        if group[0].op == "!=":
            clause = _condition(group[0], types)
            if clause is not None and "match_none" not in clause:
                excluded.append(clause)
            continue
        clauses = [c for c in (_condition(c, types) for c in group) if c is not None]
        out.append(_any(clauses) if clauses else {"match_none": {}})
    if f.near is not None:
        lat, lon, km = f.near
        # ignore_unmapped: an index made before the metadata fields has no location: no match
        out.append({"geo_distance": {"distance": f"{km:g}km", "location": {"lat": lat, "lon": lon},
                                     "ignore_unmapped": True}})
    return out, excluded


def _any(clauses: list[dict[str, Any]]) -> dict[str, Any]:
    return clauses[0] if len(clauses) == 1 else {"bool": {"should": clauses, "minimum_should_match": 1}}


def _condition(c: Condition, types: Mapping[str, str]) -> dict[str, Any] | None:
    """One condition as a query: for ``!=``, the query of what it excludes (None: nothing)."""
    field, kind = _STORED.get(c.field) or (f"{USER_FIELDS}.{c.field}", types.get(c.field) or BUILT_IN_FIELDS.get(c.field))
    value = c.value
    if kind == "date" and isinstance(value, (int, float)) and not isinstance(value, bool):
        ms = millis(value)
        if c.op in ("=", "!="):
            return {"range": {field: {"gte": ms, "lte": ms}}}
        return {"range": {field: {_RANGE[c.op]: ms}}}
    if kind == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _integer(field, c.op, float(value))
    if c.op in ("=", "!="):
        return {"term": {field: {"value": value}}}
    if isinstance(value, (bool, str)):
        return {"match_none": {}}  # a text or boolean is never above or below anything (allows)
    return {"range": {field: {_RANGE[c.op]: float(value)}}}


_RANGE = {">=": "gte", ">": "gt", "<=": "lte", "<": "lt"}


def _integer(field: str, op: str, value: float) -> dict[str, Any] | None:
    """A condition on an integer field as whole-number bounds (the engines parse a decimal
    bound of an integer field in their own ways)."""
    if op in ("=", "!="):
        return {"term": {field: {"value": int(value)}}} if value.is_integer() else (
            {"match_none": {}} if op == "=" else None)
    low = {">=": math.ceil(value), ">": math.floor(value) + 1}.get(op)
    high = {"<=": math.floor(value), "<": math.ceil(value) - 1}.get(op)
    return {"range": {field: {"gte": low} if low is not None else {"lte": high}}}


def leaves(clauses: Iterable[Mapping[str, Any]]) -> int:
    """Leaf queries in ``clauses`` (what Lucene counts against ``max_clause_count``)."""
    total = 0
    for clause in clauses:
        inner = clause.get("bool") if isinstance(clause, Mapping) else None
        if isinstance(inner, Mapping):
            total += sum(leaves(inner.get(k) or []) for k in ("must", "filter", "should", "must_not"))
        else:
            total += 1
    return total


# -- the library and facets -------------------------------------------------------------------


def browse_body(k: int, offset: int, query: dict[str, Any] | None, source: Sequence[str]) -> dict[str, Any]:
    """The library order: taken most recently first, undated last, then by id (the local
    index's order); ``unmapped_type`` lets an index without the fields answer too."""
    return {
        "query": query or {"match_all": {}},
        "size": int(k),
        "from": int(offset),
        "sort": [
            {"taken_at": {"order": "desc", "missing": "_last", "unmapped_type": "date"}},
            {CONTENT_ID: {"order": "asc", "missing": "_last", "unmapped_type": "keyword"}},
        ],
        "_source": list(source),
        "track_total_hits": False,
    }


def facet_fields(types: Mapping[str, str]) -> dict[str, str]:
    """Facet name -> stored field: folder, camera, each keyword or boolean user field."""
    out = {"folder": "folder", "camera": "camera"}
    for name in sorted(types):
        if types[name] in ("keyword", "boolean") and name not in out:
            out[name] = f"{USER_FIELDS}.{name}"
    return out


def facets_body(query: dict[str, Any] | None, types: Mapping[str, str], size: int) -> dict[str, Any]:
    """Counts of the documents matching ``query`` by each facet: most first, ties by value."""
    aggs = {name: {"terms": {"field": field, "size": int(size), "order": [{"_count": "desc"}, {"_key": "asc"}]}}
            for name, field in facet_fields(types).items()}
    return {"query": query or {"match_all": {}}, "size": 0, "aggregations": aggs, "track_total_hits": False}


def facets_from_answer(answer: Mapping[str, Any], types: Mapping[str, str], size: int) -> dict[str, list[tuple[str, int]]]:
    """[(value, count)] of each facet from a search answer (untrusted: odd buckets left out)."""
    aggs = answer.get("aggregations") if isinstance(answer, Mapping) else None
    out: dict[str, list[tuple[str, int]]] = {}
    for name in facet_fields(types):
        buckets = ((aggs or {}).get(name) or {}).get("buckets") if isinstance(aggs, Mapping) else None
        counted: list[tuple[str, int]] = []
        for b in buckets if isinstance(buckets, list) else []:
            if not isinstance(b, Mapping):
                continue
            key = b.get("key_as_string", b.get("key"))  # a boolean's key is 1/0, key_as_string true/false
            count = b.get("doc_count")
            if isinstance(key, (str, int, float)) and not isinstance(count, bool) and isinstance(count, int) and count > 0:
                counted.append((str(key), count))
        counted.sort(key=lambda vc: (-vc[1], vc[0]))
        out[name] = counted[:size]
    return out

