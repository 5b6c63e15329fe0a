"""A build writes the cache as it goes: each shard's files as soon as the shard is made (its
arrays then read back from them, so a build holds one shard in memory), a graph serialised
straight into its file. What it writes is what a build in memory would have saved, and a write
that fails midway leaves the index searchable from memory with one warning and no temp folder."""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np
import pytest

from d2s_search.backends.local import LocalBackend, graph
from d2s_search.backends.local import backend as backend_mod
from d2s_search.backends.local import cache as cache_mod
from tests.helpers import brute_force_dense, brute_force_sparse
from tests.reliability.local_index_fixtures import IDENTITY, state_dir, synthetic_docs

pytestmark = pytest.mark.skipif(not graph.available(), reason="faiss 1.11 or later builds the graphs")

QUERY = {"w1": 1.0, "w2": 0.5, "w7": 2.0}


def use_small_shards(monkeypatch) -> None:
    """Shards of 128 rows, graphs on any of them, the spanning graph from two full shards on."""
    monkeypatch.setattr(cache_mod, "SHARD_ROWS", 128)
    monkeypatch.setattr(backend_mod, "APPROXIMATE_DENSE_FROM", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_FROM_ROWS", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1.0)


@pytest.fixture
def small_shards(monkeypatch):
    use_small_shards(monkeypatch)


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_a_graph_written_to_its_file_holds_the_framed_serialisation(tmp_path):
    import faiss

    vectors = np.random.default_rng(4).standard_normal((700, 24)).astype(np.float32)
    index = faiss.IndexHNSWSQ(24, faiss.ScalarQuantizer.QT_8bit, graph.M, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    framed = graph._framed(faiss.serialize_index(index), 24)
    assert graph._write_framed(index, tmp_path / "g.npy") == 700
    written = graph._read_back(tmp_path / "g.npy", 700, 24)
    assert written.dtype == np.uint8 and np.array_equal(written, framed)
    where = graph.layout(written, 700, 24)
    assert (written.ctypes.data + where.codes) % 64 == 0  # the codes on a 64-byte boundary, as framed
    assert np.array_equal(np.load(tmp_path / "g.npy"), framed)  # a plain .npy file


def test_a_build_holds_large_arrays_as_mappings_of_what_it_wrote(tmp_path, monkeypatch, small_shards):
    monkeypatch.setattr(cache_mod, "MAPPED_FROM", 256)  # the vectors of 128 rows are 8 KB
    docs = synthetic_docs(300, seed=9)
    seen = []
    add = cache_mod.StateWriter.add

    def watched(self, j, shard, map_back=True):
        add(self, j, shard, map_back)
        if map_back:
            dense = shard.arrays["dense"]
            seen.append((j, dense.flags.writeable, isinstance(self._maps[(j, "dense")], mmap.mmap)))

    monkeypatch.setattr(cache_mod.StateWriter, "add", watched)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    hits = backend.dense_search(docs[3].dense, 10, explain=0)
    sparse = backend.sparse_search(QUERY, 300, explain=0)
    backend.close()
    assert seen == [(0, False, True), (1, False, True), (2, False, True)]  # read-only mappings, shard by shard
    assert [h.id for h in hits] == [d for d, _ in brute_force_dense(docs, docs[3].dense)[:10]]
    assert [h.id for h in sparse] == [d for d, _ in brute_force_sparse(docs, QUERY)]
    files = sorted(p.name for p in state_dir(tmp_path / "idx").iterdir())
    assert "shard-00000-hnsw.npy" in files and "shard-00002-hnsw.npy" in files  # spanning + the last shard's
    assert "shard-00001-hnsw.npy" not in files
    assert not [p for p in (tmp_path / "idx" / "cache").iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("fails", ["second shard", "graph file"])
def test_a_write_failing_midway_leaves_the_index_searchable_from_memory(tmp_path, monkeypatch, small_shards,
                                                                        capsys, fails):
    docs = synthetic_docs(300, seed=10)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    capsys.readouterr()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "shard file")

    if fails == "graph file":
        monkeypatch.setattr(graph, "_write_framed", no_space)
    else:
        write = cache_mod._write_array

        def second_shard_fails(path, array):
            if path.name.startswith("shard-00001-"):
                no_space()
            return write(path, array)

        monkeypatch.setattr(cache_mod, "_write_array", second_shard_fails)
    dense = backend.dense_search(docs[5].dense, 10, explain=0)
    sparse = backend.sparse_search(QUERY, 300, explain=0)
    backend.close()
    assert [h.id for h in dense] == [d for d, _ in brute_force_dense(docs, docs[5].dense)[:10]]
    assert [h.id for h in sparse] == [d for d, _ in brute_force_sparse(docs, QUERY)]
    (line,) = warnings_of(capsys.readouterr().err)
    assert line.startswith("warning: disk full: ") and "every document is stored" in line
    cache = tmp_path / "idx" / "cache"
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]  # nothing half written is left
    assert not (cache / "current").exists()

    monkeypatch.undo()  # space again; the same thresholds, so the rebuilt cache has the same plan
    use_small_shards(monkeypatch)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(None, create=False)
    assert [h.id for h in backend.dense_search(docs[5].dense, 10, explain=0)] == [h.id for h in dense]
    backend.close()
    assert (cache / "current").is_file()

