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

INDEX_PATTERN_ID = "d2s-index-pattern"
SEARCH_ID = "d2s-images"
TAGCLOUD_ID = "d2s-terms-tagcloud"
DASHBOARD_ID = "d2s-dashboard"
# Migration versions of Dashboards 2.x (the newest migration of each type), so nothing is
# rewritten on import.
MIGRATION = {"index-pattern": "7.6.0", "search": "7.9.3", "visualization": "7.10.0", "dashboard": "7.9.3"}


def _object(kind: str, obj_id: str, attributes: dict[str, Any], references: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "attributes": attributes,
        "id": obj_id,
        "migrationVersion": {kind: MIGRATION[kind]},
        "references": references,
        "type": kind,
    }


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
        "fieldFormatMap": json_text(formats),
        "sourceFilters": json_text(source_filters),
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
        "kibanaSavedObjectMeta": search_source(with_index=True),
    }, index_ref(INDEX_PATTERN_ID))


def tag_cloud() -> dict[str, Any]:
    return _object("visualization", TAGCLOUD_ID, {
        "title": TAGCLOUD_TITLE,
        "description": "The words that describe most pictures. Click one to filter the dashboard.",
        "visState": json_text(tagcloud_vis()),
        "uiStateJSON": "{}",
        "version": 1,
        "kibanaSavedObjectMeta": search_source(with_index=True),
    }, index_ref(INDEX_PATTERN_ID))


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
        "panelsJSON": json_text(panels),
        "optionsJSON": json_text({"hidePanelTitles": False, "useMargins": True}),
        "version": 1,
        "timeRestore": False,
        "kibanaSavedObjectMeta": search_source(with_index=False),
    }, [
        {"id": TAGCLOUD_ID, "name": "panel_0", "type": "visualization"},
        {"id": SEARCH_ID, "name": "panel_1", "type": "search"},
    ])


def saved_objects(index_name: str = "d2s") -> list[dict[str, Any]]:
    """All objects, referenced ones first (the order of an export)."""
    return [index_pattern(index_name), saved_search(), tag_cloud(), dashboard()]


def retarget(objects: list[dict[str, Any]], index_name: str) -> list[dict[str, Any]]:
    """The objects with our index pattern pointed at ``index_name`` (its id stays the same)."""
    return _retarget(objects, index_name, INDEX_PATTERN_ID)
