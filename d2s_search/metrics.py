"""Retrieval, efficiency, semantic-deviation and faithfulness metrics (numpy/scipy only).

Used at runtime too, so no torch here. The numbers agree with ir_measures (tested), down
to its tie handling, which differs per measure: ``R@k`` comes from pytrec_eval, which
breaks equal scores by document id in *descending* string order, while ``MRR@10`` (RR@10)
comes from ir_measures' msmarco provider, which breaks them by id in *ascending* order.
:func:`evaluate_scores` computes exact ranks of the relevant documents over all scored
documents under both rules, so ``R@k = |relevant with rank <= k| / |relevant|`` and
``MRR@10 = 1 / best rank`` (0 beyond 10) equal what ir_measures reports for the full run.
Top-k lists (:func:`rank_topk`, used for overlap and runs) follow trec_eval's order.

Efficiency (docs/training.md, "Evaluation"): ``FLOPs = mean over (query, doc) of sum_j 1[q_j > 0] 1[d_j > 0]``,
computed exactly as ``sum_j n_q(j) n_d(j) / (|Q| |D|)`` where ``n_x(j)`` counts the vectors
that use term ``j``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp

RECALL_KS = (1, 5, 10)


# ----------------------------------------------------------------------------- ranking


def tie_order(doc_ids: Sequence[str] | None, n_docs: int) -> np.ndarray:
    """Column permutation putting documents in trec_eval's tie order (id descending)."""
    if doc_ids is None:
        doc_ids = [str(i) for i in range(n_docs)]
    ids = np.asarray([str(d) for d in doc_ids])
    return np.argsort(ids, kind="stable")[::-1].copy()


def rank_topk(
    scores: np.ndarray | Callable[[int, int], np.ndarray],
    k: int,
    n_queries: int | None = None,
    doc_ids: Sequence[str] | None = None,
    chunk: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` document indices and scores per query, trec_eval tie order.

    ``scores`` is a (Q, D) array or a function ``(start, stop) -> scores[start:stop]`` so
    large runs are scored in chunks.
    """
    get, n_queries = _score_source(scores, n_queries)

    idx_out: list[np.ndarray] = []
    val_out: list[np.ndarray] = []
    perm = None
    for start in range(0, n_queries, chunk):
        block = np.asarray(get(start, min(start + chunk, n_queries)), dtype=np.float64)
        n_docs = block.shape[1]
        kk = min(k, n_docs)
        if perm is None:
            perm = tie_order(doc_ids, n_docs)
        block = block[:, perm]
        idx = np.empty((len(block), kk), dtype=np.int64)
        val = np.empty((len(block), kk), dtype=np.float64)
        if kk == 0:
            idx_out.append(idx)
            val_out.append(val)
            continue
        kth = -np.partition(-block, kk - 1, axis=1)[:, kk - 1]
        for r in range(len(block)):
            cand = np.flatnonzero(block[r] >= kth[r])
            # stable sort: equal scores keep the tie order of the permuted columns
            order = cand[np.argsort(-block[r, cand], kind="stable")[:kk]]
            idx[r] = perm[order]
            val[r] = block[r, order]
        idx_out.append(idx)
        val_out.append(val)
    if not idx_out:
        return np.zeros((0, k), np.int64), np.zeros((0, k))
    return np.vstack(idx_out), np.vstack(val_out)


# ----------------------------------------------------------------------------- effectiveness


def _tie_positions(doc_ids: Sequence[str] | None, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Position of every document in the descending-id and ascending-id tie orders."""
    order = tie_order(doc_ids, n_docs)  # descending ids
    desc = np.empty(n_docs, dtype=np.int64)
    desc[order] = np.arange(n_docs)
    return desc, (n_docs - 1) - desc


def relevant_ranks(row: np.ndarray, rel: np.ndarray, tie_pos: np.ndarray) -> np.ndarray:
    """1-based rank of each relevant document in a fully scored row under a tie order."""
    s_r = row[rel][:, None]
    greater = (row[None, :] > s_r).sum(axis=1)
    tied_before = ((row[None, :] == s_r) & (tie_pos[None, :] < tie_pos[rel][:, None])).sum(axis=1)
    return 1 + greater + tied_before


def evaluate_scores(
    scores: np.ndarray | Callable[[int, int], np.ndarray],
    qrels: Sequence[Sequence[int]],
    n_queries: int | None = None,
    doc_ids: Sequence[str] | None = None,
    depth: int = 10,
    ks: Sequence[int] = RECALL_KS,
    mrr_k: int = 10,
    chunk: int = 1024,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Top-``depth`` run and exact per-query R@k / MRR@k in one pass over the scores."""
    get, n_queries = _score_source(scores, n_queries)

    per_q = {f"R@{k}": np.zeros(n_queries) for k in ks}
    per_q[f"MRR@{mrr_k}"] = np.zeros(n_queries)
    idx_out, val_out = [], []
    pos = None
    for start in range(0, n_queries, chunk):
        block = np.asarray(get(start, min(start + chunk, n_queries)), dtype=np.float64)
        if pos is None:
            pos = _tie_positions(doc_ids, block.shape[1])
        i, v = rank_topk(block, depth, doc_ids=doc_ids, chunk=len(block) or 1)
        idx_out.append(i)
        val_out.append(v)
        for r, row in enumerate(block):
            q = start + r
            rel = np.unique(np.asarray(qrels[q], dtype=np.int64))
            if not len(rel):
                continue
            rank_desc = relevant_ranks(row, rel, pos[0])
            for k in ks:
                per_q[f"R@{k}"][q] = (rank_desc <= k).sum() / len(rel)
            best = relevant_ranks(row, rel, pos[1]).min()
            per_q[f"MRR@{mrr_k}"][q] = 1.0 / best if best <= mrr_k else 0.0
    idx = np.vstack(idx_out) if idx_out else np.zeros((0, depth), np.int64)
    val = np.vstack(val_out) if val_out else np.zeros((0, depth))
    return idx, val, per_q


def per_query_metrics(
    ranked: np.ndarray, qrels: Sequence[Sequence[int]], ks: Sequence[int] = RECALL_KS, mrr_k: int = 10
) -> dict[str, np.ndarray]:
    """Per-query R@k and MRR@k from ranked document indices (Q, >=max k)."""
    out = {f"R@{k}": np.zeros(len(ranked)) for k in ks}
    out[f"MRR@{mrr_k}"] = np.zeros(len(ranked))
    for q, row in enumerate(ranked):
        rel = set(int(x) for x in qrels[q])
        if not rel:
            continue
        hits = np.fromiter((int(d) in rel for d in row), dtype=bool, count=len(row))
        for k in ks:
            out[f"R@{k}"][q] = hits[:k].sum() / len(rel)
        first = np.flatnonzero(hits[:mrr_k])
        out[f"MRR@{mrr_k}"][q] = 1.0 / (first[0] + 1) if len(first) else 0.0
    return out


def aggregate(per_query: dict[str, np.ndarray]) -> dict[str, float]:
    return {k: float(v.mean()) if len(v) else float("nan") for k, v in per_query.items()}


def to_run(
    ranked: np.ndarray, scores: np.ndarray, query_ids: Sequence[str], doc_ids: Sequence[str]
) -> dict[str, dict[str, float]]:
    """A run in ir_measures' dict form ``{qid: {docid: score}}``."""
    return {
        str(query_ids[q]): {str(doc_ids[d]): float(s) for d, s in zip(ranked[q], scores[q], strict=True)}
        for q in range(len(ranked))
    }


def to_qrels(qrels: Sequence[Sequence[int]], query_ids, doc_ids) -> dict[str, dict[str, int]]:
    return {str(query_ids[q]): {str(doc_ids[d]): 1 for d in rel} for q, rel in enumerate(qrels)}


# ----------------------------------------------------------------------------- efficiency


def _as_csr(x) -> sp.csr_matrix:
    return x.tocsr() if sp.issparse(x) else sp.csr_matrix(np.asarray(x))


def flops(queries, docs) -> float:
    """Expected number of multiplications of a sparse dot product (see module doc)."""
    q, d = _as_csr(queries), _as_csr(docs)
    if q.shape[0] == 0 or d.shape[0] == 0:
        return 0.0
    n_q = np.bincount(q.indices[q.data > 0], minlength=q.shape[1]).astype(np.float64)
    n_d = np.bincount(d.indices[d.data > 0], minlength=d.shape[1]).astype(np.float64)
    return float(n_q @ n_d / (q.shape[0] * d.shape[0]))


def terms_per_vector(x) -> float:
    m = _as_csr(x)
    if m.shape[0] == 0:
        return 0.0
    return float((m.data > 0).sum() / m.shape[0])


# ----------------------------------------------------------------------------- semantic deviation


def _top_terms(row_idx: np.ndarray, row_val: np.ndarray, k: int) -> np.ndarray:
    pos = row_val > 0
    row_idx, row_val = row_idx[pos], row_val[pos]
    # weight descending, term id ascending for equal weights: deterministic
    order = np.lexsort((row_idx, -row_val))[:k]
    return row_idx[order]


def exact_at_k(queries, caption_tokens: Sequence[np.ndarray], k: int = 20) -> float:
    """The paper's Eq. 2: mean over queries of ``|top-k terms in the caption| / k``.

    Divided by ``k``, not by the number of positive terms, and every query counts: a vector
    with fewer than ``k`` active terms scores at most ``len / k``, an empty one 0.
    """
    m = _as_csr(queries)
    if m.shape[0] == 0:
        return float("nan")
    total = 0.0
    for q in range(m.shape[0]):
        s, e = m.indptr[q], m.indptr[q + 1]
        top = _top_terms(m.indices[s:e], m.data[s:e], k)
        total += np.isin(top, caption_tokens[q]).sum() / k
    return float(total / m.shape[0])


def semantic_at_k(
    queries, caption_tokens: Sequence[np.ndarray], static_emb: np.ndarray, k: int = 20
) -> float:
    """Eq. 2's Semantic@k: mean over queries of ``sum over top-k terms of the max cosine to a
    caption token, / k`` (missing terms and empty vectors add 0, as in Exact@k)."""
    m = _as_csr(queries)
    if m.shape[0] == 0:
        return float("nan")
    norms = np.linalg.norm(static_emb, axis=1, keepdims=True)
    emb = static_emb / np.maximum(norms, 1e-12)
    total = 0.0
    for q in range(m.shape[0]):
        s, e = m.indptr[q], m.indptr[q + 1]
        top = _top_terms(m.indices[s:e], m.data[s:e], k)
        toks = np.asarray(caption_tokens[q], dtype=np.int64)
        if len(top) and len(toks):
            total += (emb[top] @ emb[toks].T).max(axis=1).sum() / k
    return float(total / m.shape[0])


# ----------------------------------------------------------------------------- co-activation


def active_share(x) -> np.ndarray:
    """Per term: the share of rows (vectors) in which it is active (weight > 0)."""
    m = _as_csr(x)
    if m.shape[0] == 0:
        return np.zeros(m.shape[1])
    return np.bincount(m.indices[m.data > 0], minlength=m.shape[1]) / m.shape[0]


def foreign_active_share(queries, query_tokens: Sequence[np.ndarray]) -> np.ndarray:
    """Per term: the share of queries in which it is active although it is not one of the
    query's own tokens (an expansion term)."""
    m = _as_csr(queries)
    counts = np.zeros(m.shape[1])
    for q in range(m.shape[0]):
        s, e = m.indptr[q], m.indptr[q + 1]
        idx = m.indices[s:e][m.data[s:e] > 0]
        counts[idx[~np.isin(idx, query_tokens[q])]] += 1
    return counts / max(m.shape[0], 1)


def coactivation_report(
    queries,
    docs,
    query_tokens: Sequence[np.ndarray] | None = None,
    term_names: Sequence[str] | None = None,
    top: int = 20,
    common_doc_share: float = 0.5,
) -> dict:
    """Which terms fire everywhere, and what they cost.

    A term's contribution to FLOPs is ``share_q(j) * share_d(j)`` (the mean over pairs of
    both being active), so the terms listed are exactly the ones that cost the most.
    ``flops_share_common_terms``: the share of FLOPs from terms active in more than
    ``common_doc_share`` of the documents. With ``query_tokens``, also the largest share of
    queries in which one term is active without being one of the query's own words.
    """
    sq, sd = active_share(queries), active_share(docs)
    per_term = sq * sd
    total = float(per_term.sum())
    name = (lambda j: str(term_names[j])) if term_names is not None else (lambda j: str(j))
    order = [j for j in np.argsort(-per_term, kind="stable")[:top] if per_term[j] > 0]
    common = sd > common_doc_share
    out = {
        "top_coactivated": [
            {"term": name(j), "id": int(j), "query_share": float(sq[j]), "doc_share": float(sd[j]),
             "flops": float(per_term[j])}
            for j in order
        ],
        "flops_share_common_terms": float(per_term[common].sum() / total) if total > 0 else 0.0,
        "common_terms": int(common.sum()),
        "terms_in_half_of_queries": int((sq > 0.5).sum()),
    }
    if query_tokens is not None:
        fq = foreign_active_share(queries, query_tokens)
        j = int(np.argmax(fq)) if len(fq) else 0
        out["max_foreign_query_share"] = float(fq[j]) if len(fq) else 0.0
        out["max_foreign_query_term"] = name(j) if len(fq) and fq[j] > 0 else None
        out["foreign_terms_over_30pct"] = int((fq > 0.3).sum())
    return out


# ----------------------------------------------------------------------------- faithfulness


def topk_overlap(ranked_a: np.ndarray, ranked_b: np.ndarray, k: int = 10) -> float:
    """Mean share of the top-k documents two runs have in common."""
    if len(ranked_a) == 0:
        return float("nan")
    shared = [len(set(a[:k].tolist()) & set(b[:k].tolist())) / k for a, b in zip(ranked_a, ranked_b, strict=True)]
    return float(np.mean(shared))


def per_query_correlation(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    """Pearson correlation of per-query metric values between two runs (nan if constant)."""
    out = {}
    for name in a:
        x, y = np.asarray(a[name], float), np.asarray(b[name], float)
        if len(x) < 2 or x.std() == 0 or y.std() == 0:
            out[name] = float("nan")
        else:
            out[name] = float(np.corrcoef(x, y)[0, 1])
    return out


def mean_kendall_tau(
    ranked_a: np.ndarray, scores_a: np.ndarray, ranked_b: np.ndarray, scores_b: np.ndarray
) -> float:
    """The authors' faithfulness number: Kendall tau of the two runs' scores over the
    documents both top lists contain, averaged over queries (nan-skipping)."""
    from scipy.stats import kendalltau

    taus = []
    for ra, sa, rb, sb in zip(ranked_a, scores_a, ranked_b, scores_b, strict=True):
        da = dict(zip(ra.tolist(), sa.tolist(), strict=True))
        db = dict(zip(rb.tolist(), sb.tolist(), strict=True))
        common = sorted(set(da) & set(db))
        if len(common) >= 2:
            t = kendalltau([da[c] for c in common], [db[c] for c in common]).statistic
            taus.append(t)
    taus = np.asarray(taus, dtype=float)
    return float(np.nanmean(taus)) if len(taus) and not np.all(np.isnan(taus)) else float("nan")


def _score_source(scores, n_queries: int | None):
    """(``get(start, stop)`` -> score rows, number of queries) for an array or a score function."""
    if callable(scores):
        if n_queries is None:
            raise ValueError("n_queries is needed with a score function")
        return scores, n_queries
    arr = np.asarray(scores)
    return (lambda a, b: arr[a:b]), arr.shape[0]
