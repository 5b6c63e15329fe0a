"""One path is one document in the local index (the scenario: tests/one_path_one_document.py),
and what ingest does to the database for it: nothing at all for files that did not change."""

from __future__ import annotations

import sqlite3

from d2s_search.backends.local import LocalBackend
from tests.helpers import run_cli_json, write_image
from tests.one_path_one_document import check_one_path_one_document


def test_one_path_is_one_document(tmp_path, tiny_blip_bundle, capsys):
    index = tmp_path / "idx"

    def open_store():
        store = LocalBackend(index)
        store.open(None, create=False)
        return store

    check_one_path_one_document(tmp_path, tiny_blip_bundle, ["--index", index], open_store, capsys)


def _generation(index) -> str:
    with sqlite3.connect(index / "index.sqlite") as db:
        return db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()[0]


def test_unchanged_files_are_skipped_without_a_write(tmp_path, tiny_blip_bundle, capsys):
    folder = tmp_path / "photos"
    for i in range(5):
        write_image(folder / f"{i}.jpg", 40 + i)
    (folder / "copy.jpg").write_bytes((folder / "0.jpg").read_bytes())
    index = tmp_path / "idx"
    args = ["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index]
    assert run_cli_json(args, capsys)[0] == 0
    before = _generation(index)
    code, report = run_cli_json(args, capsys)
    assert code == 0 and report["already_stored"] == 6 and report["copies"] == report["moved"] == 0
    assert _generation(index) == before  # no transaction: the ids and their paths were only read


def test_an_index_made_before_copies_gains_them_on_its_next_ingest(
    tmp_path, tiny_blip_bundle, capsys
):
    folder = tmp_path / "photos"
    write_image(folder / "a.jpg", 50)
    index = tmp_path / "idx"
    assert (
        run_cli_json(["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)[0]
        == 0
    )
    with sqlite3.connect(index / "index.sqlite") as db:  # as an older version left it
        db.execute("DROP TABLE copies")
        db.execute("DROP INDEX docs_path")
    store = LocalBackend(index)
    store.open(None, create=False)
    try:
        assert (
            store.paths_of(["x"]) == {} and len(store.document_paths()) == 1
        )  # read as having none
    finally:
        store.close()
    (folder / "b.jpg").write_bytes((folder / "a.jpg").read_bytes())
    code, report = run_cli_json(
        ["ingest", folder, "--bundle", tiny_blip_bundle, "--index", index], capsys
    )
    assert code == 0 and report["copies"] == 1
    store = LocalBackend(index)
    store.open(None, create=False)
    try:
        assert [p for _, p in store.document_paths()] == [
            str(folder / "a.jpg"),
            str(folder / "b.jpg"),
        ]
    finally:
        store.close()
