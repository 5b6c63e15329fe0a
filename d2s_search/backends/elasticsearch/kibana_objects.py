"""The Kibana saved objects of d2s-search, as data (Kibana 8.x / 9.x export format).

    index-pattern  d2s-data-view       data view over the d2s index; `url` formatted as an image
    search         d2s-kibana-images   Discover session: thumbnail (url), path, terms
    visualization  d2s-kibana-terms    tag cloud of the most frequent top terms
    dashboard      d2s-kibana-dashboard  the tag cloud above the image list

``mappings/kibana/d2s-search.ndjson`` is :func:`to_ndjson` of :func:`saved_objects` (a test
keeps them equal), so it can also be imported by hand (Stack Management > Saved objects >
Import). The objects carry ``coreMigrationVersion``/``typeMigrationVersion`` 8.0.0: Kibana runs
every later migration of each type on import, so one file serves 8.x and 9.x.

Why no time field: Discover hides every document outside its time picker; pictures are searched,
not monitored. Why ``fields`` is ``"[]"``: Kibana reads the field list from the cluster, so it
always matches the live mapping. The ndjson helpers are the OpenSearch Dashboards ones (same
format), imported rather than copied.
"""

from __future__ import annotations

import json
from typing import Any

from d2s_search.backends.opensearch.dashboards_objects import parse_ndjson, to_ndjson

__all__ = ["saved_objects", "to_ndjson", "parse_ndjson", "retarget", "DATA_VIEW_ID"]

DATA_VIEW_ID = "d2s-data-view"
SEARCH_ID = "d2s-kibana-images"
TAGCLOUD_ID = "d2s-kibana-terms"
DASHBOARD_ID = "d2s-kibana-dashboard"
THUMBNAIL_PX = 160
TAGCLOUD_TERMS = 50
SEARCH_COLUMNS = ["url", "path", "terms"]
MIGRATED_FROM = "8.0.0"
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
        "coreMigrationVersion": MIGRATED_FROM,
        "id": obj_id,
        "references": references,
        "type": kind,
        "typeMigrationVersion": MIGRATED_FROM,
    }


def _index_ref() -> list[dict[str, str]]:
    return [{"id": DATA_VIEW_ID, "name": INDEX_REF, "type": "index-pattern"}]


def data_view(index_name: str = "d2s") -> dict[str, Any]:
    # The url field format with type "img" renders <img src=value> in Discover and in saved
    # search panels; width/height cap the thumbnail size.
    formats = {"url": {"id": "url", "params": {"type": "img", "urlTemplate": None, "labelTemplate": None,
                                                "width": THUMBNAIL_PX, "height": THUMBNAIL_PX}}}
    return _object("index-pattern", DATA_VIEW_ID, {
        "title": index_name,
        "name": "d2s pictures",
        "fields": "[]",
        "fieldFormatMap": _json(formats),
        # The vectors are not for reading: hide them from Discover's document view.
        "sourceFilters": _json([{"value": "dense"}, {"value": "sparse"}]),
        "allowNoIndex": True,
    }, [])


def saved_search() -> dict[str, Any]:
    return _object("search", SEARCH_ID, {
        "title": "d2s images",
        "description": "Pictures with their thumbnail, path and top terms. Query the `terms` field, "
                       "e.g. terms:dog and terms:beach.",
        "columns": list(SEARCH_COLUMNS),
        "sort": [],  # relevance (_score) order when a query is typed
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
        "kibanaSavedObjectMeta": _search_source(with_index=True),
    }, _index_ref())


def dashboard() -> dict[str, Any]:
    # Kibana's grid is 48 columns wide; a panel names its object by panelRefName, which Kibana
    # resolves as the reference whose name equals it (dashboard saved_object_references.ts).
    panels = [
        {"type": "visualization", "gridData": {"x": 0, "y": 0, "w": 48, "h": 12, "i": "1"},
         "panelIndex": "1", "embeddableConfig": {}, "panelRefName": "panel_0"},
        {"type": "search", "gridData": {"x": 0, "y": 12, "w": 48, "h": 36, "i": "2"},
         "panelIndex": "2", "embeddableConfig": {}, "panelRefName": "panel_1"},
    ]
    return _object("dashboard", DASHBOARD_ID, {
        "title": "d2s-search pictures",
        "description": "Top terms of the indexed pictures and the pictures themselves.",
        "panelsJSON": _json(panels),
        "optionsJSON": _json({"hidePanelTitles": False, "useMargins": True}),
        "timeRestore": False,
        "kibanaSavedObjectMeta": _search_source(with_index=False),
    }, [
        {"id": TAGCLOUD_ID, "name": "panel_0", "type": "visualization"},
        {"id": SEARCH_ID, "name": "panel_1", "type": "search"},
    ])


def saved_objects(index_name: str = "d2s") -> list[dict[str, Any]]:
    """All objects, referenced ones first (the order of an export)."""
    return [data_view(index_name), saved_search(), tag_cloud(), dashboard()]


def retarget(objects: list[dict[str, Any]], index_name: str) -> list[dict[str, Any]]:
    """The objects with our data view pointed at ``index_name`` (its id stays the same)."""
    return [
        {**o, "attributes": {**o["attributes"], "title": index_name}}
        if o.get("type") == "index-pattern" and o.get("id") == DATA_VIEW_ID else o
        for o in objects
    ]
