"""A small picture collection encoded by the tiny bundle, shared by the server-side tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

from PIL import Image

from d2s_search.backends.base import Document
from d2s_search.serve.image_urls import url_builder
from tests.helpers import write_image

TEXTS = ["a dog sitting in the back seat of a car", "people walking down a busy street", "snow"]
# Few terms keep osmem fast; the tiny untrained head gives thousands per text and picture.
QUERY_TERMS = 64
DOC_TERMS = 300
URL_BASE = "http://127.0.0.1:8765/"


def make_documents(encoder, root: Path, n: int = 12) -> list[Document]:
    """``n`` pictures in two folders, encoded, with URLs as ``ingest --url-base`` stores them."""
    paths = [write_image(root / ("a" if i % 2 else "b") / f"p {i}.jpg", seed=100 + i) for i in range(n)]
    url_for = url_builder(URL_BASE, [root])
    dense, sparse = encoder.encode_images([Image.open(p) for p in paths])
    return [
        Document(id=hashlib.sha256(p.read_bytes()).hexdigest(), path=str(p), size_bytes=p.stat().st_size,
                 width=96, height=72, sparse=encoder.to_terms(sparse[i], top_k=DOC_TERMS), dense=dense[i],
                 url=url_for(p), ingested_at=1_700_000_000.0)
        for i, p in enumerate(paths)
    ]


def client_query(encoder, package, text: str) -> dict[str, float]:
    """What the packaged model gives the cluster: queryable terms, the strongest ``max_terms``."""
    dropped = {t for terms in package.dropped_terms.values() for t in terms}
    full = {t: w for t, w in encoder.to_terms(encoder.encode_texts([text]).sparse[0]).items() if t not in dropped}
    return dict(sorted(full.items(), key=lambda tw: (-tw[1], tw[0]))[: package.max_terms])
