"""Metadata from EXIF and sidecar files, stored at ingest and searched by the filters: real
JPEGs with EXIF written by Pillow, the real CLI, the tiny test bundle."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from d2s_search.errors import MetadataError
from d2s_search.metadata import Metadata, parse_time, read_metadata, read_sidecar
from tests.helpers import exif_jpeg, pattern_image, run_cli, run_cli_json

PARIS, NYC = (48.8566, 2.3522), (40.7128, -74.006)


def test_exif_date_camera_and_place(tmp_path):
    data = exif_jpeg(tmp_path / "a.jpg", 1, "2019:06:15 14:30:00", NYC, "Canon", "Canon EOS 5D").read_bytes()
    m = read_metadata(data, file_time=5.0)
    assert m.taken_at == parse_time("2019-06-15T14:30:00")
    assert m.camera == "Canon EOS 5D"  # the make is not said twice
    assert m.location == pytest.approx(NYC, abs=1e-6)  # west is negative


def test_exif_offset_and_fallbacks(tmp_path):
    with_zone = exif_jpeg(tmp_path / "z.jpg", 2, "2019:06:15 14:30:00", offset="+02:00", make="Google",
                          model="Pixel 7").read_bytes()
    m = read_metadata(with_zone)
    assert m.taken_at == parse_time("2019-06-15T12:30:00Z") and m.camera == "Google Pixel 7"
    plain = io.BytesIO()
    pattern_image(3).save(plain, "PNG")
    assert read_metadata(plain.getvalue(), file_time=1234.5) == Metadata(taken_at=1234.5)
    # malformed values are left out, never guessed: a bad date, a (0, 0) position without a fix
    bad = exif_jpeg(tmp_path / "b.jpg", 4, "yesterday", (0.0, 0.0)).read_bytes()
    assert read_metadata(bad, file_time=7.0) == Metadata(taken_at=7.0)
    assert read_metadata(b"not a picture", file_time=None) == Metadata()


def test_sidecar_csv_types_declared_and_inferred(tmp_path):
    (tmp_path / "photos").mkdir()
    side = tmp_path / "photos" / "fields.csv"
    side.write_text("path,trip,rating,fav,shot:date,code:keyword\n"
                    "a.jpg,alps,4,true,2019-06-01,007\n"
                    "sub/b.jpg,beach,2.5,false,2020-01-02T10:00,12\n"
                    "c.jpg,,,,,\n")
    car = read_sidecar(side)
    assert car.types == {"trip": "keyword", "rating": "number", "fav": "boolean", "shot": "date", "code": "keyword"}
    b = str((tmp_path / "photos" / "sub" / "b.jpg").resolve())
    assert car.fields_for(b) == {"trip": "beach", "rating": 2.5, "fav": False, "shot": parse_time("2020-01-02T10:00"),
                                 "code": "12"}
    assert car.fields_for("/anywhere/a.jpg")["code"] == "007"  # a bare file name: any picture of that name
    assert car.fields_for("/x/c.jpg") == {} and car.fields_for("/x/d.jpg") is None


def test_sidecar_jsonl(tmp_path):
    side = tmp_path / "f.jsonl"
    side.write_text(json.dumps({"file": "a.jpg", "stars": 5, "tag": "x", "ok": True}) + "\n\n"
                    + json.dumps({"file": "b.jpg", "stars": 3.5, "tag": "y"}) + "\n")
    car = read_sidecar(side)
    assert car.types == {"stars": "number", "tag": "keyword", "ok": "boolean"}
    assert car.fields_for("/p/a.jpg") == {"stars": 5.0, "tag": "x", "ok": True}


@pytest.mark.parametrize("name, text, message", [
    ("f.csv", "", "empty"),
    ("f.csv", "trip,rating\nx,1\n", "no 'path' or 'file' column"),
    ("f.csv", "path,rating:number\na.jpg,high\n", "row 2: rating='high' is not a number"),
    ("f.csv", "path,rating:colour\na.jpg,1\n", "declares type"),
    ("f.csv", "path,camera\na.jpg,x\n", "name the index uses itself"),
    ("f.csv", "path,2nd\na.jpg,x\n", "must start with a letter"),
    ("f.csv", "path,a\na.jpg,x,y\n", "row 2: 3 values for 2 columns"),
    ("f.jsonl", "{\"file\": \"a.jpg\", \"x\": [1]}\n", "line 1: 'x' is not a string"),
    ("f.jsonl", "[1]\n", "line 1: not a JSON object"),
    ("f.jsonl", "{\"x\": 1}\n", "line 1: no 'path' or 'file'"),
    ("f.txt", "path\n", "use a .csv or .jsonl"),
])
def test_bad_sidecars_are_one_line_errors(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(MetadataError, match=message) as caught:
        read_sidecar(tmp_path / name)
    assert "\n" not in str(caught.value) and name in str(caught.value)


def test_a_sidecar_that_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "f.csv")
    with pytest.raises(MetadataError, match="f.csv"):
        read_sidecar(tmp_path / "f.csv")


@pytest.fixture(scope="module")
def trip(tmp_path_factory) -> Path:
    """Six photos: three in Paris in June 2019 (two Canon), two in New York in 2021, one
    without EXIF; a sidecar rates them."""
    root = tmp_path_factory.mktemp("trip")
    photos = root / "photos"
    exif_jpeg(photos / "paris" / "p1.jpg", 11, "2019:06:02 09:00:00", PARIS, "Canon", "Canon EOS 5D")
    exif_jpeg(photos / "paris" / "p2.jpg", 12, "2019:06:20 18:00:00", (48.8606, 2.3376), "Canon", "Canon EOS 5D")
    exif_jpeg(photos / "paris" / "p3.jpg", 13, "2019:07:01 08:00:00", (48.85, 2.29), "Google", "Pixel 7")
    exif_jpeg(photos / "nyc" / "n1.jpg", 14, "2021:03:03 12:00:00", NYC, "Google", "Pixel 7")
    exif_jpeg(photos / "nyc" / "n2.jpg", 15, "2021:03:04 12:00:00", (40.73, -73.99), "Google", "Pixel 7")
    plain = photos / "plain.png"
    pattern_image(16).save(plain, "PNG")
    os.utime(plain, (parse_time("2010-01-01"), parse_time("2010-01-01")))
    (root / "ratings.csv").write_text("path,rating,who\nphotos/paris/p1.jpg,5,ann\nphotos/paris/p2.jpg,3,bob\n"
                                      "n1.jpg,4,ann\n")
    return root


def names(answer) -> list[str]:
    return sorted(Path(r["path"]).stem for r in answer["results"])


@pytest.fixture(scope="module")
def trip_index(trip, tiny_blip_bundle, tmp_path_factory):
    import d2s_search

    index = tmp_path_factory.mktemp("trip-index") / "index"
    with d2s_search.Index.open(index, bundle=tiny_blip_bundle, create=True) as opened:  # as `ingest --metadata`
        report = opened.ingest(trip / "photos", metadata=trip / "ratings.csv")
    assert report.exit_code == 0 and report.stored == 6
    return index


def query(index, capsys, *args):
    code, answer = run_cli_json(["query", *args, "--index", str(index), "--no-serve", "-k", "10"], capsys)
    assert code == 0
    return answer


def test_found_by_date_place_camera_and_sidecar_field(trip_index, capsys):
    assert names(query(trip_index, capsys, "a photo", "--after", "2019-06-01", "--before", "2019-07-01")) == ["p1", "p2"]
    assert names(query(trip_index, capsys, "a photo", "--near", "48.8566,2.3522,5")) == ["p1", "p2", "p3"]
    assert names(query(trip_index, capsys, "a photo", "--near", "40.7128,-74.006,5", "--mode", "dense")) == ["n1", "n2"]
    assert names(query(trip_index, capsys, "a photo", "--where", "camera=Canon EOS 5D")) == ["p1", "p2"]
    assert names(query(trip_index, capsys, "a photo", "--where", "rating>=4", "--mode", "hybrid")) == ["n1", "p1"]
    assert names(query(trip_index, capsys, "a photo", "--where", "who=ann", "--where", "who=bob")) == ["n1", "p1", "p2"]
    assert names(query(trip_index, capsys, "a photo", "--before", "2011-01-01")) == ["plain"]  # its file's time
    assert names(query(trip_index, capsys, "a photo", "--folder", str(Path(trip_index).parent / "nowhere"))) == []


def test_the_library_lists_newest_first(trip_index, capsys):
    answer = query(trip_index, capsys)
    assert [Path(r["path"]).stem for r in answer["results"]] == ["n2", "n1", "p3", "p2", "p1", "plain"]
    assert answer["mode"] == "library"
    answer = query(trip_index, capsys, "--near", "48.8566,2.3522,5", "--offset", "1")
    assert [Path(r["path"]).stem for r in answer["results"]] == ["p2", "p1"]


def test_unknown_fields_and_bad_filters_are_one_line_errors(trip_index, capsys):
    code, out, err = run_cli(["query", "a photo", "--index", str(trip_index), "--where", "colour=red"], capsys)
    assert code == 2 and "no field 'colour'" in err and "rating" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["query", "--index", str(trip_index), "--after", "June"], capsys)
    assert code == 2 and "YYYY-MM-DD" in err


def test_the_table_says_what_the_search_was_narrowed_to(trip_index, capsys):
    code, out, err = run_cli(["query", "a photo", "--index", str(trip_index), "--no-serve", "--after", "2019-06-01",
                              "--where", "rating>=4"], capsys)
    assert code == 0 and "only: taken from 2019-06-01, rating >= 4.0" in out


def test_reingest_updates_changed_metadata_without_encoding(trip, tiny_blip_bundle, tmp_path, capsys):
    index = tmp_path / "index"
    code, first = run_cli_json(["ingest", str(trip / "photos"), "--index", str(index), "--bundle",
                                str(tiny_blip_bundle)], capsys)
    assert code == 0 and first["stored"] == 6
    assert query(index, capsys, "a photo", "--where", "camera=Google Pixel 7")["results"]
    side = tmp_path / "new.csv"
    side.write_text("file,rating\np3.jpg,5\nplain.png,1\n")
    code, second = run_cli_json(["ingest", str(trip / "photos"), "--index", str(index), "--metadata", str(side)],
                                capsys)
    assert code == 0 and second["stored"] == 0 and second["already_stored"] == 6 and second["metadata_updated"] == 2
    assert names(query(index, capsys, "a photo", "--where", "rating>=2")) == ["p3"]
    code, plain = run_cli_json(["ingest", str(trip / "photos"), "--index", str(index)], capsys)
    assert plain["metadata_updated"] == 0  # no sidecar: the fields stay
    assert names(query(index, capsys, "a photo", "--where", "rating>=2")) == ["p3"]
    code, third = run_cli_json(["ingest", str(trip / "photos"), "--index", str(index), "--metadata", str(side)],
                               capsys)
    assert third["metadata_updated"] == 0  # nothing changed: nothing written
    # a field the index knows as a number cannot come back as text
    side.write_text("file,rating\np3.jpg,great\n")
    code, out, err = run_cli(["ingest", str(trip / "photos"), "--index", str(index), "--metadata", str(side)], capsys)
    assert code == 2 and "rating" in err and "number" in err
    assert names(query(index, capsys, "a photo", "--where", "rating>=2")) == ["p3"]  # nothing lost


def test_an_index_made_before_metadata_gains_it_on_the_next_ingest(trip, tiny_blip_bundle, tmp_path, capsys):
    index = tmp_path / "index"
    run_cli_json(["ingest", str(trip / "photos"), "--index", str(index), "--bundle", str(tiny_blip_bundle)], capsys)
    import sqlite3

    db = sqlite3.connect(index / "index.sqlite")
    db.execute("DROP TABLE metadata")  # as an index written before metadata was kept
    db.execute("DELETE FROM meta WHERE key = 'metadata_version'")
    db.commit()
    db.close()
    assert query(index, capsys, "--near", "48.8566,2.3522,5")["results"] == []
    code, again = run_cli_json(["ingest", str(trip / "photos"), "--index", str(index)], capsys)
    assert again["stored"] == 0 and again["metadata_updated"] == 6
    assert names(query(index, capsys, "--near", "48.8566,2.3522,5")) == ["p1", "p2", "p3"]


def test_index_stats_say_what_the_filters_can_narrow_by(trip_index, capsys):
    code, stats = run_cli_json(["index", "stats", "--index", str(trip_index)], capsys)
    assert code == 0 and stats["metadata"] == {"taken": 6, "location": 5, "camera": 5,
                                               "fields": {"rating": "number", "who": "keyword"}}
