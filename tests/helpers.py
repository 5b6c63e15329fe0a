"""Shared test helpers: image generators, CLI runner, brute-force references."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path

import numpy as np
from PIL import Image

# ../shared/data beside the clone; from a git worktree (/work/wt/<name>) it is further up.
SHARED_DATA = next((p / "shared" / "data" for p in Path(__file__).resolve().parents[1].parents
                    if (p / "shared" / "data").is_dir()), Path(__file__).resolve().parents[1].parent / "shared" / "data")
FLICKR8K = SHARED_DATA / "flickr8k-800"


def pattern_image(seed: int, size: tuple[int, int] = (96, 72), mode: str = "RGB") -> Image.Image:
    """A deterministic, visibly distinct picture (blocks of colour plus noise)."""
    rng = np.random.default_rng(seed)
    w, h = size
    base = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    arr = np.kron(base, np.ones((h // 4 + 1, w // 4 + 1, 1), dtype=np.uint8))[:h, :w]
    noise = rng.integers(-20, 20, size=arr.shape)
    arr = np.clip(arr.astype(int) + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(arr, "RGB")
    return image if mode == "RGB" else image.convert(mode)


def write_image(path: Path, seed: int, fmt: str | None = None, **save_kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pattern_image(seed).save(path, format=fmt, **save_kwargs)
    return path


def jpeg_bytes(seed: int, size=(96, 72)) -> bytes:
    buf = io.BytesIO()
    pattern_image(seed, size).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from d2s_search.cli import main

    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_json(args: list[str], capsys) -> tuple[int, dict]:
    code, out, err = run_cli([*args, "--json"], capsys)
    assert out.strip(), f"no JSON output (exit {code}): {err}"
    return code, json.loads(out)


def brute_force_sparse(docs, query: dict[str, float]) -> list[tuple[str, float]]:
    """(id, score) of every document with a positive dot product, best first, ties by order.

    Document weights count as stored: float32 truncated to 9 significant bits (Lucene's
    FeatureField, which the local index keeps as OpenSearch does)."""
    from d2s_search.backends.opensearch.features import lucene_feature_value

    scored = []
    for order, doc in enumerate(docs):
        score = sum(np.float64(w) * lucene_feature_value(doc.sparse[t]) for t, w in query.items() if t in doc.sparse)
        if score > 0:
            scored.append((-score, order, doc.id, score))
    scored.sort()
    return [(doc_id, score) for _, _, doc_id, score in scored]


def brute_force_dense(docs, vector: np.ndarray) -> list[tuple[str, float]]:
    matrix = np.stack([d.dense for d in docs]).astype(np.float64)
    scores = matrix @ np.asarray(vector, dtype=np.float64)
    order = np.lexsort((np.arange(len(docs)), -scores))
    return [(docs[i].id, float(scores[i])) for i in order]


def interruptible() -> dict:
    """``subprocess.Popen`` keyword arguments that give the child the default SIGINT handling,
    for tests that stop it with Ctrl+C: a test run started in the background by a
    non-interactive shell ignores SIGINT, children inherit that, and Python then installs no
    KeyboardInterrupt handler (the child would never see the signal)."""
    return {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)}


def clean_env(tmp_path: Path) -> dict:
    """Environment for subprocesses: isolated config dir, no inherited D2S settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("D2S_")}
    env["D2S_CONFIG_DIR"] = str(tmp_path / "config")
    return env


def brute_force_words(docs, query: dict[str, float], words) -> list[tuple[str, float]]:
    """:func:`brute_force_sparse` over the documents that pass a WordFilter, their stored
    (9-bit) weights compared with its threshold."""
    from d2s_search.backends.opensearch.features import lucene_feature_value

    def passes(doc) -> bool:
        return words.allows({t: lucene_feature_value(w) for t, w in doc.sparse.items()})

    return brute_force_sparse([d for d in docs if passes(d)], query)


def edit_docs(dim: int = 8) -> list:
    """A hand-checkable collection for -word and +word (a picture carries a word from weight
    1.0): dog pictures with a car, without one, with a faint one, and a car alone."""
    import time

    from d2s_search.backends.base import Document

    table = [
        ("dog-in-car", {"dog": 2.0, "car": 2.0, "seat": 1.0}),
        ("car-alone", {"car": 2.5, "road": 1.0}),
        ("dog-faint-car", {"dog": 1.75, "car": 0.25, "grass": 1.0}),
        ("dog-park", {"dog": 1.5, "grass": 1.5}),
        ("dog-beach", {"dog": 1.25, "beach": 1.5}),
        ("cat-sofa", {"cat": 2.0, "sofa": 1.0}),
    ]
    docs = []
    for i, (name, sparse) in enumerate(table):
        dense = np.zeros(dim, dtype=np.float32)
        dense[i % dim] = 1.0
        docs.append(Document(id=f"{i:064x}", path=f"photos/{name}.jpg", size_bytes=1000 + i, width=64, height=48,
                             sparse=sparse, dense=dense, ingested_at=time.time()))
    return docs


def dms(value: float) -> tuple[float, float, float]:
    value = abs(value)
    d = int(value)
    m = int((value - d) * 60)
    return float(d), float(m), round((value - d - m / 60) * 3600, 4)


def exif_jpeg(path: Path, seed: int, taken: str | None = None, place: tuple[float, float] | None = None,
              make: str | None = None, model: str | None = None, offset: str | None = None) -> Path:
    """A JPEG whose EXIF says when (``YYYY:MM:DD HH:MM:SS``), where and with what camera."""
    exif = Image.Exif()
    if make:
        exif[0x010F] = make
    if model:
        exif[0x0110] = model
    if taken:
        exif.get_ifd(0x8769)[0x9003] = taken
        if offset:
            exif.get_ifd(0x8769)[0x9011] = offset
    if place:
        gps = exif.get_ifd(0x8825)
        gps[1], gps[2] = ("N" if place[0] >= 0 else "S"), dms(place[0])
        gps[3], gps[4] = ("E" if place[1] >= 0 else "W"), dms(place[1])
    path.parent.mkdir(parents=True, exist_ok=True)
    pattern_image(seed).save(path, "JPEG", quality=90, exif=exif)
    return path
