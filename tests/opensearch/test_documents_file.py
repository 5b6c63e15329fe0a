"""`ingest --documents FILE.jsonl` and Index.ingest_documents against osmem: pictures stored
under the user's own ids."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import d2s_search
from d2s_search.errors import IndexStoreError
from tests.helpers import run_cli, run_cli_json, write_image
from tests.test_json_shapes import DOCUMENTS, check


def write_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def catalogue(tmp_path):
    root = tmp_path / "pictures"
    for name, seed in (("a.jpg", 1), ("b.jpg", 2), ("c.jpg", 3), ("d.jpg", 4)):
        write_image(root / name, seed=seed)
    rows = [{"id": "p1", "image": "a.jpg"}, {"id": "p2", "image": "b.jpg"},
            {"id": "p3", "image": "a.jpg"},  # the same picture as p1: a document of its own
            {"id": "p4", "image": "gone.jpg"},
            {"id": "p5", "image": "c.jpg", "title": "red shoe", "price": 10},
            {"id": 7, "image": str(root / "d.jpg")}]
    return root, write_lines(tmp_path / "products.jsonl", rows)


def args(url: str, bundle: Path, root: Path, lines: Path, name: str = "catalogue") -> list:
    return ["ingest", "--documents", lines, "--image-root", root, "--url", url, "--index-name", name,
            "--bundle", bundle]


def test_pictures_are_stored_under_the_users_ids(osmem_url, catalogue, tiny_blip_bundle, capsys, tmp_path):
    root, lines = catalogue
    code, report = run_cli_json(args(osmem_url, tiny_blip_bundle, root, lines), capsys)
    assert code == 3, report
    check(report, DOCUMENTS)
    assert (report["found"], report["stored"], report["already_stored"]) == (6, 5, 0)
    assert [f["id"] for f in report["failed"]] == ["p4"] and "not found" in report["failed"][0]["reason"]
    assert report["left_out_keys"] == []

    with d2s_search.Index.open(url=osmem_url, index_name="catalogue") as index:
        hits = index.search("a red shoe", k=10).hits
        assert {h.id for h in hits} == {"p1", "p2", "p3", "p5", "7"}
        by_id = {h.id: h for h in hits}
        assert by_id["p1"].path == by_id["p3"].path == str(root / "a.jpg")
        assert by_id["p1"].score == by_id["p3"].score  # one picture, two documents
        with pytest.raises(IndexStoreError, match="under your ids"):
            index.ingest(root)  # folders are keyed by content: not into this index

    again = run_cli(args(osmem_url, tiny_blip_bundle, root, lines), capsys)
    assert again[0] == 3 and "stored 0 document(s) of 6; 5 already stored, 1 failed" in again[1]

    moved = write_lines(tmp_path / "moved.jsonl", [{"id": "p2", "image": "c.jpg"}])
    code, report = run_cli_json(args(osmem_url, tiny_blip_bundle, root, moved), capsys)
    assert (code, report["stored"]) == (0, 1)  # another picture for p2: replaced, not added
    with d2s_search.Index.open(url=osmem_url, index_name="catalogue") as index:
        assert index.stats()["documents"] == 5
        assert {h.id: h.path for h in index.search("a red shoe", k=10).hits}["p2"] == str(root / "c.jpg")
    assert run_cli(["index", "prune", "--url", osmem_url, "--index-name", "catalogue"], capsys)[0] == 1


def test_what_is_refused_before_any_work(osmem_url, catalogue, tiny_blip_bundle, capsys, tmp_path):
    root, lines = catalogue
    code, out, err = run_cli(["ingest", "--documents", lines, "--bundle", tiny_blip_bundle,
                              "--index", tmp_path / "local"], capsys)
    assert code == 2 and "a local index keys pictures by their content" in err and not (tmp_path / "local").exists()

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "image": "a.jpg"}\n\n{"id": "a", "image": "b.jpg"}\n')
    code, out, err = run_cli(args(osmem_url, tiny_blip_bundle, root, broken), capsys)
    assert code == 2 and "line 3: id 'a' is on line 1 already" in err and err.count("\n") == 1
    broken.write_text('{"id": "a", "image": "a.jpg"}\nnot json\n')
    assert "line 2: not JSON" in run_cli(args(osmem_url, tiny_blip_bundle, root, broken), capsys)[2]
    assert httpx.head(f"{osmem_url}/catalogue").status_code == 404  # no index was made

    with d2s_search.Index.open(url=osmem_url, index_name="folders", bundle=tiny_blip_bundle, create=True) as index:
        index.ingest(root / "a.jpg")
        with pytest.raises(IndexStoreError, match="keyed by their content"):
            index.ingest_documents(lines, image_root=root)


def test_the_other_keys_are_typed_as_metadata_files_are(tmp_path):
    from d2s_search.errors import MetadataError
    from d2s_search.user_documents import read_lines, typed_fields

    lines, others = read_lines([{"id": "a", "image": "a.jpg", "title": "Red shoe", "price": 10, "sale": True,
                                 "added": "2024-05-01"},
                                {"id": "b", "image": "b.jpg", "title": "Blue", "price": "12.5", "sale": "false"}])
    assert others == ["title", "price", "sale", "added"]
    types, fields = typed_fields(lines)
    assert types == {"title": "keyword", "price": "number", "sale": "boolean", "added": "date"}
    assert fields["b"] == {"title": "Blue", "price": 12.5, "sale": False}
    assert fields["a"]["added"] == pytest.approx(1714521600.0)
    for bad, why in (({"tags": ["x"]}, "is not a string, number or boolean"), ({"sparse": 1}, "uses itself"),
                     ({"9lives": 1}, "must start with a letter")):
        lines, _ = read_lines([{"id": "c", "image": "c.jpg", **bad}])
        with pytest.raises(MetadataError, match=why):
            typed_fields(lines)


def test_the_other_keys_are_the_documents_fields(osmem_url, catalogue, tiny_blip_bundle):
    root, lines = catalogue
    with d2s_search.Index.open(url=osmem_url, index_name="fields", bundle=tiny_blip_bundle, create=True) as index:
        report = index.ingest_documents(lines, image_root=root)
        assert (report.stored, report.left_out_keys) == (5, [])
        assert index.metadata(["p5"])["p5"].fields == {"title": "red shoe", "price": 10.0}
        cheap = index.search("a red shoe", k=10, filters=index.filter(where=["price<20"])).hits
        assert [h.id for h in cheap] == ["p5"]
        changed = index.ingest_documents([{"id": "p5", "image": "c.jpg", "title": "red shoe", "price": 30}],
                                         image_root=root)
        assert (changed.stored, changed.metadata_updated) == (0, 1)  # the fields written, nothing encoded
        assert index.metadata(["p5"])["p5"].fields["price"] == 30.0
