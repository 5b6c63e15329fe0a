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
always matches the live mapping. The pieces both consoles read alike (ndjson helpers, tag cloud,
search source) live in :mod:`d2s_search.backends.engine.saved_objects`.
"""

from __future__ import annotations

from typing import Any

from d2s_search.backends.engine.saved_objects import (  # noqa: F401  (re-exported)
    SEARCH_COLUMNS,
    TAGCLOUD_TITLE,
    THUMBNAIL_PX,
    index_ref,
    json_text,
    parse_ndjson,
    search_source,
    tagcloud_vis,
    to_ndjson,
)
from d2s_search.backends.engine.saved_objects import retarget as _retarget

__all__ = ["saved_objects", "to_ndjson", "parse_ndjson", "retarget", "DATA_VIEW_ID"]

DATA_VIEW_ID = "d2s-data-view"
SEARCH_ID = "d2s-kibana-images"
TAGCLOUD_ID = "d2s-kibana-terms"
DASHBOARD_ID = "d2s-kibana-dashboard"
MIGRATED_FROM = "8.0.0"


def _object(kind: str, obj_id: str, attributes: dict[str, Any], references: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "attributes": attributes,
        "coreMigrationVersion": MIGRATED_FROM,
        "id": obj_id,
        "references": references,
        "type": kind,
        "typeMigrationVersion": MIGRATED_FROM,
    }


def data_view(index_name: str = "d2s") -> dict[str, Any]:
    # The url field format with type "img" renders <img src=value> in Discover and in saved
    # search panels; width/height cap the thumbnail size.
    formats = {"url": {"id": "url", "params": {"type": "img", "urlTemplate": None, "labelTemplate": None,
                                                "width": THUMBNAIL_PX, "height": THUMBNAIL_PX}}}
    return _object("index-pattern", DATA_VIEW_ID, {
        "title": index_name,
        "name": "d2s pictures",
        "fields": "[]",
        "fieldFormatMap": json_text(formats),
        # The vectors are not for reading: hide them from Discover's document view.
        "sourceFilters": json_text([{"value": "dense"}, {"value": "sparse"}]),
        "allowNoIndex": True,
    }, [])


def saved_search() -> dict[str, Any]:
    return _object("search", SEARCH_ID, {
        "title": "d2s images",
        "description": "Pictures with their thumbnail, path and top terms. Query the `terms` field, "
                       "e.g. terms:dog and terms:beach.",
        "columns": list(SEARCH_COLUMNS),
        "sort": [],  # relevance (_score) order when a query is typed
        "kibanaSavedObjectMeta": search_source(with_index=True),
    }, index_ref(DATA_VIEW_ID))


def tag_cloud() -> dict[str, Any]:
    return _object("visualization", TAGCLOUD_ID, {
        "title": TAGCLOUD_TITLE,
        "description": "The words that describe most pictures. Click one to filter the dashboard.",
        "visState": json_text(tagcloud_vis()),
        "uiStateJSON": "{}",
        "kibanaSavedObjectMeta": search_source(with_index=True),
    }, index_ref(DATA_VIEW_ID))


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
        "panelsJSON": json_text(panels),
        "optionsJSON": json_text({"hidePanelTitles": False, "useMargins": True}),
        "timeRestore": False,
        "kibanaSavedObjectMeta": search_source(with_index=False),
    }, [
        {"id": TAGCLOUD_ID, "name": "panel_0", "type": "visualization"},
        {"id": SEARCH_ID, "name": "panel_1", "type": "search"},
    ])


def saved_objects(index_name: str = "d2s") -> list[dict[str, Any]]:
    """All objects, referenced ones first (the order of an export)."""
    return [data_view(index_name), saved_search(), tag_cloud(), dashboard()]


def retarget(objects: list[dict[str, Any]], index_name: str) -> list[dict[str, Any]]:
    """The objects with our index pattern pointed at ``index_name`` (its id stays the same)."""
    return _retarget(objects, index_name, DATA_VIEW_ID)
