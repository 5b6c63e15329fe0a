"""A full disk during ingest is said as a full disk (which file, how much is kept, that nothing
stored is lost), never as a damaged database, and the index stays sound and writable."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys

import pytest

from d2s_search.backends.local import cache as cache_mod
from d2s_search.errors import DiskFullError
from tests.helpers import brute_force_sparse, clean_env, write_image
from tests.reliability.local_index_fixtures import REPO, filled_index, synthetic_docs

QUERY = {"w1": 1.0, "w2": 0.5, "w7": 2.0}


def test_sqlite_finding_the_disk_full_is_not_called_damage(tmp_path):
    index = tmp_path / "idx"
    first = synthetic_docs(20, seed=21)
    backend = filled_index(index, first)
    db = backend._connect(False)
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(
        f"PRAGMA max_page_count = {pages + 1}"
    )  # SQLite itself answers SQLITE_FULL past this
    more = synthetic_docs(400, seed=22)
    with pytest.raises(DiskFullError) as caught:
        backend.upsert(more)
    message = str(caught.value)
    assert message.startswith("disk full: ") and str(index / "index.sqlite") in message
    assert "damaged" not in message and "repair" not in message and "\n" not in message
    assert "everything stored before is kept" in message
    assert backend.count() == 20  # the batch was undone, the rest is there
    db.execute("PRAGMA max_page_count = 1073741823")  # space again: the same connection writes on
    backend.upsert(more)
    assert backend.count() == 420
    assert [h.id for h in backend.sparse_search(QUERY, 500)] == [
        i for i, _ in brute_force_sparse(first + more, QUERY)
    ]
    backend.close()
    check = sqlite3.connect(index / "index.sqlite")
    assert check.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    check.close()


def test_a_cache_that_finds_the_disk_full_says_so_and_searches_from_memory(
    tmp_path, monkeypatch, capsys
):
    index = tmp_path / "idx"
    docs = synthetic_docs(30, seed=23)
    backend = filled_index(index, docs)

    def no_space(path, array):  # what writing a cache file meets on a full disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(cache_mod, "_write_array", no_space)
    hits = backend.sparse_search(QUERY, 100)
    backend.close()
    assert [h.id for h in hits] == [i for i, _ in brute_force_sparse(docs, QUERY)]
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert line.startswith("warning: disk full: ") and str(index / "cache") in line
    assert "every document is stored" in line and "damaged" not in line
    assert not [
        p for p in (index / "cache").iterdir() if p.name.startswith(".tmp-")
    ]  # no half-written state


DRIVER = """
import json, subprocess, sys
index, photos, bundle, out = sys.argv[1:5]
def run(*args):
    p = subprocess.run([sys.executable, "-m", "d2s_search.cli", *args], capture_output=True, text=True)
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr}
result = {"ingest": run("ingest", photos, "--bundle", bundle, "--index", index, "--batch-size", "4", "--json"),
          "check": run("index", "check", "--index", index, "--json"),
          "stats": run("index", "stats", "--index", index, "--json")}
open(out, "w").write(json.dumps(result))
"""


def test_ingest_onto_a_full_file_system_says_disk_full(tmp_path, tiny_blip_bundle):
    """On a real, small tmpfs (mounted in a private mount namespace): no mock anywhere."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
            capture_output=True,
        ).returncode
    ):
        pytest.skip("cannot mount a small file system here (unshare -rm with tmpfs)")
    photos = tmp_path / "photos"
    for i in range(40):
        write_image(photos / f"p{i:02d}.jpg", seed=300 + i)
    small = tmp_path / "small"
    small.mkdir()
    (tmp_path / "driver.py").write_text(DRIVER)
    result = tmp_path / "result.json"
    env = clean_env(tmp_path) | {"PYTHONPATH": str(REPO)}
    script = (
        f"mount -t tmpfs -o size=3m tmpfs {small} && "
        f"{sys.executable} {tmp_path / 'driver.py'} {small / 'W'} {photos} {tiny_blip_bundle} {result}"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    ran = json.loads(result.read_text())

    ingest = ran["ingest"]
    assert ingest["code"] == 1 and "Traceback" not in ingest["err"], ingest
    error = json.loads(ingest["out"])["error"]
    assert error["type"] == "DiskFullError"
    assert error["message"].startswith("disk full: ") and str(small / "W") in error["message"]
    assert "damaged" not in error["message"] and "repair" not in error["message"]
    stored = int(
        re.search(r"the (\d+) image\(s\) this run stored before are kept", error["message"]).group(
            1
        )
    )
    assert 0 < stored < 40
    assert json.loads(ran["check"]["out"])["healthy"], ran["check"]  # the database is intact
    assert json.loads(ran["stats"]["out"])["documents"] == stored  # what it said is kept, is
