"""The OpenSearch Dashboards saved objects of d2s-search, as data.

    index-pattern  d2s-index-pattern   the d2s index; `url` formatted as an image (thumbnails)
    search         d2s-images          Discover columns: thumbnail (url), path, terms
    visualization  d2s-terms-tagcloud  tag cloud of the most frequent top terms
    dashboard      d2s-dashboard       the tag cloud above the image list

``mappings/dashboards/d2s-search.ndjson`` is :func:`to_ndjson` of :func:`saved_objects` (a
test keeps them equal), in the saved-objects export format of Dashboards 2.x, so it can
also be imported by hand (Dashboards Management > Saved objects > Import).

Why no time field: Discover hides every document outside its time picker (last 15 minutes
by default); pictures are searched, not monitored. Why ``fields`` is ``[]``: Dashboards then
reads the field list from the cluster on first use, so it always matches the live mapping.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

INDEX_PATTERN_ID = "d2s-index-pattern"
SEARCH_ID = "d2s-images"
TAGCLOUD_ID = "d2s-terms-tagcloud"
DASHBOARD_ID = "d2s-dashboard"
THUMBNAIL_PX = 160
TAGCLOUD_TERMS = 50
SEARCH_COLUMNS = ["url", "path", "terms"]
# Migration versions of Dashboards 2.x (the newest migration of each type), so nothing is
# rewritten on import.
MIGRATION = {"index-pattern": "7.6.0", "search": "7.9.3", "visualization": "7.10.0", "dashboard": "7.9.3"}
INDEX_REF = "kibanaSavedObjectMeta.searchSourceJSON.index"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _search_source(with_index: bool) -> dict[str, str]:
    source: dict[str, Any] = {"query": {"query": "", "language": "kuery"}, "filter": []}
    if with_index:
        source["indexRefName"] = INDEX_REF
    return {"searchSourceJSON": _json(source)}


def _object(kind: str, obj_id: str, attributes: dict[str, Any], references: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "attributes": attributes,
        "id": obj_id,
        "migrationVersion": {kind: MIGRATION[kind]},
        "references": references,
        "type": kind,
    }


def _index_ref() -> list[dict[str, str]]:
    return [{"id": INDEX_PATTERN_ID, "name": INDEX_REF, "type": "index-pattern"}]


def index_pattern(index_name: str = "d2s") -> dict[str, Any]:
    # The url field format with type "img" renders <img src=value> in Discover and in saved
    # search panels; width/height cap the thumbnail size.
    formats = {
        "url": {
            "id": "url",
            "params": {"type": "img", "urlTemplate": None, "labelTemplate": None,
                       "width": THUMBNAIL_PX, "height": THUMBNAIL_PX},
        }
    }
    # The vectors are not for reading: hide them from Discover's document view.
    source_filters = [{"value": "dense"}, {"value": "sparse"}]
    return _object("index-pattern", INDEX_PATTERN_ID, {
        "title": index_name,
        "fields": "[]",
        "fieldFormatMap": _json(formats),
        "sourceFilters": _json(source_filters),
    }, [])


def saved_search() -> dict[str, Any]:
    return _object("search", SEARCH_ID, {
        "title": "d2s images",
        "description": "Pictures with their thumbnail, path and top terms. Query the `terms` field, "
                       "e.g. terms:dog and terms:beach.",
        "hits": 0,
        "columns": list(SEARCH_COLUMNS),
        "sort": [],  # relevance (_score) order when a query is typed
        "version": 1,
        "kibanaSavedObjectMeta": _search_source(with_index=True),
    }, _index_ref())


def tag_cloud() -> dict[str, Any]:
    title = "d2s: most frequent terms"
    vis = {
        "title": title,
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
    return _object("visualization", TAGCLOUD_ID, {
        "title": title,
        "description": "The words that describe most pictures. Click one to filter the dashboard.",
        "visState": _json(vis),
        "uiStateJSON": "{}",
        "version": 1,
        "kibanaSavedObjectMeta": _search_source(with_index=True),
    }, _index_ref())


def dashboard() -> dict[str, Any]:
    # Dashboards' grid is 48 columns wide; the panels reference objects by panelRefName.
    panels = [
        {"version": "7.9.3", "gridData": {"x": 0, "y": 0, "w": 48, "h": 12, "i": "1"},
         "panelIndex": "1", "embeddableConfig": {}, "panelRefName": "panel_0"},
        {"version": "7.9.3", "gridData": {"x": 0, "y": 12, "w": 48, "h": 36, "i": "2"},
         "panelIndex": "2", "embeddableConfig": {}, "panelRefName": "panel_1"},
    ]
    return _object("dashboard", DASHBOARD_ID, {
        "title": "d2s-search pictures",
        "description": "Top terms of the indexed pictures and the pictures themselves.",
        "hits": 0,
        "panelsJSON": _json(panels),
        "optionsJSON": _json({"hidePanelTitles": False, "useMargins": True}),
        "version": 1,
        "timeRestore": False,
        "kibanaSavedObjectMeta": _search_source(with_index=False),
    }, [
        {"id": TAGCLOUD_ID, "name": "panel_0", "type": "visualization"},
        {"id": SEARCH_ID, "name": "panel_1", "type": "search"},
    ])


def saved_objects(index_name: str = "d2s") -> list[dict[str, Any]]:
    """All objects, referenced ones first (the order of an export)."""
    return [index_pattern(index_name), saved_search(), tag_cloud(), dashboard()]


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


def retarget(objects: list[dict[str, Any]], index_name: str) -> list[dict[str, Any]]:
    """The objects with our index pattern pointed at ``index_name`` (its id stays the same)."""
    out = []
    for obj in objects:
        if obj.get("type") == "index-pattern" and obj.get("id") == INDEX_PATTERN_ID:
            obj = {**obj, "attributes": {**obj["attributes"], "title": index_name}}
        out.append(obj)
    return out
