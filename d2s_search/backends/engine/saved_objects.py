"""Saved-object pieces Kibana and OpenSearch Dashboards read the same way (both keep Kibana 7's
saved-objects format): JSON-in-a-string attributes, the search source, the tag cloud's state,
ndjson export files. Each engine's module adds its own ids and migration stamps."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from d2s_search.regular_files import read_regular

THUMBNAIL_PX = 160
TAGCLOUD_TERMS = 50
SEARCH_COLUMNS = ["url", "path", "terms"]
INDEX_REF = "kibanaSavedObjectMeta.searchSourceJSON.index"
TAGCLOUD_TITLE = "d2s: most frequent terms"
MAX_NDJSON_BYTES = 64 * 2**20  # an export of saved objects is kilobytes; refuse anything huge


def json_text(value: Any) -> str:
    """A JSON value stored as a string attribute (``visState``, ``panelsJSON`` …)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def search_source(with_index: bool) -> dict[str, str]:
    source: dict[str, Any] = {"query": {"query": "", "language": "kuery"}, "filter": []}
    if with_index:
        source["indexRefName"] = INDEX_REF
    return {"searchSourceJSON": json_text(source)}


def index_ref(pattern_id: str) -> list[dict[str, str]]:
    return [{"id": pattern_id, "name": INDEX_REF, "type": "index-pattern"}]


def tagcloud_vis() -> dict[str, Any]:
    """``visState`` of the tag cloud of the most frequent top terms."""
    return {
        "title": TAGCLOUD_TITLE,
        "type": "tagcloud",
        "params": {"scale": "linear", "orientation": "single", "minFontSize": 14, "maxFontSize": 60,
                   "showLabel": False},
        "aggs": [
            {"id": "1", "enabled": True, "type": "count", "schema": "metric", "params": {}},
            {"id": "2", "enabled": True, "type": "terms", "schema": "segment",
             "params": {"field": "terms", "size": TAGCLOUD_TERMS, "order": "desc", "orderBy": "1",
                        "otherBucket": False, "otherBucketLabel": "Other",
                        "missingBucket": False, "missingBucketLabel": "Missing"}},
        ],
    }


def retarget(objects: list[dict[str, Any]], index_name: str, pattern_id: str) -> list[dict[str, Any]]:
    """The objects with our index pattern ``pattern_id`` pointed at ``index_name`` (its id stays)."""
    out = []
    for obj in objects:
        if obj.get("type") == "index-pattern" and obj.get("id") == pattern_id:
            obj = {**obj, "attributes": {**obj["attributes"], "title": index_name}}
        out.append(obj)
    return out


def to_ndjson(objects: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(o, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n" for o in objects)


def parse_ndjson(text: str) -> list[dict[str, Any]]:
    """Objects of an ndjson export; the export summary line (``exportedCount``) is skipped."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"line {number}: not a JSON object")
        if "exportedCount" in obj:
            continue
        for key in ("type", "id", "attributes"):
            if key not in obj:
                raise ValueError(f"line {number}: a saved object needs {key!r}")
        out.append(obj)
    return out


def read_ndjson_files(paths: Sequence[str | Path], error: Callable[[str], Exception]) -> list[dict[str, Any]]:
    """The saved objects of ndjson files or folders (their ``*.ndjson``), in order. Only regular
    files are opened; ``error`` builds the engine's one-line error."""
    objects: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw)
        files = sorted(path.glob("*.ndjson")) if path.is_dir() else [path]
        if not files:
            raise error(f"no .ndjson files in {path}")
        for file in files:
            try:
                text = read_regular(file, MAX_NDJSON_BYTES).decode("utf-8")
                objects.extend(parse_ndjson(text))
            except OSError as exc:
                raise error(f"cannot read {os.fsdecode(file)}: {exc.strerror or exc}") from None
            except ValueError as exc:  # not UTF-8, not JSON, not a saved object
                raise error(f"{os.fsdecode(file)}: {exc}") from None
    return objects


def describe_errors(errors: Sequence[Mapping[str, Any]], limit: int = 3) -> str:
    """``type/id: reason`` for the first few import errors, on one line."""
    parts = []
    for e in errors[:limit]:
        err = e.get("error") or {}
        kind = err.get("type", "error")
        if kind == "missing_references":
            refs = ", ".join(f"{r.get('type')}/{r.get('id')}" for r in err.get("references") or [])
            reason = f"missing references {refs}"
        else:
            reason = err.get("message") or kind
        parts.append(f"{e.get('type')}/{e.get('id')}: {reason}")
    more = f" (+{len(errors) - limit} more)" if len(errors) > limit else ""
    return "; ".join(parts) + more
