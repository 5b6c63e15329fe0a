"""Validation during and after training: encode a split's captions as queries and its images
as documents the way search will, and measure R@k, MRR@10 and FLOPs; optionally over a larger
collection (the validation images plus distractors, e.g. training images: a few hundred
validation images alone saturate R@1; docs/design-decisions.md, "Calibration against a larger
collection").
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from d2s_onnx_export.head import SparseHead

from d2s_search import metrics as M
from d2s_search.train.data import PairSplit
from d2s_search.train.modeling import encode_sparse
from d2s_search.train.vocab import CaptionTokens

MAX_DISTRACTORS = 4000  # bounds the calibration's cost on large training sets (8 shifts x the pool)


def pick_distractors(image_emb: np.ndarray, caption_image: np.ndarray, limit: int = MAX_DISTRACTORS,
                     seed: int = 0) -> np.ndarray:
    """Up to ``limit`` of the images the training captions use (all of them below the limit,
    else a seeded sample), as extra documents for calibration."""
    used = np.unique(caption_image)
    if limit <= 0:
        return np.empty((0, image_emb.shape[1]), dtype=image_emb.dtype)
    if len(used) > limit:
        used = np.sort(np.random.default_rng(seed).choice(used, size=limit, replace=False))
    return np.asarray(image_emb)[used]


def check_distractors(distractors: np.ndarray, dim: int, error: type[Exception] = ValueError) -> None:
    """Refuse distractors that are not a matrix of ``dim``-d image vectors."""
    if distractors.ndim != 2 or distractors.shape[1] != dim:
        raise error(f"distractors must be (n, {dim}) vectors, got {distractors.shape}")


def with_distractors(split: PairSplit, distractors: np.ndarray) -> PairSplit:
    """The split's captions against its own images followed by ``distractors`` (image vectors no
    caption points to): the same relevance judgements over a larger collection."""
    check_distractors(distractors, split.image_emb.shape[1])
    ids = list(split.image_ids) + [f"distractor:{i}" for i in range(len(distractors))]
    images = np.concatenate([split.image_emb, distractors.astype(split.image_emb.dtype, copy=False)])
    return PairSplit(split.name, split.caption_ids, split.captions, split.text_emb, ids, images,
                     split.caption_image)


def pool_documents(head: SparseHead, docs: sp.csr_matrix, distractors: np.ndarray, device: torch.device,
                   batch_size: int = 1024) -> sp.csr_matrix:
    """The documents of :func:`with_distractors`' collection: the split's images, already encoded
    as ``docs``, over the distractors encoded as documents (the split's images are not encoded
    twice)."""
    extra = encode_sparse(head, np.asarray(distractors, dtype=np.float32), batch_size, device=device, document=True)
    return sp.vstack([docs, extra], format="csr")


def query_mask_for(mode: str) -> str:
    """How queries must be encoded at search time for a head trained with ``mode``."""
    return "own_tokens" if mode == "0" else "none"


def validate(
    head: SparseHead,
    split: PairSplit,
    tokens: CaptionTokens | None,
    mode: str,
    device: torch.device,
    batch_size: int = 1024,
    distractors: np.ndarray | None = None,
) -> dict:
    """Sparse text->image R@1/R@5/R@10/MRR@10 and FLOPs on a split; with ``distractors``
    (dense image vectors) also ``R@1_pool``, against the split's images and them."""
    q = validation_queries(head, split, tokens, mode, device, batch_size)
    docs = validation_documents(head, split, device, batch_size)
    metrics = validation_metrics(q, docs, split)
    if distractors is not None and len(distractors):
        pool = with_distractors(split, distractors)
        metrics["R@1_pool"] = validation_metrics(q, pool_documents(head, docs, distractors, device, batch_size),
                                                 pool)["R@1"]
    return metrics


def validation_queries(head: SparseHead, split: PairSplit, tokens: CaptionTokens | None, mode: str,
                       device: torch.device, batch_size: int = 1024) -> sp.csr_matrix:
    """The split's captions as the head encodes queries (masked for exp=0, own words boosted)."""
    mask = tokens if query_mask_for(mode) == "own_tokens" else None
    q = encode_sparse(head, split.text_emb, batch_size, mask_tokens=mask, device=device)
    if head.config.query_word_boost and tokens is not None:
        from d2s_search.evaluate import boost_own_words

        boosted = tokens.boosted()  # the typed words, as the exported text graph boosts them
        q = boost_own_words(q, [boosted.row(i) for i in range(len(boosted))], head.allowed.cpu().numpy() > 0,
                            head.config.query_word_boost)
    return q


def validation_documents(head: SparseHead, split: PairSplit, device: torch.device,
                         batch_size: int = 1024) -> sp.csr_matrix:
    """The split's images as the head encodes documents (with its document shift)."""
    return encode_sparse(head, split.image_emb, batch_size, device=device, document=True)


def validation_metrics(q: sp.csr_matrix, d: sp.csr_matrix, split: PairSplit) -> dict:
    """R@1/R@5/R@10/MRR@10, FLOPs and terms per vector of encoded queries against documents."""
    dt = d.T.tocsc()
    _, _, per_q = M.evaluate_scores(
        lambda a, b: np.asarray((q[a:b] @ dt).todense()), split.qrels(), q.shape[0], split.image_ids
    )
    out = M.aggregate(per_q)
    out["FLOPs"] = M.flops(q, d)
    out["terms_per_query"] = M.terms_per_vector(q)
    out["terms_per_image"] = M.terms_per_vector(d)
    return out


def validation_subset(split: PairSplit | None, tokens: CaptionTokens | None,
                      images: int) -> tuple[PairSplit | None, CaptionTokens | None]:
    """The first ``images`` images of a validation split and their captions' tokens (0: all)."""
    if split is None or not images or len(split.image_ids) <= images:
        return split, tokens
    keep = split.caption_image < images
    return split.head(images), tokens.subset(np.flatnonzero(keep)) if tokens is not None else None
