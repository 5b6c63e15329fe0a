"""The JSON that `query --json`, `ingest --json` and `index stats --json` print is an interface
(docs/python-api.md, Versioning): its keys and value types are pinned here, so changing them is
a visible decision, not a side effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli_json, write_image

NoneType = type(None)
Number = (int, float)  # a float that happens to be whole prints as an int in some producers

# key -> type, tuple of types, nested shape (dict), or [shape] for a list of that shape.
# A key in OPTIONAL may be absent; every other key must be present; no other key may appear.
MATCH = {"term": str, "contribution": float}
WORD_MATCH = {"word": str, "contribution": float, "terms": [str]}  # inflections collapsed
RESULT = {"rank": int, "id": str, "score": float, "path": str, "url": (str, NoneType), "matched": [MATCH],
          "words": [WORD_MATCH], "parts": {"sparse": float, "dense": float}}
QUERY = {"mode": str, "fusion": str, "took_ms": Number, "weak_query": bool, "unrecognised_words": [str],
         "notice": (str, NoneType), "query_terms": [{"term": str, "weight": float}],
         "query_words": [{"word": str, "weight": float, "terms": [str]}], "results": [RESULT],
         "note": str, "answered_by": str, "filters": {"after": str, "before": str, "folders": [str],
                                                     "where": [{"field": str, "op": str, "value": (str, float, bool)}],
                                                     "near": {"lat": float, "lon": float, "km": float}}}
INGEST = {"found": int, "stored": int, "already_stored": int, "duplicates": int, "metadata_updated": int,
          "moved": int, "copies": int,
          "rejected": [{"path": str, "reason": str}], "skipped": {"hidden": int, "excluded": int},
          "seconds": Number, "images_per_second": Number, "search_structures_seconds": Number, "exit_code": int,
          "error": {"type": str, "message": str}}
STATS_LOCAL = {"backend": str, "location": str, "documents": int, "distinct_terms": int,
               "mean_terms_per_document": Number, "bundle_fingerprint": str, "bundle_model": str, "dense_dim": int,
               "created_at": str, "last_ingest_at": str, "disk_bytes": int, "scoring_kernel": str, "hit_builder": str,
               "graph_walk": str, "sparse_query": str, "dense_search": str, "dense_recall_at_10": (float, NoneType), "bundle_path": str,
               "missing_files": int,
               "metadata": {"taken": int, "location": int, "camera": int, "fields": dict}}
# ingest --update-existing and ingest --documents (pinned by tests/opensearch/test_update_existing.py
# and test_documents_file.py, on a cluster index).
UPDATE_EXISTING = {"index": str, "image_field": str, "found": int, "updated": int, "already_done": int,
                   "failed": [{"id": str, "reason": str}], "dense": str, "seconds": Number, "exit_code": int}
DOCUMENTS = {"found": int, "stored": int, "already_stored": int, "metadata_updated": int,
             "failed": [{"id": str, "reason": str}],
             "left_out_keys": [str], "seconds": Number, "exit_code": int}
# Keys that may be absent, per shape.
OPTIONAL = {
    id(QUERY): {"fusion", "note", "answered_by", "filters"},  # hybrid; two-phase locally; a serve answered; filtered
    id(QUERY["filters"]): {"after", "before", "folders", "where", "near"},  # those given
    id(RESULT): {"parts"},  # fused results
    id(INGEST): {"search_structures_seconds", "error"},  # built by this run; nothing stored
}


def check(value, shape, where: str = "$") -> None:
    if isinstance(shape, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        assert not value.keys() - shape.keys(), f"{where}: keys not pinned: {sorted(value.keys() - shape.keys())}"
        missing = shape.keys() - value.keys() - OPTIONAL.get(id(shape), set())
        assert not missing, f"{where}: keys missing: {sorted(missing)}"
        for key, sub in value.items():
            check(sub, shape[key], f"{where}.{key}")
    elif isinstance(shape, list):
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for n, item in enumerate(value):
            check(item, shape[0], f"{where}[{n}]")
    else:
        types = shape if isinstance(shape, tuple) else (shape,)
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        assert ok, f"{where}: {value!r} is not {' or '.join(t.__name__ for t in types)}"


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Six photos and a broken file."""
    root = tmp_path_factory.mktemp("shapes") / "photos"
    for i in range(6):
        write_image(root / f"p{i}.jpg", seed=300 + i)
    (root / "broken.jpg").write_bytes(b"not a picture")
    return root


@pytest.fixture(scope="module")
def shapes_index(photos, tiny_blip_bundle) -> Path:
    import d2s_search

    path = photos.parent / "index"
    with d2s_search.Index.open(path, bundle=tiny_blip_bundle, create=True) as index:
        assert index.ingest(photos).stored == 6
    return path


def test_ingest_json_shape(photos, tiny_blip_bundle, tmp_path, capsys):
    code, report = run_cli_json(["ingest", photos, "--index", tmp_path / "index", "--bundle", tiny_blip_bundle],
                                capsys)
    assert code == 3 and report["stored"] == 6 and "search_structures_seconds" in report
    check(report, INGEST)
    code, report = run_cli_json(["ingest", photos / "broken.jpg", "--index", tmp_path / "other", "--bundle",
                                 tiny_blip_bundle], capsys)
    assert code == 1 and report["error"]["type"] == "NothingStored"
    check(report, INGEST)


@pytest.mark.parametrize("mode", ["sparse", "two-phase", "dense", "hybrid"])
def test_query_json_shape(shapes_index, mode, capsys):
    code, answer = run_cli_json(["query", "dogs in a car", "--index", shapes_index, "--mode", mode, "-k", "3",
                                 "--no-serve"], capsys)
    assert code == 0 and len(answer["results"]) == 3
    assert ("fusion" in answer) == (mode == "hybrid") and ("note" in answer) == (mode == "two-phase")
    assert all(("parts" in r) == (mode == "hybrid") for r in answer["results"])
    check(answer, QUERY)
    code, weak = run_cli_json(["query", "qwertyuiop", "--index", shapes_index, "--mode", mode, "--no-serve"], capsys)
    assert code == 0 and weak["weak_query"] is True and isinstance(weak["notice"], str)
    check(weak, QUERY)


def test_filtered_query_and_library_json_shape(shapes_index, capsys):
    narrow = ["--after", "2000-01-01", "--before", "2100-01-01", "--where", "width>=1", "--where", "camera!=x",
              "--near", "0,0,20000"]
    code, answer = run_cli_json(["query", "dogs in a car", "--index", shapes_index, *narrow, "--no-serve"], capsys)
    assert code == 0 and answer["filters"]["where"] == [{"field": "width", "op": ">=", "value": 1.0},
                                                        {"field": "camera", "op": "!=", "value": "x"}]
    assert answer["results"] == []  # the pictures have no GPS position: --near keeps none
    check(answer, QUERY)
    code, library = run_cli_json(["query", "--index", shapes_index, "--after", "2000-01-01", "-k", "4"], capsys)
    assert code == 0 and library["mode"] == "library" and len(library["results"]) == 4
    check(library, QUERY)


def test_index_stats_json_shape(shapes_index, capsys):
    code, stats = run_cli_json(["index", "stats", "--index", shapes_index], capsys)
    assert code == 0 and stats["documents"] == 6 and stats["backend"] == "local"
    check(stats, STATS_LOCAL)
    import d2s_search

    with d2s_search.Index.open(shapes_index) as index:  # the Python API's stats are the command's
        assert index.stats() == stats


def test_the_checker_refuses_what_it_should():
    with pytest.raises(AssertionError, match="keys not pinned"):
        check({"found": 1, "surprise": 2}, {"found": int})
    with pytest.raises(AssertionError, match="keys missing"):
        check({}, {"found": int})
    with pytest.raises(AssertionError, match="is not int"):
        check({"found": True}, {"found": int})
    with pytest.raises(AssertionError, match="is not float"):
        check([{"term": "dog", "contribution": "1.0"}], [MATCH])
