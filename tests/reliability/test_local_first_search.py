"""What the first search after opening the local index checks: a dense search checks the
per-row arrays it reads and leaves the postings to the first search that scores them, which
still finds them damaged."""

from __future__ import annotations

import numpy as np

from d2s_search.backends.local import LocalBackend, cache, kernels
from tests.helpers import brute_force_dense, brute_force_sparse
from tests.reliability.local_index_fixtures import IDENTITY, synthetic_docs
from tests.reliability.test_local_index_exactness import assert_ranking, queries


def reopened(tmp_path, monkeypatch, docs) -> LocalBackend:
    monkeypatch.setattr(cache, "SHARD_ROWS", 8)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    backend.close()
    fresh = LocalBackend(tmp_path / "idx")
    fresh.open(IDENTITY, create=False)
    return fresh


def test_first_dense_search_leaves_the_postings_to_the_first_sparse_search(tmp_path, monkeypatch, capsys):
    docs = synthetic_docs(30, seed=8)
    backend = reopened(tmp_path, monkeypatch, docs)
    q = queries(2)[0]
    assert_ranking(backend.dense_search(q.dense, 5, explain=0), brute_force_dense(docs, q.dense), 5)
    shards = backend._search_state().shards
    assert len(shards) == 4
    assert all(s.rows_validated and not s.validated for s in shards)
    damaged = shards[1].arrays["csc_indices"].copy()
    damaged[:] = np.iinfo(damaged.dtype).max  # every posting points past the shard's rows
    shards[1].arrays["csc_indices"] = damaged
    assert_ranking(backend.sparse_search(q.full, 10, explain=0), brute_force_sparse(docs, q.full), 10)
    err = capsys.readouterr().err
    # postings the cache's stamp vouches for are not scanned again where the compiled code reads
    # them: it finds the bad ids as it reads them; else the check before the first sparse search does
    found = "postings point outside the shard" if kernels.postings_reads_checked() else "shard at row 8 is damaged"
    assert err.count("warning:") == 1 and found in err, err
    assert all(s.validated for s in backend._search_state().shards)
    backend.close()


def test_first_dense_search_checks_the_rows_it_reads(tmp_path, monkeypatch, capsys):
    docs = synthetic_docs(30, seed=9)
    backend = reopened(tmp_path, monkeypatch, docs)
    q = queries(3)[1]
    shard = backend._search_state().shards[2]
    shard.arrays["ids_offsets"] = shard.arrays["ids_offsets"][:-1]
    assert_ranking(backend.dense_search(q.dense, 5, explain=0), brute_force_dense(docs, q.dense), 5)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "shard at row 16 is damaged: ids offsets do not match" in err, err
    backend.close()
