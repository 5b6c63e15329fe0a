"""Pictures by URI (``s3://``, ``gs://``, ``file://``...), read through ``pyarrow.fs``: listed with
ingest's skip rules, stored under their URI, never taken for missing local files by ``index
stats`` / ``index prune`` or by ingest's copies and moves, and ingested alike with Ray. The
``file://`` scheme stands in for an object store here: pyarrow serves every scheme through the
same FileSystem calls (get_file_info, FileSelector, open_input_file)."""

from __future__ import annotations

import pytest

from d2s_search.backends.local import LocalBackend
from d2s_search.images import Skip
from d2s_search.sources import discover_sources, exists, is_uri, read
from tests.helpers import run_cli_json, write_image

pytest.importorskip("pyarrow", reason="the ray extra (pyarrow) is not installed")


@pytest.fixture
def bucket(tmp_path):
    root = tmp_path / "bucket"
    for i in range(6):
        write_image(root / "trip" / f"p{i}.jpg", seed=300 + i)
    write_image(root / ".thumbnails" / "t0.jpg", seed=1)  # hidden: skipped
    write_image(root / "raw" / "r0.jpg", seed=2)  # excluded below
    (root / "trip" / "notes.txt").write_text("not a picture, not listed")
    (root / "trip" / "broken.jpg").write_bytes(b"\xff\xd8 cut")
    return root


def test_listing_follows_the_skip_rules(bucket):
    uri = bucket.as_uri()
    files, problems, skipped = discover_sources([uri], Skip(exclude=("raw/",)))
    assert files == [f"{uri}/trip/broken.jpg", *[f"{uri}/trip/p{i}.jpg" for i in range(6)]]
    assert problems == [] and (skipped.hidden, skipped.excluded) == (1, 1)
    assert all(is_uri(f) for f in files) and exists(files[1]) and not exists(f"{uri}/trip/gone.jpg")
    assert read(files[1]) == (bucket / "trip" / "p0.jpg").read_bytes()
    files, problems, _ = discover_sources([f"{uri}/nowhere"], Skip())
    assert files == [] and problems == [(f"{uri}/nowhere", "not found")]


def _stored(index):
    store = LocalBackend(index)
    store.open(None, create=False)
    try:
        return sorted(path for _, path in store.document_paths())
    finally:
        store.close()


def test_ingest_stores_uris_and_stats_and_prune_check_them(bucket, tiny_blip_bundle, tmp_path, capsys):
    uri = bucket.as_uri()
    index = tmp_path / "idx"
    code, report = run_cli_json(["ingest", uri, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 3 and report["stored"] == 7 and report["skipped"] == {"hidden": 1, "excluded": 0}
    assert [r["path"] for r in report["rejected"]] == [f"{uri}/trip/broken.jpg"]
    assert _stored(index) == sorted([f"{uri}/raw/r0.jpg", *[f"{uri}/trip/p{i}.jpg" for i in range(6)]])
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert code == 0 and stats["missing_files"] == 0  # present objects are not "gone local files"
    code, again = run_cli_json(["ingest", uri, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert again["stored"] == 0 and again["already_stored"] == 7 and again["moved"] == again["copies"] == 0

    (bucket / "trip" / "p3.jpg").unlink()
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert stats["missing_files"] == 1
    code, pruned = run_cli_json(["index", "prune", "--index", index], capsys)
    assert code == 0 and pruned["removed"] == 1
    assert f"{uri}/trip/p3.jpg" not in _stored(index) and len(_stored(index)) == 6


def test_ray_ingests_uris_as_one_process_does(bucket, tiny_blip_bundle, tmp_path, capsys):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    uri = bucket.as_uri()
    common = [uri, "--bundle", tiny_blip_bundle, "--exclude", "raw/", "--batch-size", "2"]
    run_cli_json(["ingest", *common, "--index", tmp_path / "one"], capsys)
    code, report = run_cli_json(["ingest", *common, "--index", tmp_path / "ray", "--engine", "ray",
                                 "--workers", "1"], capsys)
    assert code == 3 and report["stored"] == 6 and report["workers"]["count"] == 1
    assert _stored(tmp_path / "ray") == _stored(tmp_path / "one") == [f"{uri}/trip/p{i}.jpg" for i in range(6)]
