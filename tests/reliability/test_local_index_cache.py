"""The search cache is derived, untrusted data: a cache of another index, a damaged one or
one with ids out of range is rebuilt from SQLite with one warning line (never a traceback,
never a crash, never a wrong answer); temp files of dead writers are removed."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from d2s_search.backends.local import LocalBackend
from tests.helpers import brute_force_dense, brute_force_sparse, run_cli, run_cli_json
from tests.reliability.local_index_fixtures import (
    IDENTITY,
    filled_index,
    rewrite_array,
    search_in_subprocess,
    state_dir,
    synthetic_docs,
    warning_lines,
)

QUERY = {"w1": 1.0, "w2": 0.5, "w3": 0.25, "w7": 2.0}


@pytest.fixture
def index(tmp_path):
    docs = synthetic_docs(30, seed=1)
    backend = filled_index(tmp_path / "idx", docs)
    backend.sparse_search(QUERY, 5)  # writes the cache
    backend.close()
    return tmp_path / "idx", docs


def expected(docs, k=10):
    return [doc_id for doc_id, _ in brute_force_sparse(docs, QUERY)[:k]]


def test_refill_after_deleting_the_database_never_reuses_the_old_cache(tmp_path):
    path = tmp_path / "idx"
    old = filled_index(path, synthetic_docs(120, seed=1))
    old.sparse_search(QUERY, 5)
    old.close()
    for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
        (path / name).unlink(missing_ok=True)
    new_docs = synthetic_docs(12, seed=2)  # fewer documents, other ids: the old cache fits nothing
    fresh = filled_index(path, new_docs)
    hits = fresh.sparse_search(QUERY, 200)
    assert [h.id for h in hits] == expected(new_docs, 200)
    assert all(h.path.startswith("/photos/2/") for h in hits)  # no phantom of the old index
    assert fresh.count() == 12


def damage_truncate(index):
    f = next(state_dir(index).glob("shard-00000-csc_indices.npy"))
    f.write_bytes(f.read_bytes()[:100])


def damage_zero(index):
    f = next(state_dir(index).glob("shard-00000-csr_data.npy"))
    f.write_bytes(b"\0" * f.stat().st_size)


def damage_empty_pointer(index):
    (index / "cache" / "current").write_bytes(b"")


def damage_flip_small(index):
    f = next(state_dir(index).glob("shard-00000-csc_indptr.npy"))
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))


def damage_header(index):
    (state_dir(index) / "header.json").write_bytes(b'{"format": "d2s-local-cache/3", "shards": [}')


def damage_pointer_is_a_folder(index):
    (index / "cache" / "current").unlink()
    (index / "cache" / "current").mkdir()


def damage_state_is_gone(index):
    shutil.rmtree(state_dir(index))


def damage_ids_out_of_range(index):
    """Checksums forged to match: only the bounds check stands between this and a segfault."""
    f = state_dir(index) / "shard-00000-csc_indices.npy"
    bad = np.load(f).copy()
    bad[len(bad) // 2] = np.iinfo(bad.dtype).max  # 16-bit in-shard ids: 65,535 rows past this small shard
    bad[0] = -5 if bad.dtype.kind == "i" else np.iinfo(bad.dtype).max - 1
    rewrite_array(index, "shard-00000-csc_indices.npy", bad)


def damage_pointers_out_of_range(index):
    f = state_dir(index) / "shard-00000-csc_indptr.npy"
    bad = np.load(f).copy()
    bad[3] = 2**31 - 1
    rewrite_array(index, "shard-00000-csc_indptr.npy", bad)


def damage_string_offsets(index):
    f = state_dir(index) / "shard-00000-paths_offsets.npy"
    bad = np.load(f).copy()
    bad[5] = 10**12
    rewrite_array(index, "shard-00000-paths_offsets.npy", bad)


def damage_term_ids_widened(index):
    """The postings by document with 32-bit term ids where the shard's columns fit in 16 (the
    values themselves in range, checksums forged): not the width the shard calls for."""
    f = state_dir(index) / "shard-00000-csr_indices.npy"
    ids = np.load(f)
    assert ids.dtype == np.uint16
    rewrite_array(index, f.name, ids.astype(np.int32))


DAMAGES = [damage_truncate, damage_zero, damage_empty_pointer, damage_flip_small, damage_header,
           damage_pointer_is_a_folder, damage_state_is_gone, damage_ids_out_of_range,
           damage_pointers_out_of_range, damage_string_offsets, damage_term_ids_widened]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.removeprefix("damage_"))
def test_damaged_cache_is_rebuilt_with_one_warning(index, damage):
    path, docs = index
    damage(path)
    code, hits, err = search_in_subprocess(path, QUERY)
    assert code == 0, err
    assert "Traceback" not in err
    assert [h[0] for h in hits] == expected(docs)
    assert len(warning_lines(err)) == 1, err
    # The rebuilt cache is sound: the next process uses it without a word.
    code, hits, err = search_in_subprocess(path, QUERY)
    assert code == 0 and not warning_lines(err) and [h[0] for h in hits] == expected(docs), err


def test_postings_the_stamp_vouches_for_are_not_scanned_again(index, monkeypatch):
    """The ids of postings unchanged since written (the cache's stamp vouches: a build checked
    them) are not scanned again where every read of them checks each id (the compiled code);
    a file written since (checksums forged) is, and so is every file where the numpy path reads."""
    from d2s_search.backends.local import cache, kernels

    path, docs = index
    scanned = []
    real = cache.check_postings
    monkeypatch.setattr(cache, "check_postings", lambda *a: scanned.append(a[4]) or real(*a))

    def first_search() -> list[bool]:
        scanned.clear()
        backend = LocalBackend(path)
        backend.open(None, create=False)
        assert [h.id for h in backend.sparse_search(QUERY, 10, explain=0)] == expected(docs)
        backend.close()
        return list(scanned)

    compiled = kernels.postings_reads_checked()
    assert first_search() == [not compiled] * 2
    monkeypatch.setattr(kernels, "_c_query", None)  # a read that would not check: scanned
    assert first_search() == [True, True]
    monkeypatch.undo()
    monkeypatch.setattr(cache, "check_postings", lambda *a: scanned.append(a[4]) or real(*a))
    f = state_dir(path) / "shard-00000-csc_indices.npy"
    rewrite_array(path, f.name, np.load(f).copy())  # the same ids, a new file
    assert first_search() == [True, True]


def test_the_numpy_path_checks_the_ids_it_hands_to_scipy():
    """scipy's csc_matvec writes where an id says: the numpy path checks each list it hands over."""
    from d2s_search.backends.local import kernels

    indptr = np.array([0, 2, 3], dtype=np.int32)
    indices = np.array([0, 4, 1], dtype=np.uint16)  # 4 is past the shard's 3 rows
    data = kernels.encode_weights(np.ones(3, np.float32))
    out = np.zeros(3, np.float32)
    kernels.accumulate(indptr, indices, data, 3, np.array([1]), np.array([2.0], np.float32), out, use_c=False)
    assert out.tolist() == [0.0, 2.0, 0.0]
    with pytest.raises(kernels.DamagedArrays, match="outside the shard"):
        kernels.accumulate(indptr, indices, data, 3, np.array([0]), np.array([1.0], np.float32), out, use_c=False)


def test_16_bit_term_ids_in_a_shard_of_a_wider_vocabulary_are_damage(tmp_path):
    """A shard whose columns need 32-bit term ids, its postings by document rewritten in 16
    bits (checksums forged): rebuilt with one warning, the answers those of brute force."""
    from d2s_search.backends.base import Document

    wide = Document(id="f" * 64, path="/photos/wide.jpg", size_bytes=1, width=1, height=1,
                    sparse={f"rare{i}": 0.01 for i in range(70_000)}, dense=np.zeros(16, dtype=np.float32))
    docs = synthetic_docs(30, seed=1)
    backend = filled_index(tmp_path / "idx", [wide, *docs])
    backend.sparse_search(QUERY, 5)
    backend.close()
    f = state_dir(tmp_path / "idx") / "shard-00000-csr_indices.npy"
    ids = np.load(f)
    assert ids.dtype == np.int32 and int(ids.max()) >= 1 << 16
    rewrite_array(tmp_path / "idx", f.name, ids.astype(np.uint16))
    for warnings in (1, 0):  # rebuilt once, then used as it is
        code, hits, err = search_in_subprocess(tmp_path / "idx", QUERY)
        assert code == 0 and "Traceback" not in err, err
        assert [h[0] for h in hits] == expected(docs)
        assert len(warning_lines(err)) == warnings, err
    assert np.load(state_dir(tmp_path / "idx") / f.name).dtype == np.int32  # the rebuilt state's


def test_cache_folder_that_is_a_file_keeps_searching_in_memory(index):
    path, docs = index
    shutil.rmtree(path / "cache")
    (path / "cache").write_text("not a folder")
    code, hits, err = search_in_subprocess(path, QUERY)
    assert code == 0 and [h[0] for h in hits] == expected(docs), err
    assert len(warning_lines(err)) == 1 and "in memory" in err


def test_out_of_range_ids_in_sqlite_are_left_out_not_crashed_on(index, capsys):
    path, docs = index
    import sqlite3

    db = sqlite3.connect(path / "index.sqlite")
    victims = [docs[4].id, docs[9].id, docs[11].id]
    db.execute("UPDATE docs SET term_ids = ? WHERE id = ?", (np.array([1, 2**31 - 1], "<i4").tobytes(), victims[0]))
    db.execute("UPDATE docs SET term_ids = ? WHERE id = ?", (np.array([-7], "<i4").tobytes(), victims[1]))
    db.execute("UPDATE docs SET dense = ? WHERE id = ?", (b"\x01\x02\x03", victims[2]))
    db.commit()
    db.close()
    shutil.rmtree(path / "cache")  # force a build from SQLite
    code, hits, err = search_in_subprocess(path, QUERY, k=100)
    assert code == 0, err
    good = [d for d in docs if d.id not in victims]
    assert [h[0] for h in hits] == expected(good, 100)
    assert len(warning_lines(err)) == 1 and "3 document(s)" in err
    backend = LocalBackend(path)
    backend.open(None, create=False)
    (doc,) = backend.get([victims[0]])  # readable, the damaged term left out
    assert len(doc.sparse) == 1  # term id 1 kept, 2**31-1 left out
    backend.close()
    code, report = run_cli_json(["index", "check", "--index", path, "--repair"], capsys)
    assert code == 3 and report["repaired"] and len(report["lost_documents"]) == 3  # 3: partial


def test_leftover_temp_files_of_dead_writers_are_removed(index):
    path, _ = index
    dead = 2**22 + 12345  # above the default pid_max: no such process
    while True:
        try:
            os.kill(dead, 0)
            dead += 1
        except ProcessLookupError:
            break
        except PermissionError:
            dead += 1
    (path / "cache" / f".tmp-{dead}-abcd1234").mkdir()
    (path / "cache" / f".tmp-{dead}-abcd1234" / "shard-00000-seqs.npy").write_bytes(b"half")
    (path / f".tmp-{dead}-ffff0000-d2s-index.json").write_bytes(b"{")
    alive = path / "cache" / f".tmp-{os.getppid()}-00000000"  # a live writer's temp is left alone
    alive.mkdir()
    backend = LocalBackend(path)
    backend.open(None, create=False)
    backend.close()
    assert not (path / "cache" / f".tmp-{dead}-abcd1234").exists()
    assert not (path / f".tmp-{dead}-ffff0000-d2s-index.json").exists()
    assert alive.is_dir()


def test_a_temp_folder_this_process_is_writing_is_not_a_leftover_to_its_other_writers(index):
    """Two handles of one index in one process (a watcher's thread and a search, say): one's
    open must not remove the cache the other is writing; once written, a name of this process
    left behind is a leftover again."""
    from d2s_search.backends.local import store

    path, docs = index
    busy = path / "cache" / f".tmp-{os.getpid()}-0000beef"
    with store.writing(busy.name):
        busy.mkdir()
        (busy / "shard-00000-seqs.npy").write_bytes(b"being written")
        other = LocalBackend(path)
        other.open(None, create=False)
        assert [h.id for h in other.sparse_search(QUERY, 10, explain=0)] == expected(docs)
        other.close()
        assert (busy / "shard-00000-seqs.npy").read_bytes() == b"being written"
    LocalBackend(path).open(None, create=False)
    assert not busy.exists()


def test_index_check_reports_and_repairs_a_damaged_cache(index, capsys):
    path, docs = index
    code, report = run_cli_json(["index", "check", "--index", path], capsys)
    assert code == 0 and report["healthy"], report
    f = state_dir(path) / "shard-00000-csc_data.npy"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x55  # a weight changed: only the full checksum sees it
    f.write_bytes(bytes(data))
    code, out, err = run_cli(["index", "check", "--index", path], capsys)
    assert code == 1 and "checksum" in out and "Traceback" not in err
    code, report = run_cli_json(["index", "check", "--index", path, "--repair"], capsys)
    assert code == 0 and report["repaired"] and report["lost_documents"] == [] and report["documents"] == 30
    code, report = run_cli_json(["index", "check", "--index", path], capsys)
    assert code == 0 and report["healthy"], report
    code, hits, err = search_in_subprocess(path, QUERY)
    assert [h[0] for h in hits] == expected(docs) and not warning_lines(err)


def test_a_cache_of_an_older_format_is_announced_before_it_is_rebuilt(index, monkeypatch, capsys):
    """A cache written by an older version (format 7: 32-bit term ids in the postings by
    document) is rebuilt, which takes minutes at a million documents: the one warning line
    comes before that work, not after it; the new state holds 16-bit term ids."""
    import zlib

    from d2s_search.backends.local import cache as cache_mod

    path, docs = index
    folder = state_dir(path)
    ids = folder / "shard-00000-csr_indices.npy"
    rewrite_array(path, ids.name, np.load(ids).astype(np.int32))  # as format 7 wrote them
    header = json.loads((folder / "header.json").read_bytes())
    header["format"] = "d2s-local-cache/7"
    body = json.dumps(header).encode()
    (folder / "header.json").write_bytes(body)
    (path / "cache" / "current").write_bytes(f"{folder.name} {zlib.crc32(body)}\n".encode())
    said_before_building = []
    build_shard = cache_mod.build_shard

    def watched(*args, **kwargs):
        said_before_building.append(capsys.readouterr().err)
        return build_shard(*args, **kwargs)

    monkeypatch.setattr(cache_mod, "build_shard", watched)
    backend = LocalBackend(path)
    backend.open(None, create=False)
    hits = backend.sparse_search(QUERY, 10, explain=0)
    backend.close()
    assert [h.id for h in hits] == expected(docs)
    assert said_before_building and warning_lines(said_before_building[0]) == [
        f"warning: search cache of {path} unusable (the cache was written in another format): "
        "rebuilding it from the database"
    ]
    assert not warning_lines(capsys.readouterr().err)  # and nothing more after it
    rebuilt = state_dir(path)
    assert rebuilt != folder and json.loads((rebuilt / "header.json").read_bytes())["format"] == cache_mod.CACHE_FORMAT
    assert np.load(rebuilt / ids.name).dtype == np.uint16


def test_identity_and_generation_tie_the_cache_to_its_database(index):
    path, _ = index
    backend = LocalBackend(path)
    backend.open(IDENTITY, create=False)
    index_id, generation = backend.generation()
    header = json.loads((state_dir(path) / "header.json").read_bytes())
    assert (header["index_id"], header["generation"]) == (index_id, generation)
    backend.upsert(synthetic_docs(2, seed=9))
    assert backend.generation() == (index_id, generation + 1)
    assert backend.delete([synthetic_docs(1, seed=9)[0].id]) == 1
    assert backend.generation() == (index_id, generation + 2)
    backend.close()


# -- the dense graph (HNSW, above APPROXIMATE_DENSE_FROM): untrusted bytes handed to faiss ----

DENSE_SCRIPT = """
import json, sys
import numpy as np
from d2s_search.backends.local import LocalBackend
from d2s_search.backends.local import backend as backend_mod
backend_mod.APPROXIMATE_DENSE_FROM = 0
backend_mod.GRAPH_FROM_ROWS = 0  # graphs on shards of any size
backend_mod.GRAPH_K_SHARE = 1.0  # the graph, not a scan, for k=10 on 300 rows
backend = LocalBackend(sys.argv[1])
backend.open(None, create=False)
hits = backend.dense_search(np.asarray(json.loads(sys.argv[2]), dtype=np.float32), 10, explain=0)
print(json.dumps([h.id for h in hits]))
"""


def dense_in_subprocess(path, vector) -> tuple[int, list, str]:
    """A dense search through the graph in a fresh process (a segfault fails the test only)."""
    import subprocess
    import sys

    from tests.reliability.local_index_fixtures import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith("D2S_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", DENSE_SCRIPT, str(path), json.dumps(vector.tolist())],
                          capture_output=True, text=True, env=env, timeout=120)
    return proc.returncode, json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else [], proc.stderr


@pytest.fixture
def graph_index(tmp_path, monkeypatch):
    from d2s_search.backends.local import backend as backend_mod

    monkeypatch.setattr(backend_mod, "APPROXIMATE_DENSE_FROM", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_FROM_ROWS", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1.0)
    docs = synthetic_docs(300, seed=3)
    backend = filled_index(tmp_path / "idx", docs)
    backend.dense_search(docs[0].dense, 5)  # writes the cache, with the graph
    backend.close()
    assert (state_dir(tmp_path / "idx") / "shard-00000-hnsw.npy").is_file()
    return tmp_path / "idx", docs


def graph_parts(path):
    from d2s_search.backends.local import graph

    blob = np.load(state_dir(path) / "shard-00000-hnsw.npy").copy()
    return blob, graph.layout(blob, 300, 16)


def damage_graph_neighbour_out_of_range(path):
    blob, where = graph_parts(path)
    start, count = where.neighbors
    blob[start + 4 * (count // 2) : start + 4 * (count // 2) + 4] = np.frombuffer(np.int32(10**6).tobytes(), np.uint8)
    rewrite_array(path, "shard-00000-hnsw.npy", blob)


def damage_graph_length_field(path):
    blob, where = graph_parts(path)
    blob[where.levels[0] - 8 : where.levels[0]] = np.frombuffer(np.uint64(2**40).tobytes(), np.uint8)
    rewrite_array(path, "shard-00000-hnsw.npy", blob)


def damage_graph_entry_point(path):
    blob, where = graph_parts(path)
    at = where.neighbors[0] + 4 * where.neighbors[1]  # entry_point follows the neighbour lists
    blob[at : at + 4] = np.frombuffer(np.int32(-7).tobytes(), np.uint8)
    rewrite_array(path, "shard-00000-hnsw.npy", blob)


def damage_graph_upper_layer_link(path):
    """A node on the bottom layer only, linked from layer 1: faiss would read past its lists."""
    blob, where = graph_parts(path)
    levels = blob[where.levels[0] : where.levels[0] + 4 * where.levels[1]].view("<i4")
    offsets = blob[where.offsets[0] : where.offsets[0] + 8 * where.offsets[1]].view("<u8")
    cum = blob[where.cum[0] : where.cum[0] + 4 * where.cum[1]].view("<i4")
    upper = int(np.flatnonzero(levels >= 2)[0])
    slot = where.neighbors[0] + 4 * (int(offsets[upper]) + int(cum[1]))
    blob[slot : slot + 4] = np.frombuffer(np.int32(int(np.flatnonzero(levels == 1)[-1])).tobytes(), np.uint8)
    rewrite_array(path, "shard-00000-hnsw.npy", blob)


def damage_graph_truncated(path):
    f = state_dir(path) / "shard-00000-hnsw.npy"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def damage_graph_quantiser(path):
    """The vector copies claimed to be half-precision: faiss would read each as 32 bytes, not 16."""
    blob, where = graph_parts(path)
    at = where.quantiser
    assert blob[at : at + 4].view("<i4")[0] == 0  # QT_8bit
    blob[at : at + 4] = np.frombuffer(np.int32(4).tobytes(), np.uint8)  # QT_fp16
    rewrite_array(path, "shard-00000-hnsw.npy", blob)


GRAPH_DAMAGES = [damage_graph_neighbour_out_of_range, damage_graph_length_field, damage_graph_entry_point,
                 damage_graph_upper_layer_link, damage_graph_truncated, damage_graph_quantiser]


@pytest.mark.parametrize("damage", GRAPH_DAMAGES, ids=lambda f: f.__name__.removeprefix("damage_graph_"))
def test_damaged_dense_graph_is_rebuilt_with_one_warning(graph_index, damage):
    """Forged checksums included: the layout walk and the graph check stop every one of these
    before faiss reads it; the search answers (the exact top 10 on 300 vectors) and the
    rebuilt graph is used by the next process without a word."""
    path, docs = graph_index
    query = docs[7].dense
    want = [d for d, _ in brute_force_dense(docs, query)[:10]]
    code, hits, err = dense_in_subprocess(path, query)
    assert code == 0 and hits == want and not warning_lines(err), err
    damage(path)
    code, hits, err = dense_in_subprocess(path, query)
    assert code == 0 and "Traceback" not in err, err
    assert hits == want and len(warning_lines(err)) == 1 and "damaged" in err, err
    code, hits, err = dense_in_subprocess(path, query)
    assert code == 0 and hits == want and not warning_lines(err), err


def test_a_sparse_search_never_walks_the_graph(graph_index, capsys):
    """A graph's layout is walked by the first dense search it serves, not on open: a sparse
    search answers from a cache whose graph is damaged, without a word; the dense search then
    finds the damage, rebuilds once and answers exactly."""
    from tests.reliability.test_local_index_exactness import assert_ranking

    path, docs = graph_index
    damage_graph_length_field(path)
    backend = LocalBackend(path)
    backend.open(None, create=False)
    query = dict(list(docs[5].sparse.items())[:3])
    assert_ranking(backend.sparse_search(query, 10, explain=0), brute_force_sparse(docs, query), 10)
    shard = backend._search_state().shards[0]
    assert "hnsw" in shard.arrays and shard._graph is None
    assert not warning_lines(capsys.readouterr().err)
    hits = backend.dense_search(docs[7].dense, 10, explain=0)
    assert [h.id for h in hits] == [d for d, _ in brute_force_dense(docs, docs[7].dense)[:10]]
    err = capsys.readouterr().err
    assert len(warning_lines(err)) == 1 and "damaged" in err, err
    backend.close()


def test_graph_hits_are_scored_with_the_float_vectors(graph_index):
    """The graph only proposes candidates: every hit's score is the float32 inner product of
    its stored vector, even when the graph's 8-bit copies are wrong (all set to one value: the
    structure is sound, so only `index check` would notice), and the order is by that score."""
    path, docs = graph_index
    by_id = {d.id: d for d in docs}
    query = docs[11].dense

    def hits_and_exact():
        backend = LocalBackend(path)
        backend.open(None, create=False)
        hits = backend.dense_search(query, 10, explain=0)
        backend.close()
        exact = [float(np.asarray(by_id[h.id].dense, np.float32) @ np.asarray(query, np.float32)) for h in hits]
        return hits, exact

    hits, exact = hits_and_exact()
    assert [h.id for h in hits] == [d for d, _ in brute_force_dense(docs, query)[:10]]
    assert [h.score for h in hits] == pytest.approx(exact, rel=1e-6)
    blob, where = graph_parts(path)
    blob[where.codes :] = 200
    rewrite_array(path, "shard-00000-hnsw.npy", blob)
    hits, exact = hits_and_exact()
    assert len(hits) == 10 and [h.score for h in hits] == pytest.approx(exact, rel=1e-6)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_graphs_are_searched_from_a_huge_page_copy_where_linux_offers_one(graph_index, monkeypatch):
    """Where transparent huge pages can be asked for, the second search starts an anonymous
    copy of the graph on 2 MB pages in the background, walked once it is made; the first
    search walks the file's mapping (a one-query process never pays for the copy), and so do
    the searches while the copy is made; with D2S_GRAPH_HUGE_PAGES=0, or where they are off,
    always the mapping. The same hits either way."""
    from d2s_search.backends.local import graph

    def file_backed(backend) -> bool:
        shard = backend._search_state().shards[0]
        blob = shard.arrays["hnsw"]
        assert not blob.flags.writeable
        chain = [blob]
        while isinstance(chain[-1], (np.ndarray, memoryview)):  # views, then the buffer's owner
            chain.append(chain[-1].base if isinstance(chain[-1], np.ndarray) else chain[-1].obj)
        file_mapping = shard.mapped.get("hnsw", (None,))[0]  # the file's own mapping, while walked
        return file_mapping is not None and any(a is file_mapping for a in chain)

    path, docs = graph_index
    runs = {}
    offered = graph.huge_page_copy(np.zeros(3, np.uint8)) is not None
    for setting in ("1", "0"):
        monkeypatch.setenv("D2S_GRAPH_HUGE_PAGES", setting)
        backend = LocalBackend(path)
        backend.open(None, create=False)
        runs[setting] = [(h.id, h.score) for h in backend.dense_search(docs[0].dense, 5, explain=0)]
        assert file_backed(backend)
        runs[setting] += [(h.id, h.score) for q in docs[1:10] for h in backend.dense_search(q.dense, 5, explain=0)]
        shard = backend._search_state().shards[0]
        assert shard._copying is not None  # started by the second search, whatever the setting
        shard._copying.join(timeout=30)
        assert file_backed(backend) == (setting == "0" or not offered)
        runs[setting] += [(h.id, h.score) for q in docs[10:20] for h in backend.dense_search(q.dense, 5, explain=0)]
        backend.close()
    assert runs["1"] == runs["0"]
    monkeypatch.setattr(graph, "_THP_SETTING", "/nonexistent")
    monkeypatch.setenv("D2S_GRAPH_HUGE_PAGES", "1")
    assert graph.huge_page_copy(np.zeros(3, np.uint8)) is None


def test_index_check_verifies_the_dense_graph_bytes(graph_index, capsys):
    """A flipped byte of a vector copy inside the graph keeps its structure sound: only the
    full checksum of `index check` sees it, and --repair rebuilds it."""
    path, _ = graph_index
    blob, where = graph_parts(path)
    f = state_dir(path) / "shard-00000-hnsw.npy"
    data = bytearray(f.read_bytes())
    data[-(blob.size - where.codes) // 2] ^= 0x40
    f.write_bytes(bytes(data))
    code, out, err = run_cli(["index", "check", "--index", path], capsys)
    assert code == 1 and "shard-00000-hnsw.npy does not match its checksum" in out and "Traceback" not in err
    code, report = run_cli_json(["index", "check", "--index", path, "--repair"], capsys)
    assert code == 0 and report["repaired"], report
    code, report = run_cli_json(["index", "check", "--index", path], capsys)
    assert code == 0 and report["healthy"], report


@pytest.mark.parametrize("names", ["fixed-width ascii", "mixed widths", "non-ascii paths"])
def test_many_hits_carry_their_own_ids_and_paths(tmp_path, names):
    """Over 100 hits (the gathered string path; non-ASCII decoded one by one) across three
    shards, after a reopen (the strings read back from the cache files): every hit's id,
    path and url are its own document's, in the order of the scores."""
    from d2s_search.backends.local import cache

    docs = synthetic_docs(260, seed=5)
    for i, doc in enumerate(docs):
        doc.sparse = {"w1": 0.01 * 2 ** (i / 32)}  # every document matches, 2% apart (16-bit weights)
        if names == "fixed-width ascii":
            doc.path = f"/photos/{i:05d}.jpg"
        elif names == "mixed widths":
            doc.id, doc.path = f"{i:x}", f"/p/{'x' * (i % 7)}{i}.jpg"
        else:
            doc.path = f"/photos/caf\u00e9-{i}/\u72ac.jpg" if i % 5 == 0 else f"/photos/{i}.jpg"
    backend = LocalBackend(tmp_path / "idx")
    old = cache.SHARD_ROWS
    cache.SHARD_ROWS = 128
    try:
        backend.open(IDENTITY)
        backend.upsert(docs)
        backend.sparse_search({"w1": 1.0}, 5)
        backend.close()
        backend = LocalBackend(tmp_path / "idx")
        backend.open(None, create=False)
        assert len(backend._search_state().shards) == 3
        hits = backend.sparse_search({"w1": 1.0}, 250, explain=0)
    finally:
        cache.SHARD_ROWS = old
    by_id = {d.id: d for d in docs}
    assert [h.id for h in hits] == [d.id for d in docs[::-1][:250]]
    assert [(h.path, h.url) for h in hits] == [(by_id[h.id].path, by_id[h.id].url) for h in hits]


@pytest.mark.parametrize("array", [
    np.arange(70_000, dtype=np.int64), np.zeros((3, 5), np.float32), np.array([True, False]),
    np.zeros(0, np.uint16), np.array(7, np.int32), np.arange(6, dtype=">i4"),
], ids=["int64", "2-d float32", "bool", "empty", "0-d", "big-endian"])
@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_an_array_header_is_read_as_numpy_reads_it(array, version):
    """The cache's own reading of a .npy header gives numpy's shape, order, dtype and data
    offset, for either header version np.save writes."""
    import io

    from d2s_search.backends.local import cache

    f = io.BytesIO()
    np.lib.format.write_array(f, array, version=version)
    f.seek(0)
    np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    want = (*read(f), f.tell())
    f.seek(0)
    assert cache._array_header(f, "x.npy") == want


def test_an_array_header_another_writer_spaced_is_left_to_numpy_and_damage_refused():
    """A header in another spacing (or order) than np.save's is read by numpy's own parser;
    a header that is no dict literal, or a file that is no .npy, is refused as damage."""
    import io

    from d2s_search.backends.local import cache
    from d2s_search.backends.local.cache import CacheUnusable

    def npy(header: bytes) -> io.BytesIO:
        header = header + b" " * (-(len(header) + 11) % 64) + b"\n"  # the data then starts at a multiple of 64
        return io.BytesIO(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(24))

    spaced = npy(b"{'shape': (3, 2),  'fortran_order': False, 'descr': '<u4'}")
    assert cache._array_header(spaced, "x.npy") == ((3, 2), False, np.dtype("<u4"), 128)
    with pytest.raises(ValueError):  # numpy's parser refuses it; the cache's load reports ValueError as damage
        cache._array_header(npy(b"{'descr': __import__('os'), 'fortran_order': False, 'shape': (1,), }"), "x.npy")
    with pytest.raises(ValueError):  # "(3)" is no tuple: np.save never writes it, numpy's parser refuses it
        cache._array_header(npy(b"{'descr': '<u4', 'fortran_order': False, 'shape': (3), }"), "x.npy")
    with pytest.raises(CacheUnusable, match="is not an array this package wrote"):
        cache._array_header(io.BytesIO(b"\x93NUMPY\x03\x00" + bytes(60)), "x.npy")
    with pytest.raises(CacheUnusable, match="is not an array this package wrote"):
        cache._array_header(io.BytesIO(b"PK\x03\x04" + bytes(60)), "x.npy")
