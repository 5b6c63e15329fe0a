"""A search sees every commit made since the last one, by any connection, and asks SQLite only
when the WAL-index header says something may have changed (``store.CommitSignal``)."""

from __future__ import annotations

import os
import sqlite3

import pytest

from d2s_search.backends.local import LocalBackend, store
from tests.reliability.local_index_fixtures import IDENTITY, filled_index, synthetic_docs


def wal_db(path):
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    return db


def test_the_header_changes_with_every_commit_of_any_connection_and_only_then(tmp_path):
    path = tmp_path / "a.sqlite"
    writer, reader = wal_db(path), wal_db(path)
    signal = store.CommitSignal(path)
    reader.execute("SELECT COUNT(*) FROM t").fetchone()
    first = signal.read()
    assert first is not None and len(first) == store.CommitSignal.HEADER
    reader.execute("SELECT COUNT(*) FROM t").fetchone()  # reading commits nothing
    assert signal.read() == first
    seen = {first}
    for i in range(5):
        writer.execute("INSERT INTO t VALUES (?)", (i,))
        header = signal.read()
        assert header is not None and header not in seen  # a new header, never an old one back
        seen.add(header)
    writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL emptied: the next commit starts it over
    before = signal.read()
    writer.execute("INSERT INTO t VALUES (9)")
    assert signal.read() not in (before, None)
    signal.close()
    writer.close()
    reader.close()


def test_the_mapped_header_reads_as_pread_does(tmp_path):
    """Once its connection holds the WAL index open, the header is read through a map: every
    commit still seen, and copies that differ (mid-write) still no answer."""
    path = tmp_path / "a.sqlite"
    writer, reader = wal_db(path), wal_db(path)
    reader.execute("SELECT COUNT(*) FROM t").fetchone()
    plain, mapped = store.CommitSignal(path), store.CommitSignal(path)
    mapped.map_when_held()
    assert mapped.read() == plain.read() is not None and mapped._map is not None
    for i in range(3):
        writer.execute("INSERT INTO t VALUES (?)", (i,))
        assert mapped.read() == plain.read() is not None
    with open(f"{path}-shm", "r+b") as fh:  # the second copy rewritten first, as SQLite does
        fh.seek(store.CommitSignal.HEADER + 8)
        fh.write(b"\xff\xff\xff\xff")
    assert mapped.read() is None and plain.read() is None
    mapped.close()
    assert mapped._map is None and mapped._fd is None
    plain.close()
    writer.close()
    reader.close()


def test_a_search_maps_the_header_once_its_connection_has_read(tmp_path):
    backend = filled_index(tmp_path / "idx", synthetic_docs(30, seed=1))
    backend.sparse_search({"w1": 1.0}, 5, explain=0)
    backend.sparse_search({"w1": 1.0}, 5, explain=0)
    assert backend._commits._map is not None
    backend.close()


def test_no_answer_where_the_header_cannot_be_trusted(tmp_path):
    missing = store.CommitSignal(tmp_path / "none.sqlite")
    assert missing.read() is None  # no -shm (yet): ask SQLite
    torn = tmp_path / "torn.sqlite-shm"
    torn.write_bytes(bytes(48) + b"\x01" + bytes(47))  # the two copies differ: mid-write
    assert store.CommitSignal(tmp_path / "torn.sqlite").read() is None
    short = tmp_path / "short.sqlite-shm"
    short.write_bytes(bytes(60))
    assert store.CommitSignal(tmp_path / "short.sqlite").read() is None
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.sqlite-shm")  # never opened for reading: it would block
        signal = store.CommitSignal(tmp_path / "fifo.sqlite")
        assert signal.read() is None and signal.read() is None


def data_version_calls(backend: LocalBackend) -> list[str]:
    statements: list[str] = []
    backend._connect(False).set_trace_callback(statements.append)
    return statements


def test_a_search_after_no_commit_asks_sqlite_nothing(tmp_path):
    backend = filled_index(tmp_path / "idx", synthetic_docs(30, seed=1))
    query = {"w1": 1.0, "w2": 0.5, "w3": 0.7}
    backend.sparse_search(query, 5, explain=0)  # structures loaded, the header seen
    statements = data_version_calls(backend)
    backend.sparse_search(query, 5, explain=0)
    backend.sparse_search(query, 5, explain=0)
    assert statements == []  # no PRAGMA data_version, nothing at all
    backend.upsert(synthetic_docs(2, seed=2, start=30))  # this connection's own commit
    backend.sparse_search(query, 5, explain=0)
    assert any("data_version" in s for s in statements)
    assert backend.count() == 32
    backend.close()


@pytest.mark.parametrize("searches_between", [0, 1, 3])
def test_documents_another_connection_commits_are_found_by_the_next_search(tmp_path, searches_between):
    docs = synthetic_docs(40, seed=4)
    index = tmp_path / "idx"
    searcher = filled_index(index, docs[:20])
    writer = LocalBackend(index)
    writer.open(IDENTITY, create=False)
    query = {t: 1.0 for t in docs[25].sparse}  # the words of a document not stored yet
    for _ in range(searches_between):
        assert docs[25].id not in [h.id for h in searcher.sparse_search(query, 40, explain=0)]
    for start in (20, 30):
        writer.upsert(docs[start : start + 10])
        found = [h.id for h in searcher.sparse_search(query, 40, explain=0)]
        assert docs[25].id in found
        assert len(searcher._search_state().shards[0].arrays["seqs"]) == start + 10
    writer.delete([docs[25].id])
    assert docs[25].id not in [h.id for h in searcher.sparse_search(query, 40, explain=0)]
    writer.close()
    searcher.close()
    assert searcher._commits is None  # closed with its connection
