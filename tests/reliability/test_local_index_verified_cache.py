"""The cache answers only once its bytes are verified: bytes changed in place (the header and
the file times left as they were) are found before any search answers, the cache is rebuilt
from SQLite with one warning line, and a hit's id, path and URL are confirmed by SQLite, so
a forged path is never shown even when its checksums were forged too. A verified cache is
not read again: a stamp of each file's stat remembers it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import numpy as np
import pytest

from d2s_search.backends.local import LocalBackend
from d2s_search.backends.local import cache as cache_mod
from tests.helpers import brute_force_dense, brute_force_sparse
from tests.reliability.local_index_fixtures import (
    IDENTITY,
    REPO,
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
    """2,500 documents: some cache files are read on open, the larger ones memory-mapped."""
    docs = synthetic_docs(2500, seed=4)
    backend = filled_index(tmp_path / "idx", docs)
    backend.sparse_search(QUERY, 5)  # writes the cache
    backend.close()
    return tmp_path / "idx", docs


def expected(docs, k=10):
    return [doc_id for doc_id, _ in brute_force_sparse(docs, QUERY)[:k]]


def overwrite_in_place(path, at: int, data: bytes) -> None:
    """Bytes written into the file itself (same inode, same size), its times set back."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns


def array_start(path) -> int:
    with open(path, "rb") as f:
        assert np.lib.format.read_magic(f) == (1, 0)
        np.lib.format.read_array_header_1_0(f)
        return f.tell()


def let_the_clock_tick() -> None:
    """File times move in ticks of the kernel's clock (a few ms): a stamp records only files
    last changed before the tick it was begun in."""
    time.sleep(0.05)


def damage_postings(index, docs):
    """Valid-looking ids: every posting list reversed, each id still inside the shard."""
    f = state_dir(index) / "shard-00000-csc_indices.npy"
    ids = np.load(f)
    overwrite_in_place(f, array_start(f), ids[::-1].tobytes())


def damage_weights(index, docs):
    f = state_dir(index) / "shard-00000-csc_data.npy"
    weights = np.load(f)
    rng = np.random.default_rng(0)
    forged = rng.integers(int(weights.min()), int(weights.max()) + 1, size=weights.size).astype(
        weights.dtype
    )
    overwrite_in_place(f, array_start(f), forged.tobytes())


def damage_dense(index, docs):
    f = state_dir(index) / "shard-00000-dense.npy"
    vectors = np.load(f)
    forged = np.random.default_rng(1).normal(size=vectors.shape).astype(np.float32)
    overwrite_in_place(f, array_start(f), forged.tobytes())


def damage_top_hit_strings(index, docs):
    """The best hit's id and path bytes: another id of the same length, a path to EVIL.jpg."""
    top = next(d for d in docs if d.id == expected(docs)[0])
    for name, old, new in (
        ("ids", top.id, "f" * len(top.id)),
        ("paths", top.path, top.path[: -len("EVIL.jpg")] + "EVIL.jpg"),
    ):
        f = state_dir(index) / f"shard-00000-{name}_blob.npy"
        at = f.read_bytes().index(old.encode())
        overwrite_in_place(f, at, new.encode())


def dense_query(docs):
    return docs[17].dense


DAMAGES = {
    "postings": (damage_postings, "sparse"),
    "weights": (damage_weights, "sparse"),
    "dense vectors": (damage_dense, "dense"),
    "top hit's id and path": (damage_top_hit_strings, "sparse"),
}

DENSE_SCRIPT = """
import json, sys
import numpy as np
from d2s_search.backends.local import LocalBackend
backend = LocalBackend(sys.argv[1])
backend.open(None, create=False)
hits = backend.dense_search(np.asarray(json.loads(sys.argv[2]), dtype=np.float32), 10, explain=0)
print(json.dumps([[h.id, h.score, h.path] for h in hits]))
"""


def run_search(path, docs, kind):
    if kind == "sparse":
        code, hits, err = search_in_subprocess(path, QUERY)
        return code, [h[0] for h in hits], [h[2] for h in hits], err
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("D2S_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", DENSE_SCRIPT, str(path), json.dumps(dense_query(docs).tolist())],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    hits = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []
    return proc.returncode, [h[0] for h in hits], [h[2] for h in hits], proc.stderr


def want(docs, kind):
    if kind == "sparse":
        return expected(docs)
    return [doc_id for doc_id, _ in brute_force_dense(docs, dense_query(docs))[:10]]


@pytest.mark.parametrize("damage", list(DAMAGES), ids=lambda name: name.replace(" ", "-"))
def test_bytes_changed_in_place_are_found_before_the_cache_answers(index, damage):
    path, docs = index
    hurt, kind = DAMAGES[damage]
    paths = {d.id: d.path for d in docs}
    code, ids, _, err = run_search(path, docs, kind)
    assert code == 0 and ids == want(docs, kind) and not warning_lines(err), err
    hurt(path, docs)
    code, ids, shown, err = run_search(path, docs, kind)
    assert code == 0 and "Traceback" not in err, err
    assert ids == want(docs, kind) and shown == [paths[i] for i in ids]
    assert len(warning_lines(err)) == 1 and "does not match its checksum" in err, err
    # rebuilt from SQLite: the next process searches it without a word
    code, ids, _, err = run_search(path, docs, kind)
    assert code == 0 and ids == want(docs, kind) and not warning_lines(err), err


def forge_stamp(index) -> None:
    """What a forger who knows the stamp would write: every file vouched for as it is now."""
    from d2s_search.backends.local import cache_stamp

    folder = state_dir(index)
    header_crc = int((index / "cache" / "current").read_text().split()[1])
    header = json.loads((folder / "header.json").read_bytes())
    files = {}
    for j, shard in enumerate(header["shards"]):
        for name, (_size, crc) in shard["files"].items():
            file_name = f"shard-{j:05d}-{name}.npy"
            files[file_name] = cache_stamp.entry(os.stat(folder / file_name), crc)
    body = {"format": cache_stamp.STAMP_FORMAT, "header_crc": header_crc, "files": files}
    (folder / cache_stamp.STAMP_NAME).write_text(json.dumps(body))


def test_a_forged_path_is_never_shown_even_with_forged_checksums(index):
    """Checksums and stamp forged to match the forged bytes: SQLite, the source of truth,
    still disowns the path; the cache is rebuilt with one warning and the real path shown."""
    path, docs = index
    top = next(d for d in docs if d.id == expected(docs)[0])
    f = state_dir(path) / "shard-00000-paths_blob.npy"
    blob = np.load(f).copy()
    at = blob.tobytes().index(top.path.encode())
    evil = (top.path[: -len("EVIL.jpg")] + "EVIL.jpg").encode()
    blob[at : at + len(evil)] = np.frombuffer(evil, np.uint8)
    rewrite_array(path, f.name, blob)
    forge_stamp(path)
    code, hits, err = search_in_subprocess(path, QUERY)
    assert code == 0 and "Traceback" not in err, err
    assert [h[0] for h in hits] == expected(docs) and hits[0][2] == top.path
    assert not any(h[2].endswith("EVIL.jpg") for h in hits)
    assert len(warning_lines(err)) == 1 and "not the database's" in err, err
    code, hits, err = search_in_subprocess(path, QUERY)
    assert code == 0 and hits[0][2] == top.path and not warning_lines(err), err


def test_a_verified_cache_is_not_read_again(index, monkeypatch):
    """The stamp vouches for every file: later opens compare stat and read no file in full;
    a file whose ctime moved (bytes written back unchanged, times reset) is read once more."""
    from d2s_search.backends.local import cache_stamp

    path, _ = index
    read = []
    crc_open = cache_mod._crc_open
    monkeypatch.setattr(cache_mod, "_crc_open", lambda f: read.append(f.name) or crc_open(f))
    begun = []
    stamp_class = cache_stamp.Stamp
    monkeypatch.setattr(cache_stamp, "Stamp", lambda *a: begun.append(a) or stamp_class(*a))
    for _ in range(2):
        cache_mod.load(path / "cache")
    assert read == [] and begun == []
    f = state_dir(path) / "shard-00000-dense.npy"
    overwrite_in_place(f, 0, f.read_bytes()[:16])  # the same bytes: only the ctime moves
    let_the_clock_tick()
    cache_mod.load(path / "cache")
    assert len(read) == 1 and len(begun) == 1
    cache_mod.load(path / "cache")  # stamped again
    assert len(read) == 1 and len(begun) == 1


def test_a_file_changed_after_the_stamp_was_begun_is_not_vouched_for(tmp_path):
    """A change in the same tick of the file system's clock would keep every stat field: the
    stamp records only files whose ctime is older than the moment it was begun."""
    from d2s_search.backends.local import cache_stamp

    old, new = tmp_path / "old.npy", tmp_path / "new.npy"
    old.write_bytes(b"a")
    new.write_bytes(b"b")
    stamp = cache_stamp.Stamp(tmp_path, 7)
    new.write_bytes(b"c")  # changed after the stamp's moment, perhaps within the same tick
    stamp.wait_past(os.stat(old).st_ctime_ns)
    assert stamp.add("old.npy", os.stat(old), 1)
    assert not stamp.add("new.npy", os.stat(new), 2)
    stamp.commit()
    assert cache_stamp.read(tmp_path, 7) == {"old.npy": cache_stamp.entry(os.stat(old), 1)}
    assert cache_stamp.read(tmp_path, 8) == {}  # a stamp of another header vouches for nothing


@contextlib.contextmanager
def read_only(folder):
    """``folder`` made read-only: by its mode, or (for root, whom modes do not stop) by the
    file system's immutable flag."""
    os.chmod(folder, 0o555)
    immutable = False
    try:
        if os.access(folder, os.W_OK):
            immutable = (
                subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
            )
            if not immutable:
                pytest.skip("cannot make a folder read-only for this user here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        os.chmod(folder, 0o755)


def test_a_read_only_index_keeps_its_stamp_in_the_user_cache(index, tmp_path, monkeypatch):
    """An index the user cannot write (a shared copy) is still read once, not on every open:
    the stamp goes to the user's cache dir."""
    from d2s_search.backends.local import cache_stamp

    path, _ = index
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.delenv("D2S_CONFIG_DIR", raising=False)
    folder = state_dir(path)
    (folder / cache_stamp.STAMP_NAME).unlink()
    # Stamped elsewhere, a file must be older than the other file system's coarsest tick.
    time.sleep(cache_stamp.FOREIGN_CLOCK_MARGIN_NS / 1e9 + 0.1)
    read = []
    crc_open = cache_mod._crc_open
    monkeypatch.setattr(cache_mod, "_crc_open", lambda f: read.append(f.name) or crc_open(f))
    with read_only(folder):
        cache_mod.load(path / "cache")
        assert read and list(
            (tmp_path / "user-cache" / "d2s-search" / "index-stamps").glob("*.json")
        )
        read.clear()
        assert cache_mod.load(path / "cache").size == 2500 and read == []
        assert not (folder / cache_stamp.STAMP_NAME).exists()


def test_a_commit_during_the_search_is_not_taken_for_damage(index, capsys):
    """A path replaced by another process between the search and the confirmation of its hits:
    the search runs again on what is committed now, without a warning."""
    path, docs = index
    reader = LocalBackend(path)
    reader.open(None, create=False)
    stale = reader._search_state()
    top = next(d for d in docs if d.id == expected(docs)[0])
    writer = filled_index(path, [])
    top.path = "/photos/moved/top.jpg"
    writer.upsert([top])  # the same document, at its new path
    writer.close()
    states = iter([stale])
    reader._search_state = lambda: next(states, None) or LocalBackend._search_state(reader)
    hits = reader.sparse_search(QUERY, 10, explain=0)
    reader.close()
    assert [h.id for h in hits] == expected(docs) and hits[0].path == "/photos/moved/top.jpg"
    assert not warning_lines(capsys.readouterr().err)


def test_the_database_is_asked_once_per_shown_row(index):
    """A running process confirms a row's strings with SQLite the first time it shows it."""
    path, docs = index
    backend = LocalBackend(path)
    backend.open(IDENTITY, create=False)
    backend.sparse_search(QUERY, 10)
    asked = []
    backend._connect(False).set_trace_callback(
        lambda sql: asked.append(sql) if "FROM docs" in sql else None
    )
    backend.sparse_search(QUERY, 10)
    assert asked == []
    backend.sparse_search(QUERY, 20)
    assert len(asked) == 1
    backend.close()
