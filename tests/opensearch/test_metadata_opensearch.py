"""Metadata end to end on OpenSearch (osmem): photos with EXIF and a sidecar ingested through the
command, then found by the same filters as on the local index, with the same answers."""

from __future__ import annotations

from pathlib import Path

import d2s_search
from tests.helpers import run_cli_json
from tests.test_metadata import trip  # noqa: F401 (the fixture: six photos with EXIF and a sidecar)

FILTERS = [
    ["--after", "2019-06-01", "--before", "2019-07-01"],
    ["--near", "48.8566,2.3522,5"],
    ["--where", "camera=Canon EOS 5D"],
    ["--where", "rating>=4"],
    ["--where", "who=ann", "--where", "who=bob"],
    ["--before", "2011-01-01"],
]


def names(answer) -> list[str]:
    return sorted(Path(r["path"]).stem for r in answer["results"])


def test_the_same_filters_find_the_same_photos_as_on_the_local_index(trip, tiny_blip_bundle, osmem_url,  # noqa: F811
                                                                    tmp_path, capsys):
    where = {"cluster": ["--url", osmem_url, "--index-name", "trip"], "local": ["--index", str(tmp_path / "idx")]}
    for place in where.values():
        code, report = run_cli_json(["ingest", str(trip / "photos"), *place, "--bundle", str(tiny_blip_bundle),
                                     "--metadata", str(trip / "ratings.csv")], capsys)
        assert code == 0 and report["stored"] == 6
    for narrow in FILTERS:
        answers = {name: run_cli_json(["query", "a photo", *place, *narrow, "-k", "10", "--no-serve"], capsys)[1]
                   for name, place in where.items()}
        assert names(answers["cluster"]) == names(answers["local"]) and answers["cluster"]["results"], narrow
        assert [r["id"] for r in answers["cluster"]["results"]] == [r["id"] for r in answers["local"]["results"]]
    library = {name: run_cli_json(["query", *place, "-k", "10"], capsys)[1] for name, place in where.items()}
    assert [r["id"] for r in library["cluster"]["results"]] == [r["id"] for r in library["local"]["results"]]
    with d2s_search.Index.open(url=osmem_url, index_name="trip") as index:
        assert index.facets()["camera"] == [("Google Pixel 7", 3), ("Canon EOS 5D", 2)]
    # a changed sidecar reaches the cluster without encoding anything
    (tmp_path / "new.csv").write_text("file,rating\nplain.png,5\n")
    code, again = run_cli_json(["ingest", str(trip / "photos"), *where["cluster"], "--metadata",
                                str(tmp_path / "new.csv")], capsys)
    assert code == 0 and again["stored"] == 0 and again["metadata_updated"] >= 1
    found = run_cli_json(["query", "a photo", *where["cluster"], "--where", "rating>=5"], capsys)[1]
    assert names(found) == ["p1", "plain"]  # p1 keeps its 5: the new file has no row for it
    code, plain = run_cli_json(["ingest", str(trip / "photos"), *where["cluster"]], capsys)
    assert plain["metadata_updated"] == 0
