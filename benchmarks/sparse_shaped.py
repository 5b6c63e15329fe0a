"""A real-shaped sparse collection: the offline-mini head's own image-side vectors, tiled with
small perturbations to any size (123,000 or 1,000,000 documents), and held-out captions through
the same bundle's text side as queries.

Sources: the flickr8k-800 photos' sparse vectors as the quick start's index stored them
(``photos-800/index``). The synthetic generator (``synthetic.py``) draws weights that do not
depend on how many documents carry a term and gives documents ~110 terms; the head's weights
rise with a term's document frequency and a photo carries ~375 terms, so a search's work per
query (posting lengths times the weights that decide pruning) differs.

Each document is a copy of one source (sources in a shuffled order, each used about n / 800
times) with its weights multiplied by log-normal noise (``SIGMA``), each term dropped with
probability ``CHURN``, and about as many terms added as were dropped, drawn as whole postings
of the sources (a term with probability proportional to its document frequency, its weight one
that term carries in some photo): terms per document, the weight-vs-document-frequency
correlation and the document-frequency distribution (as a share of the collection) stay the
sources'. Queries: the flickr8k-800 captions, never used to make a document. Deterministic
per seed.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import CACHE, DATA

from d2s_search.backends.local import row_blobs

PHOTOS = CACHE / "photos-800"
SIGMA = 0.3  # log-normal sigma of a copy's weight noise
CHURN = 0.1  # share of a copy's terms dropped (and about as many added)

Sparse = tuple[np.ndarray, np.ndarray]  # (term ids, sorted ascending; float32 weights)


def read_index(path: Path) -> tuple[list[str], list[Sparse]]:
    """(vocabulary by term id, stored sparse vectors) of a local index's SQLite file."""
    db = sqlite3.connect(f"file:{path / 'index.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, term FROM terms").fetchall()
        vocab = [""] * (max(i for i, _ in rows) + 1)
        for i, term in rows:
            vocab[i] = term
        docs = []
        for ids, weights in db.execute("SELECT term_ids, weights FROM docs ORDER BY seq"):
            w = np.frombuffer(weights, dtype="<f4")
            t = row_blobs.decode_term_ids(ids, w.nbytes)  # 16- or 32-bit, as the index stored them
            order = np.argsort(t, kind="stable")
            docs.append((t[order].astype(np.int32), w[order].astype(np.float32)))
    finally:
        db.close()
    return vocab, docs


def tile(sources: list[Sparse], n: int, seed: int = 0, sigma: float = SIGMA, churn: float = CHURN) -> list[Sparse]:
    """``n`` perturbed copies of ``sources`` (see the module's docstring); the source of copy
    ``i`` is ``source_of(len(sources), n, seed)[i]``."""
    rng = np.random.default_rng(seed)
    order = source_of(len(sources), n, seed)
    # Every posting of the sources: drawing one uniformly draws a term by its document
    # frequency together with a weight that term really carries.
    pool_terms = np.concatenate([t for t, _ in sources])
    pool_weights = np.concatenate([w for _, w in sources])
    out: list[Sparse] = []
    for src in order.tolist():
        terms, weights = sources[src]
        keep = rng.random(terms.size) >= churn
        added = rng.integers(0, pool_terms.size, size=rng.poisson(churn * terms.size))
        t = np.concatenate([terms[keep], pool_terms[added]])
        w = np.concatenate([weights[keep], pool_weights[added]])
        t, first = np.unique(t, return_index=True)  # an added term the copy already has: kept once
        w = w[first] * np.exp(sigma * rng.standard_normal(t.size) - sigma * sigma / 2)
        out.append((t.astype(np.int32), w.astype(np.float32)))
    return out


def source_of(n_sources: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, 1]).permutation(n) % n_sources


@dataclass
class Shape:
    docs: int
    terms_per_doc: float  # mean
    terms_p10_p50_p90: tuple[int, int, int]
    weight_df_spearman: float  # over terms: a term's mean weight against its document frequency
    distinct_terms: int
    top100_posting_share: float  # postings held by the 100 most frequent terms
    df_share_p50_p99_max: tuple[float, float, float]  # df / docs over the terms present

    def row(self) -> list[object]:
        return [f"{self.docs:,}", f"{self.terms_per_doc:.0f}", " / ".join(map(str, self.terms_p10_p50_p90)),
                f"{self.weight_df_spearman:+.2f}", f"{self.distinct_terms:,}", f"{self.top100_posting_share:.2f}",
                " / ".join(f"{v:.3f}" for v in self.df_share_p50_p99_max)]


SHAPE_HEADERS = ["documents", "terms a document", "p10 / p50 / p90", "Spearman(mean weight, df)", "distinct terms",
                 "postings in top 100 terms", "df / documents p50 / p99 / max"]


def shape(docs: list[Sparse]) -> Shape:
    """The three statistics the collection keeps: terms per document, the weight-df
    correlation, the df distribution."""
    from scipy.stats import spearmanr

    terms = np.concatenate([t for t, _ in docs])
    weights = np.concatenate([w for _, w in docs]).astype(np.float64)
    lengths = np.array([t.size for t, _ in docs])
    df = np.bincount(terms)
    total = np.bincount(terms, weights=weights)
    present = np.flatnonzero(df)
    rho = float(spearmanr(df[present], total[present] / df[present]).statistic)
    share = np.sort(df[present])[::-1] / len(docs)
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90]).round().astype(int).tolist()
    return Shape(len(docs), float(lengths.mean()), (p10, p50, p90), rho, int(present.size),
                 float(share[:100].sum() * len(docs) / terms.size),
                 (float(np.median(share)), float(np.percentile(share, 99)), float(share[0])))


def _encoder():
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder

    return Encoder(Bundle.load(PHOTOS / "bundle"), device="cpu", threads=1)


def queries(limit: int | None = None) -> list[dict[str, float]]:
    """The flickr8k-800 captions' sparse query vectors (the bundle's text side, as ``query``
    searches), cached under ``.cache/sparse-shaped``."""
    out = CACHE / "sparse-shaped" / "flickr8k-800-queries.json"
    if not out.is_file():
        from d2s_search.search import encode_text_query

        with open(DATA / "flickr8k-800" / "captions.txt", newline="") as f:
            captions = [r["caption"] for r in csv.DictReader(f)]
        # One caption a photo is enough queries; spread over the photos in a fixed order.
        captions = captions[::5]
        encoder = _encoder()
        vectors = [encode_text_query(encoder, c, edits=False).full for c in captions]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(vectors))
    vectors = json.loads(out.read_text())
    return vectors[:limit] if limit else vectors


def caption_documents(count: int = 2000) -> tuple[list[str], list[Sparse]]:
    """Karpathy captions through the text side as stand-in documents (to compare their shape
    with the photos'), cached under ``.cache/sparse-shaped``."""
    out = CACHE / "sparse-shaped" / f"karpathy-{count}-text-side.json"
    if not out.is_file():
        texts = [line.strip() for line in (DATA / "karpathy-captions" / "coco_precomp_dev_caps.txt").open()]
        texts = [t for t in texts if t][:count]
        encoder = _encoder()
        vectors = []
        for i in range(0, len(texts), 64):
            enc = encoder.encode_texts(texts[i : i + 64])
            vectors += [encoder.to_terms(row) for row in enc.sparse]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(vectors))
    vectors = json.loads(out.read_text())
    vocab = sorted({t for v in vectors for t in v})
    col = {t: i for i, t in enumerate(vocab)}
    docs = []
    for v in vectors:
        ids = np.array([col[t] for t in v], dtype=np.int32)
        order = np.argsort(ids)
        docs.append((ids[order], np.array(list(v.values()), dtype=np.float32)[order]))
    return vocab, docs
