import ir_measures
import numpy as np
import pytest
import scipy.sparse as sp
from ir_measures import MRR, R

from d2s_search import metrics as M

DOCS = ["d0", "d1", "d2", "d3"]
QUERIES = ["q0", "q1", "q2"]
# q0: relevant d2 ranked 1st; q1: relevant d0 ranked 3rd; q2: relevant d1 tied with d3 for
# first place. ir_measures breaks that tie two ways: R@k (pytrec_eval) by doc id descending
# (d3 first -> R@1 = 0), RR@10 (its msmarco provider) by doc id ascending (d1 first -> 1).
SCORES = np.array(
    [
        [0.1, 0.2, 0.9, 0.3],
        [0.5, 0.8, 0.1, 0.7],
        [0.0, 0.6, 0.2, 0.6],
    ]
)
QRELS = [[2], [0], [1]]


def test_toy_run_hand_computed():
    idx, val = M.rank_topk(SCORES, 10, doc_ids=DOCS)
    assert idx.tolist() == [[2, 3, 1, 0], [1, 3, 0, 2], [3, 1, 2, 0]]
    agg = M.aggregate(M.per_query_metrics(idx, QRELS))  # from the ranked list alone
    assert agg["R@1"] == pytest.approx(1 / 3)
    assert agg["R@5"] == pytest.approx(1.0)
    assert agg["MRR@10"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)
    idx2, _, pq = M.evaluate_scores(SCORES, QRELS, doc_ids=DOCS)
    np.testing.assert_array_equal(idx2, idx)
    assert pq["R@1"].tolist() == [1.0, 0.0, 0.0]
    assert pq["MRR@10"].tolist() == pytest.approx([1.0, 1 / 3, 1.0])


def _ir(idx, val, qrels, qids, dids):
    run = M.to_run(idx, val, qids, dids)
    qr = M.to_qrels(qrels, qids, dids)
    agg = ir_measures.calc_aggregate([R @ 1, R @ 5, R @ 10, MRR @ 10], qr, run)
    return {str(k).replace("RR@", "MRR@"): v for k, v in agg.items()}


def _full(scores):
    n_q, n_d = scores.shape
    return np.tile(np.arange(n_d), (n_q, 1)), scores  # every document, so ties are all there


def test_agrees_with_ir_measures_on_toy_and_random_runs_with_ties():
    _, _, pq = M.evaluate_scores(SCORES, QRELS, doc_ids=DOCS)
    ours = M.aggregate(pq)
    theirs = _ir(*_full(SCORES), QRELS, QUERIES, DOCS)
    for k in ("R@1", "R@5", "R@10", "MRR@10"):
        assert ours[k] == pytest.approx(theirs[k])
    rng = np.random.default_rng(0)
    n_q, n_d = 80, 40
    scores = np.round(rng.random((n_q, n_d)), 1)  # coarse -> many ties
    dids = [f"img{rng.integers(10**6):06d}" for _ in range(n_d)]
    qrels = [rng.choice(n_d, size=rng.integers(1, 3), replace=False) for _ in range(n_q)]
    _, _, pq = M.evaluate_scores(lambda a, b: scores[a:b], qrels, n_q, dids, chunk=7)
    ours = M.aggregate(pq)
    theirs = _ir(*_full(scores), qrels, [f"q{i}" for i in range(n_q)], dids)
    for k in ("R@1", "R@5", "R@10", "MRR@10"):
        assert ours[k] == pytest.approx(theirs[k]), k
    # a top-10 run without ties gives the same numbers as the full run
    smooth = rng.random((n_q, n_d))
    idx, val, pq = M.evaluate_scores(smooth, qrels, doc_ids=dids)
    theirs = _ir(idx, val, qrels, [f"q{i}" for i in range(n_q)], dids)
    for k in ("R@1", "R@5", "R@10", "MRR@10"):
        assert M.aggregate(pq)[k] == pytest.approx(theirs[k]), k


def test_rank_topk_chunks_and_callable():
    rng = np.random.default_rng(1)
    s = rng.random((33, 12))
    a = M.rank_topk(s, 5)
    b = M.rank_topk(lambda lo, hi: s[lo:hi], 5, n_queries=33, chunk=4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[0][:, 0], np.argmax(s, 1))


def test_flops_terms_exact_semantic_by_hand():
    q = sp.csr_matrix(np.array([[1.0, 0, 2, 0], [0, 0, 1, 1]]))
    d = sp.csr_matrix(np.array([[1.0, 1, 0, 0], [0, 0, 3, 0], [1, 0, 1, 1]]))
    # overlaps: q0-d0 1, q0-d1 1, q0-d2 2, q1-d0 0, q1-d1 1, q1-d2 2 -> 7 / 6
    assert M.flops(q, d) == pytest.approx(7 / 6)
    assert M.terms_per_vector(q) == 2.0 and M.terms_per_vector(d) == 2.0
    qv = sp.csr_matrix(np.array([[0.5, 3.0, 2.0, 1.0], [0.0, 0, 0, 0], [0, 0, 1.0, 0]]))
    toks = [np.array([1, 3]), np.array([0]), np.array([0])]
    # Eq. 2 divides by k and counts every query: q0 top-2 = terms 1 (3.0), 2 (2.0), 1 in the
    # caption -> 1/2; q1 is empty -> 0; q2 has one term, not in the caption -> 0/2.  Mean 1/6.
    assert M.exact_at_k(qv, toks, k=2) == pytest.approx(1 / 6)
    # k larger than any vector: q0 has 4 terms, 2 of them (1, 3) in the caption -> 2/10.
    assert M.exact_at_k(qv, toks, k=10) == pytest.approx((2 / 10 + 0 + 0) / 3)
    emb = np.array([[1.0, 0], [0, 1.0], [1.0, 1.0], [0, 2.0]])
    # q0 top-2 terms 1,2 vs caption {1,3}: term1 max cos 1; term2 max cos(45deg)=0.7071 -> /2
    # q1 empty -> 0; q2 term 2 vs caption {0}: 0.7071, divided by k=2.
    c = np.sqrt(0.5)
    assert M.semantic_at_k(qv, toks, emb, k=2) == pytest.approx(((1 + c) / 2 + 0 + c / 2) / 3)


def test_exact_at_k_exp0_is_not_one():
    """The issue's case: own-token-only queries with fewer than k terms score below 1."""
    q = sp.csr_matrix(np.array([[1.0, 1.0, 0, 0, 0], [0, 0, 2.0, 1.0, 1.0]]))
    toks = [np.array([0, 1]), np.array([2, 3, 4])]
    assert M.exact_at_k(q, toks, k=20) == pytest.approx((2 / 20 + 3 / 20) / 2)


def test_coactivation_report_on_a_planted_example():
    rng = np.random.default_rng(0)
    n_q, n_d, v = 40, 50, 30
    q = (rng.random((n_q, v)) < 0.05).astype(float)
    d = (rng.random((n_d, v)) < 0.05).astype(float)
    q[:, 7] = 1.0  # planted: term 7 fires in every query ...
    d[:, 7] = 1.0  # ... and every document
    d[:, 9] = 1.0  # term 9 in every document but no query
    q[:, 9] = 0.0
    d[: n_d // 2, 3] = 0.0
    d[n_d // 2 :, 3] = 2.0  # term 3 in exactly half of the documents: not "common"
    toks = [np.array([1, 2]) for _ in range(n_q)]
    names = [f"t{j}" for j in range(v)]
    rep = M.coactivation_report(sp.csr_matrix(q), sp.csr_matrix(d), toks, names, top=3)
    sq, sd = (q > 0).mean(0), (d > 0).mean(0)
    per = sq * sd
    assert per.sum() == pytest.approx(M.flops(sp.csr_matrix(q), sp.csr_matrix(d)))
    assert rep["top_coactivated"][0] == {"term": "t7", "id": 7, "query_share": 1.0, "doc_share": 1.0,
                                         "flops": 1.0}
    assert [t["id"] for t in rep["top_coactivated"]] == list(np.argsort(-per, kind="stable")[:3])
    common = sd > 0.5  # terms 7 and 9 (9 costs nothing: no query has it)
    assert set(np.flatnonzero(common)) == {7, 9}
    assert rep["common_terms"] == 2
    assert rep["flops_share_common_terms"] == pytest.approx(per[common].sum() / per.sum())
    assert rep["max_foreign_query_term"] == "t7" and rep["max_foreign_query_share"] == 1.0
    fq = ((q > 0) & ~np.isin(np.arange(v), [1, 2])[None, :]).mean(0)
    assert rep["foreign_terms_over_30pct"] == int((fq > 0.3).sum())
    # A query's own words are not "foreign": make term 7 every query's own token.
    rep2 = M.coactivation_report(sp.csr_matrix(q), sp.csr_matrix(d), [np.array([7]) for _ in range(n_q)], names)
    assert rep2["max_foreign_query_term"] != "t7"


def test_faithfulness_overlap_and_correlation():
    a = np.array([[0, 1, 2], [3, 4, 5]])
    b = np.array([[2, 1, 9], [6, 7, 8]])
    assert M.topk_overlap(a, b, k=3) == pytest.approx((2 / 3 + 0) / 2)
    corr = M.per_query_correlation({"R@1": np.array([1, 0, 1, 0.0])}, {"R@1": np.array([1, 0, 1, 1.0])})
    assert corr["R@1"] == pytest.approx(np.corrcoef([1, 0, 1, 0], [1, 0, 1, 1])[0, 1])
    assert np.isnan(M.per_query_correlation({"x": np.ones(3)}, {"x": np.arange(3.0)})["x"])
    tau = M.mean_kendall_tau(np.array([[0, 1, 2]]), np.array([[3.0, 2, 1]]),
                             np.array([[0, 1, 2]]), np.array([[3.0, 2, 1]]))
    assert tau == pytest.approx(1.0)
