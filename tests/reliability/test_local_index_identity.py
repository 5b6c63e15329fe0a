"""The identity of a local index (its id, the bundle that filled it, the size of its dense
vectors) outlives damage to the ``meta`` table: `index check --repair` restores it from what
survives; an index whose bundle nobody records any more is never tied to a bundle nobody
named; values no version writes are reported and mended, never passed as healthy."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from d2s_search import settings
from d2s_search.backends.local import LocalBackend
from d2s_search.bundle import Bundle
from tests.helpers import brute_force_sparse, run_cli, run_cli_json, write_image
from tests.reliability.local_index_fixtures import (
    IDENTITY,
    filled_index,
    meta_rows,
    overwrite_table_pages,
    synthetic_docs,
)

IDENTITY_KEYS = ("index_id", "bundle_fingerprint", "bundle_model", "bundle_path", "dense_dim")
QUERY = {"w1": 1.0, "w4": 0.5, "w9": 2.0}


@pytest.fixture
def filled(tmp_path, tiny_blip_bundle, tiny_clip_bundle, image_folder, capsys):
    """40 photos ingested with tiny-blip (16-dimensional vectors); tiny-clip (24) is the
    bundle exported last, the default of a command run without --bundle."""
    index = tmp_path / "W"
    code, report = run_cli_json(
        ["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys
    )
    assert code == 0 and report["stored"] == 40
    settings.remember_bundle(Path(tiny_clip_bundle))
    return index, meta_rows(index)


def new_photo(tmp_path) -> Path:
    return write_image(tmp_path / "new" / "one.jpg", seed=4242)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def searchable_by_dense(index: Path, capsys) -> tuple[int, str]:
    """How many documents a dense query reaches (every stored vector is scored), and its stderr."""
    code, out, err = run_cli(
        ["query", "a photo", "--index", index, "--mode", "dense", "-k", "100", "--json"], capsys
    )
    assert code == 0, err
    return len(json.loads(out)["results"]), err


def test_repair_restores_the_identity_a_damaged_meta_table_held(
    filled, tmp_path, tiny_blip_bundle, capsys
):
    index, before = filled
    overwrite_table_pages(index / "index.sqlite", "meta")
    code, report = run_cli_json(["index", "check", "--index", index, "--repair"], capsys)
    assert (
        code == 0
        and report["repaired"]
        and report["lost_documents"] == []
        and not report["unresolved"]
    ), report
    after = meta_rows(index)
    assert {k: after.get(k) for k in IDENTITY_KEYS} == {k: before[k] for k in IDENTITY_KEYS}
    # A plain ingest (no --bundle) goes on with the bundle that filled the index, not the last exported.
    code, report = run_cli_json(["ingest", new_photo(tmp_path), "--index", index], capsys)
    assert code == 0 and report["stored"] == 1
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert (
        stats["bundle_fingerprint"] == Bundle.load(tiny_blip_bundle).fingerprint
        and stats["dense_dim"] == 16
    )
    assert stats["documents"] == 41
    reached, err = searchable_by_dense(index, capsys)
    assert reached == 41 and "damaged" not in err
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 0 and report["healthy"], report


def test_an_index_whose_bundle_nobody_records_refuses_a_bundle_nobody_named(
    filled, tmp_path, tiny_blip_bundle, tiny_clip_bundle, capsys
):
    index, before = filled
    manifest = json.loads((index / "d2s-index.json").read_text())
    manifest.pop("bundle", None)  # as written before the manifest kept a copy of the bundle
    (index / "d2s-index.json").write_text(json.dumps(manifest))
    overwrite_table_pages(index / "index.sqlite", "meta")

    code, report = run_cli_json(["index", "check", "--index", index, "--repair"], capsys)
    assert code == 3 and report["repaired"] and report["lost_documents"] == [], report
    assert len(report["unresolved"]) == 1 and "--bundle" in report["unresolved"][0]
    assert "16 dimensions" in report["unresolved"][0]
    repaired = meta_rows(index)
    assert repaired["index_id"] == before["index_id"] and repaired["dense_dim"] == "16"
    stored = sha(index / "index.sqlite")

    # Without --bundle: refused in one line, nothing written (not tied to the bundle exported last).
    code, out, err = run_cli(["ingest", new_photo(tmp_path), "--index", index], capsys)
    assert code == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "--bundle" in err and "Traceback" not in err
    assert sha(index / "index.sqlite") == stored and meta_rows(index) == repaired
    # A named bundle whose vectors are of another size than the stored ones: refused too.
    code, out, err = run_cli(
        ["ingest", new_photo(tmp_path), "--index", index, "--bundle", tiny_clip_bundle], capsys
    )
    assert code == 1 and "16" in err and "24" in err and len(err.strip().splitlines()) == 1, err
    assert sha(index / "index.sqlite") == stored and meta_rows(index) == repaired
    # The bundle that filled it: accepted, recorded, and every old document still searchable.
    code, report = run_cli_json(
        ["ingest", new_photo(tmp_path), "--index", index, "--bundle", tiny_blip_bundle], capsys
    )
    assert code == 0 and report["stored"] == 1
    assert meta_rows(index)["bundle_fingerprint"] == Bundle.load(tiny_blip_bundle).fingerprint
    reached, err = searchable_by_dense(index, capsys)  # no --bundle any more: the recorded one
    assert reached == 41 and "damaged" not in err
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 0 and report["healthy"], report


def set_meta(index: Path, key: str, value: str) -> None:
    db = sqlite3.connect(index / "index.sqlite")
    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
    db.commit()
    db.close()


@pytest.mark.parametrize(
    "key, value",
    [
        ("dense_dim", "x"),
        ("dense_dim", "0"),
        ("generation", "x"),
        ("mutations", "-1"),
        ("index_id", "not-an-id"),
        ("created_at", "yesterday"),
        ("format", "\x1b]0;x\x07"),
        ("bundle_fingerprint", ""),
    ],
)
def test_an_unusable_meta_value_is_reported_and_mended(tmp_path, capsys, key, value):
    index = tmp_path / "idx"
    docs = synthetic_docs(30, seed=5)
    backend = filled_index(index, docs)
    backend.sparse_search(QUERY, 5)  # the cache is written
    backend.close()
    before = meta_rows(index)
    set_meta(index, key, value)

    code, out, err = run_cli(["index", "stats", "--index", index], capsys)
    assert code == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "index check" in err and "--repair" in err
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 1 and not report["healthy"] and any(key in p for p in report["database"]), report

    code, report = run_cli_json(["index", "check", "--index", index, "--repair"], capsys)
    assert code == 0 and report["repaired"] and report["identity_repair"], report
    mended = meta_rows(index)
    for kept in ("index_id", "bundle_fingerprint", "dense_dim"):
        assert mended[kept] == before[kept], kept
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 0 and report["healthy"], report
    backend = LocalBackend(index)
    backend.open(None, create=False)
    assert [h.id for h in backend.sparse_search(QUERY, 100)] == [
        i for i, _ in brute_force_sparse(docs, QUERY)
    ]
    backend.close()


def test_a_meta_value_nothing_restores_is_named_with_a_nonzero_exit(tmp_path, capsys):
    index = tmp_path / "idx"
    backend = LocalBackend(index)
    backend.open(IDENTITY)  # a bundle recorded, no document stored yet, no cache
    backend.close()
    manifest = json.loads((index / "d2s-index.json").read_text())
    manifest.pop("bundle", None)
    (index / "d2s-index.json").write_text(json.dumps(manifest))
    set_meta(index, "dense_dim", "x")

    code, out, err = run_cli(["index", "check", "--index", index, "--repair"], capsys)
    assert code == 3 and "lost:     no document" in out, out
    assert "unknown:" in out and "--bundle" in out  # says what it could not restore, and what to do
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 1 and any("bundle" in p for p in report["database"]), report
    backend = LocalBackend(index)
    backend.open(IDENTITY)  # the bundle named again
    backend.prepare_search()
    backend.close()
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 0 and report["healthy"], report
