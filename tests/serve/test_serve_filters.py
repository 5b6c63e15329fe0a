"""Filters, the library and facets in the JSON API, against a real index of photos with EXIF
and a sidecar (tests/serve/conftest.py make_library): every answer is the one the Python API
gives for the same filter, and the expected pictures are named by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

import d2s_search
from tests.serve.conftest import make_app, make_library

MODES = ("sparse", "two-phase", "dense", "hybrid")
NEWEST_FIRST = ["h2", "h1", "n2", "n1", "p3", "p2", "p1", "scan"]


@pytest.fixture(scope="module")
def library(tmp_path_factory, tiny_blip_bundle) -> Path:
    return make_library(tmp_path_factory.mktemp("library"), tiny_blip_bundle)


@pytest.fixture(scope="module")
def photos(library) -> Path:
    return library.parent / "photos"


@pytest.fixture(scope="module")
def client(tiny_blip_bundle, library, tmp_path_factory):
    from fastapi.testclient import TestClient

    with TestClient(make_app(tiny_blip_bundle, library, tmp_path_factory.mktemp("thumbs"))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def index(library, tiny_blip_bundle):
    """The same index through the Python API: the reference."""
    with d2s_search.Index.open(library, bundle=tiny_blip_bundle) as opened:
        yield opened


def stems(results) -> list[str]:
    return [Path(r["path"] if isinstance(r, dict) else r.path).stem for r in results]


def python_filter(index, params: dict):
    """``Index.filter`` of the same parameters the request gives."""
    return index.filter(after=params.get("after"), before=params.get("before"), folders=params.get("folder", []),
                        where=params.get("where", []), near=params.get("near"))


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def problem(response, field: str, *words: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"detail", "field"} and body["field"] == field, body
    assert "\n" not in body["detail"] and all(w in body["detail"] for w in words), body


# (request parameters, the pictures that pass, by hand)
FILTERS = [
    ({"after": "2019-06-01", "before": "2019-07-01"}, {"p1", "p2"}),
    ({"near": "48.8566,2.3522,5"}, {"p1", "p2", "p3"}),
    ({"where": ["camera=Canon EOS 5D", "camera=FUJIFILM X-T3"]}, {"p1", "p2", "h1"}),
    ({"where": ["rating>=4"]}, {"p1", "n1"}),
    ({"where": ["favourite=true"]}, {"p1", "n1"}),
    ({"where": ["who!=ann"], "before": "2022-01-01"}, {"p2", "p3", "n2", "scan"}),
    ({"folder": ["trips/nyc"]}, {"n1", "n2"}),
    ({"before": "2011-01-01"}, {"scan"}),  # dated by its file
]


def given(params: dict, photos: Path) -> dict:
    """Folders as the index stores them: absolute."""
    return {**params, "folder": [str(photos / f) for f in params.get("folder", [])]} if "folder" in params else params


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("params", "passing"), FILTERS, ids=lambda v: str(v)[:40])
def test_text_search_is_narrowed_as_the_python_api_narrows(client, index, photos, mode, params, passing):
    params = given(params, photos)
    body = ok(client.get("/api/search", params={"q": "a photo", "mode": mode, "k": 8, **params}))
    want = index.search("a photo", mode=mode, k=8, explain=8, filters=python_filter(index, params))
    assert [r["id"] for r in body["results"]] == [h.id for h in want.hits]
    assert [r["score"] for r in body["results"]] == pytest.approx([h.score for h in want.hits], rel=1e-5)
    # two-phase reaches only pictures with one of the query's own words
    assert set(stems(body["results"])) == passing or (mode == "two-phase" and set(stems(body["results"])) <= passing)
    filters = body["filters"]
    assert {k: v for k, v in filters.items() if v and k != "description"} == want.to_json()["filters"]
    assert filters["description"] == want.filters.describe()


def test_no_filter_says_none(client):
    body = ok(client.get("/api/search", params={"q": "a photo", "k": 8, "after": "", "where": ""}))
    assert body["filters"] is None and len(body["results"]) == 8


def test_picture_search_and_more_like_this_are_narrowed(client, index, photos):
    picture = photos / "trips" / "paris" / "p1.jpg"
    params = {"where": ["camera=Google Pixel 7"], "mode": "hybrid", "k": 5}
    body = ok(client.post("/api/search/image", params=params, files={"image": ("p1.jpg", picture.read_bytes(), "image/jpeg")}))
    want = index.search(image=picture, mode="hybrid", k=5, explain=8, filters=index.filter(where="camera=Google Pixel 7"))
    assert [r["id"] for r in body["results"]] == [h.id for h in want.hits]
    assert set(stems(body["results"])) == {"p3", "n1", "n2"} and body["filters"]["where"][0]["value"] == "Google Pixel 7"

    p1 = next(h.id for h in index.browse(8).hits if h.path == str(picture))
    body = ok(client.get(f"/api/documents/{p1}/similar", params={"near": "48.8566,2.3522,5", "k": 5}))
    assert set(stems(body["results"])) == {"p2", "p3"}  # Paris, the picture itself left out
    assert body["filters"]["near"] == {"lat": 48.8566, "lon": 2.3522, "km": 5.0}


def test_the_library_is_newest_first(client, index):
    body = ok(client.get("/api/library"))
    assert body["query"]["kind"] == "library" and body["mode"] == "library" and body["offset"] == 0
    assert stems(body["results"]) == NEWEST_FIRST
    assert [r["id"] for r in body["results"]] == [h.id for h in index.browse(50).hits]
    assert [r["rank"] for r in body["results"]] == list(range(1, 9))
    assert all(r["score"] == 0 and r["matched"] == [] for r in body["results"])
    assert body["results"][0]["taken"] == "2023-01-01T00:10:00Z" and body["results"][-1]["taken"] == "2010-01-01T00:00:00Z"
    assert [r["taken"] for r in body["results"]] == sorted((r["taken"] for r in body["results"]), reverse=True)
    assert body["query_terms"] == [] and body["encode_ms"] == 0 and body["filters"] is None


@pytest.mark.parametrize(("params", "k", "offset"), [
    ({"where": ["camera=Google Pixel 7", "camera=Canon EOS 5D"]}, 3, 1),
    ({"near": "40.7128,-74.006,10"}, 50, 0),
    ({"after": "2019-06-01", "folder": ["trips"]}, 2, 2),
    ({"where": ["rating<4"]}, 10, 0),
    ({}, 3, 6),
    ({}, 5, 8),
])
def test_library_pages_and_filters_as_browse(client, index, photos, params, k, offset):
    params = given(params, photos)
    body = ok(client.get("/api/library", params={**params, "k": k, "offset": offset}))
    want = index.browse(k, filters=python_filter(index, params) or None, offset=offset)
    assert [r["id"] for r in body["results"]] == [h.id for h in want.hits]
    assert body["k"] == k and body["offset"] == offset
    assert [r["rank"] for r in body["results"]] == list(range(offset + 1, offset + 1 + len(want.hits)))


def test_the_library_pages_in_order(client):
    pages = [stems(ok(client.get("/api/library", params={"k": 3, "offset": n}))["results"]) for n in (0, 3, 6)]
    assert sum(pages, []) == NEWEST_FIRST


def test_a_documents_detail_has_its_metadata(client, index, photos):
    ids = {Path(h.path).stem: h.id for h in index.browse(8).hits}
    body = ok(client.get(f"/api/documents/{ids['p1']}"))
    assert body["taken"] == "2019-06-02T09:00:00Z" and body["camera"] == "Canon EOS 5D"
    assert body["location"] == pytest.approx({"lat": 48.8566, "lon": 2.3522}, abs=1e-5)
    assert body["fields"] == {"rating": 5, "who": "ann", "favourite": True}
    scan = ok(client.get(f"/api/documents/{ids['scan']}"))
    assert scan["taken"] == "2010-01-01T00:00:00Z" and scan["camera"] is None and scan["location"] is None
    assert scan["fields"] == {}


def counts(body: dict, field: str) -> dict[str, int]:
    return {v["value"]: v["count"] for v in body["fields"][field]}


def test_facets_count_the_pictures_that_pass(client, index, photos):
    body = ok(client.get("/api/facets"))
    assert counts(body, "folder") == {str(photos / "home"): 3, str(photos / "trips" / "paris"): 3,
                                      str(photos / "trips" / "nyc"): 2}
    assert counts(body, "camera") == {"Google Pixel 7": 3, "Canon EOS 5D": 2, "FUJIFILM X-T3": 1}
    assert counts(body, "who") == {"ann": 2, "<b>bob</b>": 1, "cat": 1}
    assert counts(body, "favourite") == {"true": 2, "false": 2}
    assert [v["value"] for v in body["fields"]["camera"]] == ["Google Pixel 7", "Canon EOS 5D", "FUJIFILM X-T3"]
    assert "rating" not in body["fields"]  # a number: no values to list
    assert body["types"]["rating"] == "number" and body["types"]["who"] == "keyword"
    assert body["types"]["favourite"] == "boolean" and body["types"]["taken"] == "date"
    assert body["types"]["camera"] == "keyword" and body["located"] is True and body["filters"] is None
    assert body["fields"] == {f: [{"value": v, "count": c} for v, c in values] for f, values in index.facets().items()}

    june = ok(client.get("/api/facets", params={"after": "2019-06-01", "before": "2019-07-01"}))
    assert counts(june, "camera") == {"Canon EOS 5D": 2} and counts(june, "folder") == {str(photos / "trips" / "paris"): 2}
    assert counts(june, "who") == {"ann": 1, "<b>bob</b>": 1} and june["filters"]["after"] == "2019-06-01T00:00:00Z"
    assert june["located"] is True  # of the whole index

    home = ok(client.get("/api/facets", params={"folder": str(photos / "home"), "size": 1}))
    assert counts(home, "camera") == {"FUJIFILM X-T3": 1} and counts(home, "folder") == {str(photos / "home"): 3}
    assert home["fields"] == {f: [{"value": v, "count": c} for v, c in values] for f, values in
                              index.facets(filters=index.filter(folders=str(photos / "home")), size=1).items()}
    nothing = ok(client.get("/api/facets", params={"where": "rating>5"}))
    assert all(values == [] for values in nothing["fields"].values())


BAD = [
    ({"after": "June"}, "after", ["after='June'", "YYYY-MM-DD"]),
    ({"before": "2019-13-45"}, "before", ["before="]),
    ({"after": "2020-01-01", "before": "2019-01-01"}, "before", ["nothing could pass"]),
    ({"where": "colour=red"}, "where", ["no field 'colour'", "rating"]),
    ({"where": "rating>=x"}, "where", ["rating is a number"]),
    ({"where": "who>=3"}, "where", ["compare it with ="]),
    ({"where": "favourite=maybe"}, "where", ["true or false"]),
    ({"where": "nonsense"}, "where", ["FIELD=VALUE"]),
    ({"near": "1,2"}, "near", ["LAT,LON,KM"]),
    ({"near": "91,0,5"}, "near", ["latitude"]),
    ({"folder": "trips"}, "folder", ["absolute"]),
    ({"where": [f"rating>{n}" for n in range(51)]}, "where", ["at most 50"]),
    ({"after": "2" * 65}, "after", []),
]


@pytest.mark.parametrize("endpoint", ["/api/search", "/api/library", "/api/facets", "similar", "image"])
@pytest.mark.parametrize(("params", "field", "words"), BAD, ids=lambda v: str(v)[:30])
def test_bad_filters_are_refused_naming_the_parameter(client, index, endpoint, params, field, words):
    if endpoint == "image":
        response = client.post("/api/search/image", params=params, files={"image": ("x.jpg", b"not read", "image/jpeg")})
    elif endpoint == "similar":
        response = client.get(f"/api/documents/{index.browse(1).hits[0].id}/similar", params=params)
    else:
        response = client.get(endpoint, params={"q": "a photo", **params} if endpoint == "/api/search" else params)
    problem(response, field, *words)


def test_bad_paging(client):
    problem(client.get("/api/library", params={"k": 0}), "k")
    problem(client.get("/api/library", params={"k": 201}), "k")
    problem(client.get("/api/library", params={"offset": -1}), "offset")
    problem(client.get("/api/facets", params={"size": 0}), "size")


def test_status_says_the_index_can_filter(client):
    assert ok(client.get("/api/status"))["filters"] is True
    spec = ok(client.get("/openapi.json"))
    assert "/api/library" in spec["paths"] and "/api/facets" in spec["paths"]
    names = {p["name"] for p in spec["paths"]["/api/search"]["get"]["parameters"]}
    assert {"after", "before", "folder", "where", "near"} <= names


def test_a_field_added_while_serving_is_known_at_once(tmp_path, tiny_blip_bundle):
    """An ingest with a new sidecar field under a running server: its filters work without a restart."""
    from fastapi.testclient import TestClient

    index_path = make_library(tmp_path, tiny_blip_bundle)
    with TestClient(make_app(tiny_blip_bundle, index_path, tmp_path / "thumbs")) as client:
        problem(client.get("/api/library", params={"where": "mood=calm"}), "where", "no field 'mood'")
        (tmp_path / "moods.csv").write_text("path,mood\nh1.jpg,calm\nn2.jpg,calm\np3.jpg,busy\n")
        with d2s_search.Index.open(index_path, bundle=tiny_blip_bundle) as index:
            index.ingest(tmp_path / "photos", metadata=tmp_path / "moods.csv")
        assert stems(ok(client.get("/api/library", params={"where": "mood=calm"}))["results"]) == ["h1", "n2"]
        assert counts(ok(client.get("/api/facets")), "mood") == {"calm": 2, "busy": 1}
