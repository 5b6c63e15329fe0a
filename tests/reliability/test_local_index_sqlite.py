"""A damaged SQLite database gives one clear line (never a traceback) from every command,
and ingest refuses to write into it (PRAGMA quick_check) instead of exiting 0."""

from __future__ import annotations

import hashlib
import os

import pytest

from d2s_search.backends.local import LocalBackend
from d2s_search.errors import IndexStoreError
from tests.helpers import brute_force_sparse, run_cli, run_cli_json
from tests.reliability.local_index_fixtures import IDENTITY, filled_index, synthetic_docs


def damage_pages(db_path, first_fraction=0.3, last_fraction=0.8) -> None:
    """Overwrite the middle pages with garbage (page 1, the header, is kept)."""
    data = bytearray(db_path.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    pages = len(data) // page
    rng = __import__("random").Random(7)
    for p in range(max(1, int(pages * first_fraction)), int(pages * last_fraction)):
        data[p * page : (p + 1) * page] = bytes(rng.getrandbits(8) for _ in range(page))
    db_path.write_bytes(bytes(data))


# Enough documents that the middle pages damage_pages overwrites hold documents, not the
# tables' first pages, with pages of any size (16 KB: 46 pages, the tables' roots in the first 12).
DOCS = 1600


@pytest.fixture
def damaged_index(tmp_path):
    index = tmp_path / "idx"
    backend = filled_index(index, synthetic_docs(DOCS, seed=3))
    backend.close()  # the last connection checkpoints the WAL into index.sqlite
    assert not (index / "index.sqlite-wal").exists() or os.path.getsize(index / "index.sqlite-wal") == 0
    damage_pages(index / "index.sqlite")
    return index


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_command_says_one_line(damaged_index, capsys):
    for args in (["index", "stats", "--index", damaged_index], ["index", "check", "--index", damaged_index]):
        code, out, err = run_cli(args, capsys)
        assert code == 1, (args, out, err)
        assert "Traceback" not in err
    code, out, err = run_cli(["index", "stats", "--index", damaged_index], capsys)
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "damaged" in err
    assert "index check" in err  # says what to do


def test_ingest_refuses_to_write_into_a_damaged_database(damaged_index):
    before = sha(damaged_index / "index.sqlite")
    backend = LocalBackend(damaged_index)
    with pytest.raises(IndexStoreError, match="damaged") as caught:
        backend.open(IDENTITY, create=False)
        backend.upsert(synthetic_docs(3, seed=50))
    assert "\n" not in str(caught.value)
    backend.close()
    assert sha(damaged_index / "index.sqlite") == before


def test_search_on_a_damaged_database_is_one_error(damaged_index):
    backend = LocalBackend(damaged_index)
    with pytest.raises(IndexStoreError, match="damaged"):
        backend.open(None, create=False)
        backend.sparse_search({"w1": 1.0}, 5)
    backend.close()


def test_repair_rewrites_the_database_and_reports_what_is_lost(damaged_index, capsys):
    code, report = run_cli_json(["index", "check", "--index", damaged_index, "--repair"], capsys)
    assert code == 3 and report["repaired"] and "rewritten" in report["database_repair"]
    backend = LocalBackend(damaged_index)
    backend.open(None, create=False)
    kept = backend.count()
    assert 0 < kept < DOCS and kept == report["documents"]
    assert kept + len(report["lost_documents"]) == DOCS  # every document is kept or named as lost
    assert backend.sparse_search({"w1": 1.0}, 500)  # what is kept is searchable
    backend.close()
    code, report = run_cli_json(["index", "check", "--index", damaged_index], capsys)
    assert code == 0 and report["healthy"]
    backend = filled_index(damaged_index, synthetic_docs(3, seed=51))  # and writable again
    assert backend.count() == kept + 3


def test_not_a_database_at_all(tmp_path, capsys):
    index = tmp_path / "idx"
    index.mkdir()
    (index / "index.sqlite").write_bytes(b"this is not sqlite" * 100)
    code, _, err = run_cli(["index", "stats", "--index", index], capsys)
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err


def test_a_rewrite_keeps_the_copies_and_the_metadata(tmp_path):
    """What a repair rewrites from the readable pages includes the tables a first write makes:
    the further paths of documents and their metadata."""
    import dataclasses
    import sqlite3

    from d2s_search.backends.local import store
    from d2s_search.metadata import Metadata

    docs = synthetic_docs(20, seed=4)
    docs[3] = dataclasses.replace(docs[3], copies=("/elsewhere/copy.jpg",),
                                  metadata=Metadata(taken_at=1.5e9, camera="Pixel 7", location=(48.8, 2.3),
                                                    fields={"trip": "paris"}))
    backend = filled_index(tmp_path / "idx", docs)
    backend.declare_fields({"trip": "keyword"})
    backend.close()
    db = store.open_as_found(tmp_path / "idx" / "index.sqlite")
    copied, unreadable, lost = store.salvage(db, tmp_path / "rewritten.sqlite")
    db.close()
    assert (copied, unreadable, lost) == (20, [], [])
    new = sqlite3.connect(tmp_path / "rewritten.sqlite")
    assert new.execute("SELECT path, id FROM copies").fetchall() == [("/elsewhere/copy.jpg", docs[3].id)]
    assert new.execute("SELECT id, taken_at, camera, fields FROM metadata").fetchall() == [
        (docs[3].id, 1.5e9, "Pixel 7", '{"trip": "paris"}')]
    new.close()


def page_size(db_path) -> int:
    import sqlite3

    db = sqlite3.connect(db_path)
    try:
        return db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()


def test_a_new_database_has_larger_pages_and_an_older_one_keeps_its_own(tmp_path, monkeypatch):
    """A new index's database is made with store.PAGE_SIZE pages (set before WAL mode fixes
    them); one made with SQLite's default 4 KB pages keeps them, opens, takes appends and
    answers as before."""
    from d2s_search.backends.local import store

    query = {"w1": 1.0, "w2": 0.5, "w7": 2.0}
    docs = synthetic_docs(80, seed=5)
    new = filled_index(tmp_path / "new", docs)
    new.close()
    assert page_size(tmp_path / "new" / "index.sqlite") == store.PAGE_SIZE > 4096
    with monkeypatch.context() as patched:
        patched.setattr(store, "PAGE_SIZE", 4096)
        old = filled_index(tmp_path / "old", docs[:50])
        old.close()
    assert page_size(tmp_path / "old" / "index.sqlite") == 4096
    backend = LocalBackend(tmp_path / "old")
    backend.open(IDENTITY, create=False)
    backend.upsert(docs[50:])
    assert [h.id for h in backend.sparse_search(query, 20)] == [d for d, _ in brute_force_sparse(docs, query)[:20]]
    assert [d.id for d in backend.get([docs[3].id, docs[77].id])] == [docs[3].id, docs[77].id]
    assert backend._connect(False).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    backend.close()
    assert page_size(tmp_path / "old" / "index.sqlite") == 4096
