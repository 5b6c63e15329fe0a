"""After training: how many more words the images keep than the queries, and how much a
query's own words weigh.

A trained head settles at a few FLOPs (the FLOPS regulariser at the recipe's eta gives 2-4);
the terms just below its threshold still carry meaning. Adding a constant to the document
(image) side's vocabulary scores keeps them: the ranking of each image's terms is unchanged
(the words it shows stay the same), the query side is untouched (its words and co-activation
too), and recall rises with the extra postings (docs/design-decisions.md, "The document shift").

:func:`choose_document_shift` picks the shift with the best validation R@1 among those whose
validation FLOPs stay within a budget; ties go to the smaller shift. R@1 is measured against the
validation images plus *distractors* (``train`` passes up to 4,000 training images): against a
few hundred validation images alone R@1 saturates and stays flat over the shifts while a larger
collection's R@1 still rises with them; with the training images beside them the validation
curve has the test curve's shape (docs/design-decisions.md, "Calibration against a larger
collection"). FLOPs are measured on the
validation images alone (held out, like a user's collection). With ``boosts`` it
also chooses the head's ``query_word_boost``: added at a query's own allowed tokens, so the
words a user typed are always among its terms (and weigh at least the boost); on the caption
benchmark it raised R@1 and Exact@20 at the same FLOPs (docs/design-decisions.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from d2s_onnx_export.head import SparseHead

from d2s_search.train.validation import (
    pool_documents,
    validation_documents,
    validation_metrics,
    validation_queries,
    with_distractors,
)

SHIFTS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
BOOSTS = (0.0, 0.5, 1.0, 2.0)
# Tried with an images' terms cap: it leaves FLOPs of the budget unused, which more (fainter)
# query terms spend (docs/design-decisions.md, "The query shift").
QUERY_SHIFTS = (0.0, 0.5, 1.0)


@dataclass
class ShiftChoice:
    shift: float
    table: list[dict]  # per setting tried: shift, boost, R@1, FLOPs, terms_per_image, within_budget
    boost: float = 0.0
    distractors: int = 0
    query_shift: float = 0.0

    def to_json(self) -> dict:
        return {"document_shift": self.shift, "query_word_boost": self.boost, "query_shift": self.query_shift,
                "distractors": self.distractors, "tried": self.table}


def choose_document_shift(head: SparseHead, split, tokens, mode: str, flops_budget: float,
                          device: str | torch.device = "cpu", shifts: tuple[float, ...] = SHIFTS,
                          batch_size: int = 1024, boosts: tuple[float, ...] = (0.0,),
                          distractors: np.ndarray | None = None,
                          query_shifts: tuple[float, ...] = (0.0,)) -> ShiftChoice:
    """Set ``head.config.document_shift`` and ``query_word_boost`` to the pair with the best
    R@1 on ``split`` (validation pairs; ``tokens`` their captions' token ids) within
    ``flops_budget``, ties to the smaller shift, then the smaller boost. A single boost is
    kept as given (only the shift is chosen). When none fits (or the budget is 0): no shift
    and the smallest boost. With ``distractors`` (dense image vectors), R@1 is measured against
    the validation images and them (each row's ``R@1``; ``R@1_own``: the validation images
    alone); FLOPs always on the validation images. With ``query_shifts`` the head's
    ``query_shift`` is chosen too (ties to the smaller). Returns the choice and what every
    setting measured."""
    device = torch.device(device)
    shifts = sorted(set(float(s) for s in shifts) | {0.0})
    boosts = sorted(set(float(b) for b in boosts)) or [0.0]
    query_shifts = sorted(set(float(q) for q in query_shifts)) or [0.0]
    # Queries depend on the boost and query shift only, documents on the shift only: each side
    # encoded once per value.
    queries = {}
    for boost in boosts:
        for qshift in query_shifts:
            head.config.query_word_boost, head.config.query_shift = boost, qshift
            queries[boost, qshift] = validation_queries(head, split, tokens, mode, device, batch_size)
    pool = with_distractors(split, distractors) if distractors is not None and len(distractors) else None
    table = []
    best: dict | None = None
    for shift in shifts:
        head.config.document_shift = shift
        docs = validation_documents(head, split, device, batch_size)
        pool_docs = pool_documents(head, docs, distractors, device, batch_size) if pool is not None else None
        for boost, qshift in queries:
            m = validation_metrics(queries[boost, qshift], docs, split)
            row = {"shift": shift, "boost": boost, "R@1": m["R@1"], "FLOPs": m["FLOPs"],
                   "terms_per_image": m["terms_per_image"],
                   "within_budget": bool(flops_budget > 0 and m["FLOPs"] <= flops_budget)}
            if len(query_shifts) > 1:
                row["query_shift"] = qshift
            if pool is not None:
                row["R@1_own"] = row["R@1"]
                row["R@1"] = validation_metrics(queries[boost, qshift], pool_docs, pool)["R@1"]
            table.append(row)
            if row["within_budget"] and (best is None or row["R@1"] > best["R@1"]):
                best = row
    head.config.document_shift = best["shift"] if best is not None else 0.0
    head.config.query_word_boost = best["boost"] if best is not None else boosts[0]
    head.config.query_shift = best.get("query_shift", query_shifts[0]) if best is not None else 0.0
    return ShiftChoice(head.config.document_shift, table, head.config.query_word_boost,
                       0 if pool is None else len(pool.image_ids) - len(split.image_ids), head.config.query_shift)


MAX_IMAGE_SHARE = 0.4


def caption_share(caption_image: np.ndarray, tokens, n_images: int, vocab_size: int) -> np.ndarray:
    """Per term: the share of images whose captions contain it (``tokens``: the captions'
    token ids, ``caption_image`` each caption's image)."""
    seen = np.zeros(vocab_size, dtype=np.int64)
    rows = [set() for _ in range(n_images)]
    for caption, image in enumerate(caption_image):
        rows[int(image)].update(tokens.row(caption).tolist())
    for ids in rows:
        if ids:
            seen[np.fromiter(ids, dtype=np.int64)] += 1
    return seen / max(n_images, 1)


def choose_document_floors(head: SparseHead, split, tokens, max_share: float = MAX_IMAGE_SHARE,
                           device: str | torch.device = "cpu", batch_size: int = 1024) -> dict[int, float]:
    """Set ``head.config.document_floors`` so that no term is on more than ``max_share`` of
    ``split``'s images (with the head's shift and terms cap) unless its captions use it on
    more: for such a term, the floor is its weight on the image at that share, so only the
    images where it weighs more keep it. Returns the floors (empty: none needed)."""
    from d2s_search.metrics import active_share
    from d2s_search.train.modeling import encode_sparse

    head.config.document_floors = {}
    head.floor.zero_()
    docs = encode_sparse(head, split.image_emb, batch_size, device=device, document=True).tocsc()
    n = docs.shape[0]
    allowed = np.maximum(max_share, caption_share(split.caption_image, tokens, n, docs.shape[1]))
    floors: dict[int, float] = {}
    for term in np.flatnonzero(active_share(docs) > allowed).tolist():
        weights = np.sort(docs.data[docs.indptr[term] : docs.indptr[term + 1]])[::-1]
        keep = int(allowed[term] * n)  # images that may keep it: those weighing more than the next one
        floors[term] = float(weights[keep])
    head.config.document_floors = floors
    for term, weight in floors.items():
        head.floor[term] = weight
    return floors


def calibrate_trained_head(head: SparseHead, val, val_tokens, mode: str, flops_budget: float, boost: float,
                           train_split, train_tokens, distractors: int, document_terms: int, max_share: float,
                           device: str | torch.device = "cpu", seed: int = 0) -> dict:
    """What ``train`` does after its last epoch: with the query word boost and the images'
    most terms set, the document and query shifts with the best validation R@1 (against the
    validation images and up to ``distractors`` of ``train_split``'s) within the FLOPs budget,
    then, with ``max_share`` > 0, the floors of terms on more of the training images
    (``train_tokens``: their captions' token ids). Sets them on ``head``; returns the choice."""
    from d2s_search.train.validation import pick_distractors

    extra = pick_distractors(train_split.image_emb, train_split.caption_image, distractors, seed)
    head.config.document_terms = document_terms
    choice = choose_document_shift(head, val, val_tokens, mode, flops_budget, device, boosts=(boost,),
                                   distractors=extra, query_shifts=QUERY_SHIFTS).to_json()
    if max_share > 0:
        choice["document_floors"] = len(choose_document_floors(head, train_split, train_tokens, max_share, device))
    return choice
