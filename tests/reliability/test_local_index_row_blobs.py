"""A document's term ids in SQLite: 16 bits each while every id of the row fits, 32 bits
otherwise, the weights' length telling which; rows written with 32-bit ids (indexes made
before) read the same. Searches, ``get`` and `index check` against what was stored."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from d2s_search.backends.base import Document
from d2s_search.backends.local import LocalBackend, row_blobs
from tests.helpers import brute_force_sparse, run_cli_json
from tests.reliability.local_index_fixtures import IDENTITY, filled_index, synthetic_docs


def stored(path, doc_id: str) -> tuple[bytes, bytes]:
    db = sqlite3.connect(path / "index.sqlite")
    try:
        return db.execute("SELECT term_ids, weights FROM docs WHERE id = ?", (doc_id,)).fetchone()
    finally:
        db.close()


def ranked(hits) -> list[tuple[str, float]]:
    return [(h.id, round(h.score, 4)) for h in hits]


def test_ids_take_two_bytes_a_term_and_read_back_as_written(tmp_path):
    docs = synthetic_docs(40, seed=2)
    backend = filled_index(tmp_path / "idx", docs)
    for doc in docs[:5]:
        ids, weights = stored(tmp_path / "idx", doc.id)
        assert len(ids) == 2 * len(doc.sparse) and len(weights) == 4 * len(doc.sparse)
    for doc, back in zip(docs, backend.get([d.id for d in docs])):
        assert back.sparse == pytest.approx(doc.sparse, rel=1e-6)
    query = {"w1": 1.0, "w5": 0.5, "w9": 2.0}
    assert [h.id for h in backend.sparse_search(query, 10, explain=0)] == [i for i, _ in brute_force_sparse(docs, query)[:10]]
    backend.close()


def test_rows_with_32_bit_ids_read_the_same(tmp_path):
    """The rows of an index written before 16-bit ids (rewritten here with 32-bit blobs) give
    the same documents, hits and words as the 16-bit ones, and `index check` finds nothing."""
    docs = synthetic_docs(60, seed=4)
    backend = filled_index(tmp_path / "idx", docs)
    query = {"w2": 1.0, "w3": 0.7, "w11": 1.5}
    before = ranked(backend.sparse_search(query, 20))
    backend.close()
    db = sqlite3.connect(tmp_path / "idx" / "index.sqlite")
    for seq, blob in db.execute("SELECT seq, term_ids FROM docs").fetchall():
        wide = np.frombuffer(blob, "<u2").astype("<i4").tobytes()
        db.execute("UPDATE docs SET term_ids = ? WHERE seq = ?", (wide, seq))
    db.commit()
    db.close()
    for cached in (tmp_path / "idx" / "cache").iterdir():  # built again from the rewritten rows
        if cached.is_dir():
            for f in cached.iterdir():
                f.unlink()
            cached.rmdir()
        else:
            cached.unlink()
    again = LocalBackend(tmp_path / "idx")
    again.open(None, create=False)
    assert ranked(again.sparse_search(query, 20)) == before
    for doc, back in zip(docs, again.get([d.id for d in docs])):
        assert back.sparse == pytest.approx(doc.sparse, rel=1e-6)
    again.close()


def test_a_vocabulary_past_65536_terms_keeps_32_bit_ids_where_needed(tmp_path, capsys):
    """Rows whose ids all fit keep 16 bits even in a large vocabulary; a row holding an id of
    65,536 or more is stored in 32 bits; searches equal brute force over both kinds."""
    rng = np.random.default_rng(9)
    vocabulary = [f"t{i:05d}" for i in range(66_000)]
    docs = []
    for i in range(111):  # the first: ten words; then 110 of 600 new words each
        words = range(10) if i == 0 else range(600 * (i - 1) + 10, 600 * i + 10)
        docs.append(Document(id=f"{i:064x}", path=f"/p/{i}.jpg", size_bytes=1, width=1, height=1,
                             sparse={vocabulary[w % len(vocabulary)]: float(rng.uniform(0.1, 2.0)) for w in words},
                             dense=rng.normal(size=16).astype(np.float32)))
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs[:1])  # ids 1-10
    backend.upsert(docs[1:])  # ids up to 66,000
    widths = [len(stored(tmp_path / "idx", doc.id)[0]) // len(doc.sparse) for doc in (docs[0], docs[1], docs[-1])]
    assert widths == [2, 2, 4]
    for query_doc in (docs[3], docs[-1]):
        query = dict(list(query_doc.sparse.items())[:30])
        want = brute_force_sparse(docs, query)[:10]
        got = backend.sparse_search(query, 10, explain=0)
        assert [h.id for h in got] == [i for i, _ in want]
        np.testing.assert_allclose([h.score for h in got], [s for _, s in want], rtol=2e-3)
    assert backend.get([docs[-1].id])[0].sparse == pytest.approx(docs[-1].sparse, rel=1e-6)
    backend.close()
    code, report = run_cli_json(["index", "check", "--index", tmp_path / "idx"], capsys)
    assert code == 0 and not report["database"], report


@pytest.mark.parametrize("ids, weight_bytes, want", [
    (np.array([1, 2, 3], "<u2").tobytes(), 12, [1, 2, 3]),
    (np.array([1, 70_000], "<i4").tobytes(), 8, [1, 70_000]),
    (b"", 0, []),
    (b"\x01\x00\x02", 12, None),  # fits neither width
    (np.array([1, 2], "<u2").tobytes(), 12, None),
    (np.array([1, 2], "<i4").tobytes(), 6, None),  # weights of a length no float32 array has
    ("not bytes", 36, None),
])
def test_decoding_term_ids(ids, weight_bytes, want):
    got = row_blobs.decode_term_ids(ids, weight_bytes)
    assert (got is None and want is None) or got.tolist() == want


def test_encoding_picks_the_width():
    assert len(row_blobs.encode_term_ids(np.array([1, 65_535]))) == 4
    assert len(row_blobs.encode_term_ids(np.array([1, 65_536]))) == 8
    assert row_blobs.encode_term_ids(np.zeros(0, dtype=np.int64)) == b""
