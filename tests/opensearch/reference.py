"""Brute-force references: synthetic documents and the scores Lucene must give them."""

from __future__ import annotations

import math
import time

import numpy as np

from d2s_search.backends.base import Document
from d2s_search.backends.opensearch.features import lucene_feature_value

# Vocabulary tokens that break naive feature naming: dots, escapes, word pieces, punctuation,
# non-ASCII, and a literal that looks like our own escape sequence.
TRICKY_TERMS = [
    ".", "..", "...", "a.m.", "u.s", "%", "100%", "%2E", "%25", "%2e", "##s", "##.", "#", "$", "&",
    "'", "(", ")", "*", "+", ",", "-", "/", ":", ";", "<", "=", ">", "?", "@", "[", "\\", "]", "^",
    "_", "`", "{", "|", "}", "~", '"', "é", "ß", "日本", "の", "ü", "##ï", "—", "…", "°", "€", "😀",
    "[unused0]", "sparse", "_id", "dog", "car", "seat",
]


def vocabulary(n: int = 300) -> list[str]:
    words = [f"w{i:03d}" for i in range(n - len(TRICKY_TERMS))]
    return TRICKY_TERMS + words


def synthetic_docs(n: int, dim: int = 8, vocab: list[str] | None = None, seed: int = 0,
                   terms_per_doc: int = 25, prefix: str = "photos") -> list[Document]:
    """Random documents: a Zipf-ish term choice so queries share terms with many documents."""
    rng = np.random.default_rng(seed)
    vocab = vocab or vocabulary()
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 0.8
    p /= p.sum()
    docs = []
    for i in range(n):
        chosen = rng.choice(len(vocab), size=terms_per_doc, replace=False, p=p)
        weights = rng.gamma(1.5, 0.6, size=terms_per_doc)
        sparse = {vocab[c]: float(w) for c, w in zip(chosen, weights, strict=True)}
        dense = rng.normal(size=dim).astype(np.float32)
        dense /= np.linalg.norm(dense)
        sub = "cats" if i % 3 == 0 else "dogs"
        docs.append(Document(
            id=f"{i:064x}", path=f"{prefix}/{sub}/{i:04d}.jpg", size_bytes=1000 + i, width=64, height=48,
            sparse=sparse, dense=dense, url=None, ingested_at=time.time(),
        ))
    return docs


def random_query(vocab: list[str], rng: np.random.Generator, n_terms: int = 12) -> dict[str, float]:
    chosen = rng.choice(min(len(vocab), 120), size=n_terms, replace=False)
    return {vocab[c]: float(rng.uniform(0.05, 2.5)) for c in chosen}


def lucene_score(query: dict[str, float], doc: dict[str, float]) -> float | None:
    """What OpenSearch scores for bool.should[rank_feature linear, boost=q]: None if no term matches.

    Each stored value is a float32 truncated to 9 significant bits; the boost is a float32;
    Lucene multiplies them in float32 and sums the clauses in double, then casts to float32.
    """
    parts = [
        float(np.float32(np.float32(w) * np.float32(lucene_feature_value(doc[t]))))
        for t, w in query.items() if t in doc and w > 0
    ]
    return float(np.float32(math.fsum(parts))) if parts else None


def exact_dot(query: dict[str, float], doc: dict[str, float]) -> float:
    return math.fsum(w * doc[t] for t, w in query.items() if t in doc)


def ulps(a: float, b: float) -> int:
    """Distance between two float32 values in units in the last place."""
    ia = int(np.array([a], dtype=np.float32).view(np.int32)[0])
    ib = int(np.array([b], dtype=np.float32).view(np.int32)[0])
    return abs(ia - ib)


def ranking(query: dict[str, float], docs: list[Document], only=None) -> list[tuple[str, float]]:
    """(id, expected score) of every matching document, best first."""
    out = []
    for d in docs:
        if only is not None and not only(d):
            continue
        s = lucene_score(query, d.sparse)
        if s is not None:
            out.append((d.id, s))
    out.sort(key=lambda x: -x[1])
    return out


# -- metadata: a library with dates, cameras, places, the user's fields, copies -----------------

CITIES = {"paris": (48.8566, 2.3522), "tokyo": (35.6762, 139.6503), "new-york": (40.7128, -74.0060),
          "sydney": (-33.8688, 151.2093)}
CAMERAS = ["Canon EOS 5D", "Pixel 7", "iPhone 12", "FUJIFILM X-T3"]
FOLDERS = ["/lib/2019/trips", "/lib/2019/home", "/lib/2020", "/lib/2020/pets", "/lib/scans"]
FOLDER_WEIGHTS = [0.1, 0.3, 0.3, 0.2, 0.1]
TAGS = ["red", "green", "blue", "amber", "violet", "teal", "ochre"]
USER_TYPES = {"rating": "number", "tag": "keyword", "event": "date", "favourite": "boolean"}
RARE_CAMERA = "Leica M6"


def metadata_docs(n: int = 800, dim: int = 8, seed: int = 5) -> list[Document]:
    """``synthetic_docs`` with metadata: dates over 2015-2024 (whole seconds; one in eight has
    none), four cameras (one picture a fifth), GPS within 40 km of one of four cities (two in
    five have none), the user's fields of each type (each present seven times in ten), folders
    of uneven sizes and one picture in nine with a copy under ``/backup``."""
    import dataclasses

    from d2s_search.metadata import Metadata

    rng = np.random.default_rng(seed)
    docs = synthetic_docs(n, dim=dim, seed=seed)
    start, end = 1420070400, 1735689600  # 2015-01-01 .. 2025-01-01 UTC
    out = []
    for i, d in enumerate(docs):
        taken = float(rng.integers(start, end)) if rng.random() > 0.125 else None
        camera = RARE_CAMERA if i == n // 2 else CAMERAS[int(rng.integers(len(CAMERAS)))] if rng.random() > 0.1 else None
        location = None
        if rng.random() < 0.6:
            lat, lon = list(CITIES.values())[int(rng.integers(len(CITIES)))]
            # within ~40 km of the centre
            location = (round(lat + float(rng.uniform(-0.3, 0.3)), 6), round(lon + float(rng.uniform(-0.3, 0.3)), 6))
        fields: dict = {}
        if rng.random() < 0.7:
            fields["rating"] = float(rng.integers(1, 11)) / 2
        if rng.random() < 0.7:
            fields["tag"] = TAGS[int(rng.integers(len(TAGS)))]
        if rng.random() < 0.7:
            fields["event"] = float(rng.integers(start, end) // 86400 * 86400)
        if rng.random() < 0.7:
            fields["favourite"] = bool(rng.random() < 0.3)
        folder = FOLDERS[int(rng.choice(len(FOLDERS), p=FOLDER_WEIGHTS))]
        path = f"{folder}/{i:04d}.jpg"
        copies = (f"/backup/{folder.rsplit('/', 1)[-1]}/{i:04d}.jpg",) if i % 9 == 4 else ()
        out.append(dataclasses.replace(d, path=path, copies=copies, width=640 + i % 7 * 320, height=480 + i % 5 * 100,
                                       metadata=Metadata(taken, camera, location, fields)))
    return out


def passes(docs: list[Document], f) -> list[Document]:
    """The documents a SearchFilter lets through (its reference definition)."""
    return [d for d in docs if f.allows(d.paths, d.metadata, d.width, d.height, d.size_bytes)]


def filtered_ranking(query: dict[str, float], docs: list[Document], f) -> list[tuple[str, float]]:
    """(id, Lucene score) of the passing documents that match, best first, ties by id."""
    out = [(d.id, s) for d in passes(docs, f) if (s := lucene_score(query, d.sparse)) is not None]
    return sorted(out, key=lambda x: (-x[1], x[0]))


def library_order(docs: list[Document], f) -> list[str]:
    """Ids in the library order: taken most recently first, undated last, then by id."""
    kept = passes(docs, f)
    return [d.id for d in sorted(kept, key=lambda d: (d.metadata.taken_at is None, -(d.metadata.taken_at or 0), d.id))]


def facet_counts(docs: list[Document], f, types: dict[str, str], size: int) -> dict[str, list[tuple[str, int]]]:
    """[(value, count)] by folder, camera and each keyword/boolean field: most first, ties by value."""
    from collections import Counter

    kept = passes(docs, f)
    counters: dict[str, Counter] = {"folder": Counter(), "camera": Counter()}
    names = sorted(n for n, t in types.items() if t in ("keyword", "boolean"))
    counters.update({n: Counter() for n in names})
    for d in kept:
        for folder in {p.rsplit("/", 1)[0] for p in d.paths}:
            counters["folder"][folder] += 1
        if d.metadata.camera:
            counters["camera"][d.metadata.camera] += 1
        for n in names:
            value = d.metadata.fields.get(n)
            if value is not None:
                counters[n][str(value).lower() if isinstance(value, bool) else value] += 1
    return {name: sorted(c.items(), key=lambda vc: (-vc[1], vc[0]))[:size] for name, c in counters.items()}
