"""A real-shaped dense collection: real embeddings tiled with small perturbations to any size
(123,000 or 1,000,000 vectors), and held-out captions as queries.

Sources (offline-mini, 384-d): the flickr8k-800 photos as the quick start's index stored them
and the Karpathy captions (Flickr30k dev + test, COCO dev) through the same bundle's text
encoder. Queries: the flickr8k-800 captions, never used to make a document (first half of the
photos' captions for validation, the other half for test). Sources (CLIP ViT-B/32, 512-d):
the 100 distinct flickr8k-100 images and the first 250 of their 500 captions; queries the
other 250.

Each document is a source plus Gaussian noise drawn from the sources' own covariance (the
noise lies where real vectors vary, no rotation), renormalised, so that a copy's nearest
other copy of its source lies about as far as a real vector's nearest real neighbour
(``NOISE``, measured by :func:`nn_distances`): a search cannot find a query's neighbours by
finding its source, and the sources are not themselves documents. Deterministic per seed.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from _common import CACHE, DATA

# Noise per document as a share of the sources' own spread, and the log-normal sigma of that
# share across documents: chosen so that at 123,000 documents the distances from a document to
# its nearest other document match the real vectors' (p10 / p50 / p90, bench_graph_params.py
# prints both): offline-mini 0.53 / 0.70 / 0.89 against 0.48 / 0.71 / 0.90, CLIP 0.40 / 0.55 /
# 0.75 against 0.37 / 0.57 / 0.77. At 1,000,000 more copies of each source lie closer (p50 0.65).
NOISE = {"offline-mini": 0.75, "clip": 0.95}
SPREAD = 0.4
PHOTOS_INDEX = CACHE / "photos-800" / "index"
PHOTOS_BUNDLE = CACHE / "photos-800" / "bundle"
KARPATHY = ("f30k_precomp_dev_caps.txt", "f30k_precomp_test_caps.txt", "coco_precomp_dev_caps.txt")


def _encode(texts: list[str], out: Path) -> np.ndarray:
    """Captions through the photo index's bundle (one thread), cached in ``out``."""
    if out.is_file():
        return np.load(out)
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder

    encoder = Encoder(Bundle.load(PHOTOS_BUNDLE), device="cpu", threads=1)
    vectors = np.vstack([encoder.encode_texts(texts[i : i + 64]).dense for i in range(0, len(texts), 64)])
    vectors = vectors.astype(np.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, vectors)
    return vectors


def _photo_vectors() -> np.ndarray:
    import sqlite3

    db = sqlite3.connect(PHOTOS_INDEX / "index.sqlite")
    try:
        rows = db.execute("SELECT dense FROM docs ORDER BY seq").fetchall()
    finally:
        db.close()
    return np.stack([np.frombuffer(blob, dtype="<f4") for (blob,) in rows])


def offline_mini_sources() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document sources, validation queries, test queries): 800 photos and 15,069 Karpathy
    captions; the 4,000 flickr8k-800 captions as queries, by photo (first 400 photos' for
    validation, the last 400's for test)."""
    captions = [line.strip() for name in KARPATHY for line in (DATA / "karpathy-captions" / name).open()]
    captions = [c for c in captions if c]
    with open(DATA / "flickr8k-800" / "captions.txt", newline="") as f:
        rows = [(r["image"], r["caption"]) for r in csv.DictReader(f)]
    photos = sorted({image for image, _ in rows})
    half = set(photos[: len(photos) // 2])
    karpathy = _encode(captions, CACHE / "real-shaped" / "karpathy-offline-mini.npy")
    queries = _encode([c for _, c in rows], CACHE / "real-shaped" / "flickr8k-800-captions-offline-mini.npy")
    # Flickr30k holds the Flickr8k photos: a caption text among the queries is no document
    held = {" ".join(c.lower().split()) for _, c in rows}
    kept = np.array([" ".join(c.lower().split()) not in held for c in captions])
    first = np.array([image in half for image, _ in rows])
    return np.vstack([_photo_vectors(), karpathy[kept]]), queries[first], queries[~first]


def clip_sources() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document sources, validation queries, test queries) of the CLIP ViT-B/32 vectors."""
    folder = DATA / "flickr8k-100-clip-b32"
    images = np.load(folder / "image_embeddings.npy")[::5]  # 5 rows per image, the same vector
    texts = np.load(folder / "text_embeddings.npy")
    held = texts[250:]
    return np.vstack([images, texts[:250]]).astype(np.float32), held[::2], held[1::2]


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def tile(sources: np.ndarray, n: int, noise: float, seed: int = 0, spread: float = SPREAD) -> np.ndarray:
    """``n`` unit vectors: source ``i % len(sources)`` (in a shuffled order) plus noise drawn
    from N(0, s^2 * covariance of the sources), renormalised; s is ``noise`` times a
    log-normal factor (``spread``: its sigma), so that documents lie at varied distances from
    their nearest neighbour as real ones do, not all at one."""
    rng = np.random.default_rng(seed)
    sources = _unit(sources)
    centred = sources - sources.mean(axis=0)
    # Noise with the sources' covariance: standard normals times the centred sources' (scaled)
    # right singular vectors and values, drawn in blocks to bound memory at 1M vectors.
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    shape = (s[:, None] * vt / np.sqrt(len(sources))).astype(np.float32)
    order = rng.permutation(n) % len(sources)
    out = np.empty((n, sources.shape[1]), dtype=np.float32)
    for lo in range(0, n, 50_000):
        hi = min(lo + 50_000, n)
        z = rng.standard_normal((hi - lo, len(s)), dtype=np.float32)
        scale = noise * np.exp(spread * rng.standard_normal((hi - lo, 1))).astype(np.float32)
        out[lo:hi] = _unit(sources[order[lo:hi]] + scale * (z @ shape))
    return out


def nn_distances(vectors: np.ndarray, sample: int = 500, seed: int = 0) -> np.ndarray:
    """Euclidean distance from ``sample`` random unit vectors to their nearest other vector."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(vectors), size=min(sample, len(vectors)), replace=False)
    best = np.full(len(rows), -np.inf, dtype=np.float32)
    for lo in range(0, len(vectors), 100_000):
        scores = vectors[rows] @ vectors[lo : lo + 100_000].T
        own = (rows >= lo) & (rows < lo + 100_000)
        scores[np.flatnonzero(own), rows[own] - lo] = -np.inf
        best = np.maximum(best, scores.max(axis=1))
    return np.sqrt(np.maximum(0.0, 2.0 - 2.0 * best))


def collection(model: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(documents, validation queries, test queries) of the real-shaped collection."""
    sources, validation, test = (offline_mini_sources if model == "offline-mini" else clip_sources)()
    return tile(sources, n, NOISE[model], seed), _unit(validation), _unit(test)
