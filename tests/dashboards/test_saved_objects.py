"""The saved objects in mappings/dashboards/: they parse, their references resolve, and every
field they name exists in mappings/index.json with a type that suits its use."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import pytest

from d2s_search.backends.opensearch import dashboards_objects as so
from d2s_search.backends.opensearch.backend import OpenSearchBackend

REPO = Path(__file__).resolve().parents[2]
NDJSON = sorted((REPO / "mappings" / "dashboards").glob("*.ndjson"))
KNOWN_TYPES = {"index-pattern", "search", "visualization", "dashboard"}
# Attributes stored as JSON text inside the object.
JSON_TEXT = ("fields", "fieldFormatMap", "sourceFilters", "visState", "uiStateJSON", "panelsJSON", "optionsJSON")
META_FIELDS = {"_id", "_index", "_score", "_source"}


def load_file_objects() -> list[dict]:
    objects = []
    for file in NDJSON:
        objects.extend(so.parse_ndjson(file.read_text(encoding="utf-8")))
    return objects


def check(objects: list[dict], mapping: dict) -> list[str]:
    """Problems with a set of saved objects (empty when all is well)."""
    problems: list[str] = []
    props = mapping["mappings"]["properties"]
    by_key = {(o["type"], o["id"]): o for o in objects}
    if len(by_key) != len(objects):
        problems.append("duplicate type/id")

    def field_ok(name: str, where: str, want: tuple[str, ...] | None = None) -> None:
        if name in META_FIELDS:
            return
        if name not in props:
            problems.append(f"{where}: field {name!r} is not in the mapping")
        elif want and props[name]["type"] not in want:
            problems.append(f"{where}: field {name!r} is {props[name]['type']}, needs one of {want}")

    for obj in objects:
        where = f"{obj['type']}/{obj['id']}"
        attrs = obj["attributes"]
        if obj["type"] not in KNOWN_TYPES:
            problems.append(f"{where}: unknown type")
        if obj.get("migrationVersion", {}).get(obj["type"]) not in (None, so.MIGRATION.get(obj["type"])):
            problems.append(f"{where}: unexpected migrationVersion {obj.get('migrationVersion')}")
        parsed = {}
        for key in JSON_TEXT:
            if key in attrs:
                try:
                    parsed[key] = json.loads(attrs[key])
                except ValueError:
                    problems.append(f"{where}: {key} is not JSON")
        refs = {r["name"]: r for r in obj.get("references", [])}
        for ref in obj.get("references", []):
            if (ref["type"], ref["id"]) not in by_key:
                problems.append(f"{where}: reference {ref['name']} -> {ref['type']}/{ref['id']} does not resolve")
        source = json.loads(attrs.get("kibanaSavedObjectMeta", {}).get("searchSourceJSON", "{}"))
        if "index" in source:
            problems.append(f"{where}: searchSourceJSON names an index id instead of a reference")
        if "indexRefName" in source:
            ref = refs.get(source["indexRefName"])
            if ref is None or ref["type"] != "index-pattern":
                problems.append(f"{where}: indexRefName {source['indexRefName']} has no index-pattern reference")
        if obj["type"] == "index-pattern":
            for name, fmt in parsed.get("fieldFormatMap", {}).items():
                field_ok(name, where)
                if fmt.get("id") == "url" and fmt["params"].get("type") == "img":
                    field_ok(name, where, ("keyword",))
            for f in parsed.get("sourceFilters", []):
                field_ok(f["value"], where)
            if attrs.get("timeFieldName"):
                field_ok(attrs["timeFieldName"], where, ("date",))
        elif obj["type"] == "search":
            for column in attrs.get("columns", []):
                field_ok(column, where)
            for sort_field, _ in attrs.get("sort", []):
                field_ok(sort_field, where)
        elif obj["type"] == "visualization":
            vis = parsed["visState"]
            if vis.get("title") != attrs.get("title"):
                problems.append(f"{where}: visState title differs from the title")
            for agg in vis.get("aggs", []):
                if "field" in agg.get("params", {}):
                    # terms aggregations need doc values: keyword (or numeric) fields
                    field_ok(agg["params"]["field"], where, ("keyword", "integer", "long", "date"))
        elif obj["type"] == "dashboard":
            panels = parsed["panelsJSON"]
            if not panels:
                problems.append(f"{where}: no panels")
            seen_cells = set()
            for panel in panels:
                ref = refs.get(panel.get("panelRefName", ""))
                if ref is None:
                    problems.append(f"{where}: panel {panel.get('panelIndex')} has no reference")
                elif ref["type"] not in ("search", "visualization"):
                    problems.append(f"{where}: panel refers to a {ref['type']}")
                grid = panel["gridData"]
                if grid["x"] + grid["w"] > 48 or grid["i"] != panel["panelIndex"] or grid["i"] in seen_cells:
                    problems.append(f"{where}: bad gridData {grid}")
                seen_cells.add(grid["i"])
    return problems


def test_there_is_one_ndjson_file_and_it_is_the_builders_output():
    assert [f.name for f in NDJSON] == ["d2s-search.ndjson"]
    assert NDJSON[0].read_text(encoding="utf-8") == so.to_ndjson(so.saved_objects())


def test_every_line_is_one_saved_object():
    for file in NDJSON:
        for line in file.read_text(encoding="utf-8").splitlines():
            obj = json.loads(line)
            assert set(obj) >= {"type", "id", "attributes", "references", "migrationVersion"}
            assert obj["attributes"]["title"]


def test_objects_are_consistent_with_each_other_and_the_mapping(index_mapping):
    objects = load_file_objects()
    assert {o["type"] for o in objects} == KNOWN_TYPES
    assert check(objects, index_mapping) == []


def test_index_pattern_points_at_the_backend_index_and_shows_images():
    (pattern,) = [o for o in load_file_objects() if o["type"] == "index-pattern"]
    default_index = inspect.signature(OpenSearchBackend).parameters["index_name"].default
    assert pattern["attributes"]["title"] == default_index == "d2s"
    fmt = json.loads(pattern["attributes"]["fieldFormatMap"])["url"]
    assert fmt["id"] == "url" and fmt["params"]["type"] == "img"
    assert int(fmt["params"]["width"]) > 0 and int(fmt["params"]["height"]) > 0
    # no time field: Discover would hide everything outside its (15 minute) time range
    assert "timeFieldName" not in pattern["attributes"]
    assert json.loads(pattern["attributes"]["fields"]) == []  # fetched from the cluster on first use


def test_saved_search_columns_and_dashboard_panels():
    objs = {o["type"]: o for o in load_file_objects()}
    assert objs["search"]["attributes"]["columns"] == ["url", "path", "terms"]
    vis = json.loads(objs["visualization"]["attributes"]["visState"])
    assert vis["type"] == "tagcloud"
    assert [a["params"].get("field") for a in vis["aggs"] if a["type"] == "terms"] == ["terms"]
    panel_refs = {r["id"] for r in objs["dashboard"]["references"]}
    assert panel_refs == {objs["search"]["id"], objs["visualization"]["id"]}


# -- the checker is not vacuous ------------------------------------------------------------

BROKEN = {
    "dangling panel": lambda objs: objs[3]["references"][0].update(id="gone"),
    "panel without reference": lambda objs: objs[3]["attributes"].update(
        panelsJSON=json.dumps([{"gridData": {"x": 0, "y": 0, "w": 8, "h": 8, "i": "1"}, "panelIndex": "1",
                                "panelRefName": "panel_9"}])),
    "unknown column": lambda objs: objs[1]["attributes"]["columns"].append("thumbnail"),
    "tag cloud on a text-less field": lambda objs: objs[2]["attributes"].update(
        visState=objs[2]["attributes"]["visState"].replace('"field":"terms"', '"field":"sparse"')),
    "image format on a missing field": lambda objs: objs[0]["attributes"].update(
        fieldFormatMap=json.dumps({"image_url": {"id": "url", "params": {"type": "img"}}})),
    "index id instead of reference": lambda objs: objs[1]["attributes"]["kibanaSavedObjectMeta"].update(
        searchSourceJSON=json.dumps({"index": "d2s-index-pattern"})),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_checker_finds_broken_objects(index_mapping, name):
    objects = copy.deepcopy(so.saved_objects())
    BROKEN[name](objects)
    assert check(objects, index_mapping), name


def test_parse_ndjson_skips_the_export_summary_and_rejects_junk():
    text = so.to_ndjson(so.saved_objects()) + '{"exportedCount":4,"missingRefCount":0,"missingReferences":[]}\n'
    assert len(so.parse_ndjson(text)) == 4
    with pytest.raises(ValueError, match="line 2"):
        so.parse_ndjson('{"type":"search","id":"a","attributes":{}}\nnot json\n')
    with pytest.raises(ValueError, match="needs 'id'"):
        so.parse_ndjson('{"type":"search","attributes":{}}\n')


def test_retarget_changes_only_our_index_pattern_title():
    objects = so.retarget(so.saved_objects(), "pictures")
    assert objects[0]["attributes"]["title"] == "pictures"
    assert objects[0]["id"] == so.INDEX_PATTERN_ID
    assert objects[1:] == so.saved_objects()[1:]
    assert so.saved_objects()[0]["attributes"]["title"] == "d2s"  # the builders are not mutated
