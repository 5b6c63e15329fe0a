"""Shared pieces of the local-index reliability tests: synthetic documents, damage tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

from d2s_search.backends.base import Document, IndexIdentity
from d2s_search.backends.local import LocalBackend

DIM = 16
IDENTITY = IndexIdentity("synthetic-fingerprint", DIM, "synthetic")
VOCAB = [f"w{i}" for i in range(40)]
REPO = Path(__file__).resolve().parents[2]


def synthetic_docs(n: int, seed: int, start: int = 0) -> list[Document]:
    """n documents with 1-11 random words each (positive weights) and a random dense vector."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(start, start + n):
        words = rng.choice(len(VOCAB), size=int(rng.integers(1, 12)), replace=False)
        docs.append(Document(
            id=f"{seed:08x}{i:056x}", path=f"/photos/{seed}/{i}.jpg", size_bytes=1, width=1, height=1,
            sparse={VOCAB[w]: float(rng.uniform(0.05, 2.0)) for w in words},
            dense=rng.normal(size=DIM).astype(np.float32), url=None if i % 3 else f"https://example.org/{i}.jpg",
        ))
    return docs


def filled_index(path: Path, docs: list[Document]) -> LocalBackend:
    backend = LocalBackend(path)
    backend.open(IDENTITY)
    backend.upsert(docs)
    return backend


def state_dir(index: Path) -> Path:
    name = (index / "cache" / "current").read_text().split()[0]
    return index / "cache" / name


def rewrite_array(index: Path, file_name: str, array: np.ndarray) -> None:
    """Replace one cached array *and* its recorded size/CRC, as a careful forger would:
    only the structural checks can then catch it."""
    folder = state_dir(index)
    path = folder / file_name
    path.unlink()
    with open(path, "wb") as f:
        np.save(f, array)
    header = json.loads((folder / "header.json").read_bytes())
    shard, name = int(file_name.split("-")[1]), file_name.split("-", 2)[2].removesuffix(".npy")
    header["shards"][shard]["files"][name] = [path.stat().st_size, zlib.crc32(path.read_bytes())]
    body = json.dumps(header).encode()
    (folder / "header.json").write_bytes(body)
    (index / "cache" / "current").write_text(f"{folder.name} {zlib.crc32(body)}\n")


SEARCH_SCRIPT = """
import json, sys
from d2s_search.backends.local import LocalBackend
backend = LocalBackend(sys.argv[1])
backend.open(None, create=False)
query = json.loads(sys.argv[2])
hits = backend.sparse_search(query, int(sys.argv[3]), explain=3)
print(json.dumps([[h.id, h.score, h.path] for h in hits]))
"""


def search_in_subprocess(index: Path, query: dict, k: int = 10) -> tuple[int, list, str]:
    """A sparse search in a fresh process (a segfault there fails the test, not the suite)."""
    env = {k_: v for k_, v in os.environ.items() if not k_.startswith("D2S_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", SEARCH_SCRIPT, str(index), json.dumps(query), str(k)],
                          capture_output=True, text=True, env=env, timeout=120)
    hits = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []
    return proc.returncode, hits, proc.stderr


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def overwrite_table_pages(db_path: Path, table: str, seed: int = 1) -> None:
    """Random bytes over the pages of a small table and of its index (their root pages), as
    a damaged disk sector would leave them; the file header (page 1) is kept."""
    import random
    import sqlite3

    db = sqlite3.connect(db_path)
    roots = [r for (r,) in db.execute("SELECT rootpage FROM sqlite_master WHERE tbl_name = ? AND rootpage > 1",
                                      (table,))]
    db.close()
    data = bytearray(db_path.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    rng = random.Random(seed)
    for root in roots:
        data[(root - 1) * page : root * page] = bytes(rng.getrandbits(8) for _ in range(page))
    db_path.write_bytes(bytes(data))


def meta_rows(index: Path) -> dict[str, str]:
    import sqlite3

    db = sqlite3.connect(index / "index.sqlite")
    try:
        return dict(db.execute("SELECT key, value FROM meta"))
    finally:
        db.close()


def graphs_at_any_size(monkeypatch, shard_rows: int, approximate_from: int = 0) -> None:
    """Shards of ``shard_rows`` rows, the dense side through graphs from ``approximate_from``
    documents on, a graph for a shard of any size, used for every k below its rows."""
    from d2s_search.backends.local import backend as backend_mod
    from d2s_search.backends.local import cache

    monkeypatch.setattr(cache, "SHARD_ROWS", shard_rows)
    monkeypatch.setattr(backend_mod, "APPROXIMATE_DENSE_FROM", approximate_from)
    monkeypatch.setattr(backend_mod, "GRAPH_FROM_ROWS", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1.0)
