"""A cache file cut short under a process that has it memory-mapped: touching the mapping past
the file's new end would kill the process by SIGBUS, which Python cannot catch. The process
notices before it searches (the mapped files' sizes), never touches those mappings again,
rebuilds from SQLite with one warning line and answers; `serve` stays up, and its discovery
file never outlives it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from d2s_search.backends.base import Document
from tests.helpers import brute_force_dense, brute_force_sparse, clean_env, interruptible
from tests.reliability.local_index_fixtures import (
    DIM,
    REPO,
    VOCAB,
    filled_index,
    state_dir,
    warning_lines,
)
from tests.serve.test_serve_cli import RUN_CLI, _wait_for_address

QUERY = {"w1": 1.0, "w2": 0.5, "w3": 0.25, "w7": 2.0}


def mapped_docs(n: int, terms: list[str], dim: int, seed: int) -> list[Document]:
    """Documents whose postings, vectors and ids fill files large enough to be memory-mapped
    (over 64 KiB each), with 12 words each: no word in half of them (no dense columns), so a
    sparse search reads the postings themselves."""
    rng = np.random.default_rng(seed)
    return [
        Document(
            id=f"{seed:08x}{i:056x}",
            path=f"/photos/{i}.jpg",
            size_bytes=1,
            width=1,
            height=1,
            sparse={
                terms[t]: float(rng.uniform(0.05, 2.0))
                for t in rng.choice(len(terms), 12, replace=False)
            },
            dense=rng.normal(size=dim).astype(np.float32),
        )
        for i in range(n)
    ]


def assert_mapped(index, name: str) -> None:
    assert (
        state_dir(index) / f"shard-00000-{name}.npy"
    ).stat().st_size > 1 << 16  # cache.MAPPED_FROM


SCRIPT = """
import json, os, sys
import numpy as np
from d2s_search.backends.local import LocalBackend
index, name, kind, query, before, damage, inotify = sys.argv[1:]
if inotify == "no":  # as on a system without it
    import importlib
    try:
        importlib.import_module("d2s_search.backends.local.mapped")._inotify = lambda: None
    except ImportError:  # a version without the watches
        pass
backend = LocalBackend(index)
backend.open(None, create=False)

def search():
    if kind == "dense":
        return backend.dense_search(np.asarray(json.loads(query), dtype=np.float32), 10, explain=0)
    return backend.sparse_search(json.loads(query), 10, explain=3)

for _ in range(int(before)):
    first = [h.id for h in search()]
state = open(os.path.join(index, "cache", "current")).read().split()[0]
path = os.path.join(index, "cache", state, f"shard-00000-{name}.npy")
if damage == "cut short":
    os.truncate(path, 100)  # under the mapping
else:  # bytes written in place, the size and times kept
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(before.st_size // 2)
        f.write(os.urandom(64))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
print(json.dumps({"first": first, "then": [[h.id, h.path] for h in search()]}))
"""


def run_script(
    index, name: str, kind: str, query, before: int, damage: str, inotify: str
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("D2S_")}
    env["PYTHONPATH"] = str(REPO)
    args = [str(index), name, kind, json.dumps(query), str(before), damage, inotify]
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture(scope="module")
def mapped_index(tmp_path_factory):
    docs = mapped_docs(6000, VOCAB, DIM, seed=3)
    path = tmp_path_factory.mktemp("mapped") / "idx"
    backend = filled_index(path, docs)
    backend.sparse_search(QUERY, 5)
    backend.close()
    return path, docs


CHANGES = {
    # the first check after opening (the second search) sets the watches and compares each stat
    "cut short, then the second search": ("cut short", 1, "yes"),
    "cut short, then a later search": ("cut short", 3, "yes"),  # the watches report it
    "cut short, no inotify": ("cut short", 3, "no"),  # every check compares the sizes
    "written in place, then the second search": ("written in place", 1, "yes"),
    "written in place, then a later search": ("written in place", 3, "yes"),
}


@pytest.mark.parametrize(
    "change", list(CHANGES), ids=lambda c: c.replace(" ", "-").replace(",", "")
)
@pytest.mark.parametrize(
    "name,kind",
    [
        ("csc_indices", "sparse"),
        ("csc_data", "sparse"),
        ("dense", "dense"),
        ("ids_blob", "sparse"),
        ("paths_blob", "sparse"),
    ],
)
def test_a_mapped_file_changed_under_a_process_is_noticed_before_its_next_search(
    mapped_index, tmp_path, name, kind, change
):
    """Cut short (the next read of the mapping would be SIGBUS) or written in place (the
    next search would answer from the new bytes): the next search rebuilds the cache from
    SQLite with one warning line and answers exactly."""
    source, docs = mapped_index
    index = tmp_path / "idx"
    shutil.copytree(source, index)
    assert_mapped(index, name)
    query = docs[5].dense.tolist() if kind == "dense" else QUERY
    damage, before, inotify = CHANGES[change]
    proc = run_script(index, name, kind, query, before, damage, inotify)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    out = json.loads(proc.stdout)
    exact = (
        brute_force_dense(docs, docs[5].dense)
        if kind == "dense"
        else brute_force_sparse(docs, QUERY)
    )
    paths = {d.id: d.path for d in docs}
    assert out["first"] == [doc_id for doc_id, _ in exact[:10]]
    assert out["then"] == [[doc_id, paths[doc_id]] for doc_id in out["first"]]
    said = (
        f"shard-00000-{name}.npy has 100 bytes"
        if damage == "cut short"
        else f"shard-00000-{name}.npy does not match"
    )
    assert len(warning_lines(proc.stderr)) == 1 and said in proc.stderr, proc.stderr


@pytest.fixture
def serve_with_mapped_files(tmp_path, tiny_blip_bundle):
    """A real `d2s-search serve` of 6,000 documents whose words come from the tiny model's
    answer to the query, so every search finds some."""
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    from d2s_search.search import encode_text_query

    bundle = Bundle.load(tiny_blip_bundle)
    terms = sorted(encode_text_query(Encoder(bundle, device="cpu"), "a dog on the grass").full)
    from d2s_search.backends.local import LocalBackend

    index = tmp_path / "index"
    backend = LocalBackend(index)
    backend.open(bundle.identity())
    backend.upsert(mapped_docs(6000, terms, bundle.identity().dense_dim, seed=5))
    backend.prepare_search()
    backend.close()
    env = clean_env(tmp_path)
    args = [
        "serve",
        "--bundle",
        str(tiny_blip_bundle),
        "--index",
        str(index),
        "--port",
        "0",
        "--thumbnail-dir",
        str(tmp_path / "thumbs"),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_CLI, *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **interruptible(),
    )
    try:
        yield proc, _wait_for_address(proc, timeout=90), index, env
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name,mode", [("csc_indices", "sparse"), ("dense", "dense")])
def test_serve_answers_after_a_mapped_file_is_cut_short(serve_with_mapped_files, name, mode):
    proc, url, index, _ = serve_with_mapped_files
    assert_mapped(index, name)
    params = {"q": "a dog on the grass", "k": 10, "mode": mode, "explain": 0}
    before = httpx.get(f"{url}/api/search", params=params, timeout=30)
    assert before.status_code == 200 and before.json()["results"], before.text
    os.truncate(state_dir(index) / f"shard-00000-{name}.npy", 100)
    after = httpx.get(f"{url}/api/search", params=params, timeout=120)
    assert proc.poll() is None, "serve died"
    assert after.status_code == 200, after.text
    assert [r["id"] for r in after.json()["results"]] == [r["id"] for r in before.json()["results"]]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    err = proc.stderr.read()
    assert len(warning_lines(err)) == 1 and f"shard-00000-{name}.npy has 100 bytes" in err, err
    assert "Traceback" not in err and "Fatal Python error" not in err


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_serve_removes_its_discovery_file_whatever_stops_it(
    serve_with_mapped_files, monkeypatch, stop
):
    """`kill` (SIGTERM: uvicorn shuts down, then raises it again) and a closed terminal
    (SIGHUP) end serve as Ctrl+C does: the file `query` reads goes with it."""
    from d2s_search.serve import discovery

    proc, _, index, env = serve_with_mapped_files
    monkeypatch.setenv("D2S_CONFIG_DIR", env["D2S_CONFIG_DIR"])
    announced = discovery.discovery_path(index)
    deadline = time.monotonic() + 10
    while not announced.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(announced.read_bytes())["pid"] == proc.pid
    proc.send_signal(stop)
    assert proc.wait(timeout=30) == 0
    assert not announced.exists()
    assert "d2s-search: stopped" in proc.stderr.read()


def test_a_discovery_file_left_by_a_killed_serve_is_removed_by_the_next_reader(
    tmp_path, monkeypatch
):
    """A serve killed outright (SIGKILL, a crash) cannot remove its file: the next `query`
    that finds it pointing at a process that is gone removes it."""
    from d2s_search.serve import discovery

    monkeypatch.setenv("D2S_CONFIG_DIR", str(tmp_path / "config"))
    index = tmp_path / "index"
    index.mkdir()
    announce = (
        "import sys; from d2s_search.serve import discovery; "
        "print(discovery.announce(sys.argv[1], '127.0.0.1', 8123, 'f' * 32, 'a' * 32, discovery.new_token()))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    written = subprocess.run(
        [sys.executable, "-c", announce, str(index)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    assert written == str(discovery.discovery_path(index)) and os.path.isfile(written)
    assert discovery.find(index, "f" * 32, "a" * 32) is None
    assert not os.path.exists(written)
    live = discovery.announce(
        index, "127.0.0.1", 8123, "f" * 32, "a" * 32, discovery.new_token()
    )  # this process: alive
    assert discovery.find(index, "f" * 32, "a" * 32) is not None and live.is_file()
    live.unlink()
