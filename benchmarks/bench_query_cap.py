"""A query-side cap on wide expansions, simulated on stored vectors (issue 12, session 9).

Expansion terms active in more than ``limit`` of the **validation** queries that lack them
as their own word are dropped from every query that does not contain them; test R@1 / dense,
FLOPs and the widest test expansion are reported, for each limit. Heads are
``bench_d2s_frontier.py`` runs, each given as ``name:document_shift``, with query word boost 2.

    OMP_NUM_THREADS=2 python benchmarks/bench_query_cap.py mix1.0-s0:1.0 mix1.0-s1:2.0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def own_words(shape: tuple[int, int], rows: list[np.ndarray]) -> sp.csr_matrix:
    """0/1 (queries, vocab): each query's own tokens."""
    cols = [r[r < shape[1]] for r in rows]
    indptr = np.concatenate([[0], np.cumsum([c.size for c in cols])])
    data = np.ones(int(indptr[-1]), dtype=np.float32)
    m = sp.csr_matrix((data, np.concatenate(cols) if cols else [], indptr), shape=shape)
    m.sum_duplicates()
    m.data[:] = 1.0
    return m


def foreign_share(q: sp.csr_matrix, own: sp.csr_matrix) -> np.ndarray:
    """Per term, the share of queries where it is active without being their own word."""
    active = (q > 0).astype(np.float32)
    return np.asarray((active - active.multiply(own)).mean(axis=0)).ravel()


def capped(q: sp.csr_matrix, own: sp.csr_matrix, terms: np.ndarray) -> sp.csr_matrix:
    """``q`` without ``terms`` wherever they are not the query's own word."""
    q = q.tocsr(copy=True)
    rows = np.repeat(np.arange(q.shape[0]), np.diff(q.indptr))
    hit = np.flatnonzero(np.isin(q.indices, terms))
    is_own = np.asarray(own[rows[hit], q.indices[hit]]).ravel() > 0
    q.data[hit[~is_own]] = 0
    q.eliminate_zeros()
    return q


def main() -> None:
    from d2s_search.evaluate import EvalData, EvalOptions, SparseVectors, boost_own_words, evaluate
    from d2s_search.train.data import load_dataset
    from d2s_search.train.modeling import encode_sparse
    from d2s_search.train.vocab import id_to_token, load_tokenizer, tokenize_captions
    from onnx_export.head import load_head

    ap = argparse.ArgumentParser()
    ap.add_argument("heads", nargs="+", help="name:document_shift (test-artifacts/frontier/<name>/head.pt)")
    ap.add_argument("--data", type=Path, default=ROOT / "test-artifacts" / "bench-d2s" / "data")
    ap.add_argument("--limits", default="1,0.25,0.15")
    args = ap.parse_args()
    splits, tok = load_dataset(args.data), load_tokenizer()
    names = id_to_token(tok)
    for spec in args.heads:
        name, shift = spec.split(":")
        head = load_head(ROOT / "test-artifacts" / "frontier" / name / "head.pt")
        head.config.document_shift, head.config.query_word_boost = float(shift), 2.0
        allowed = head.allowed.numpy() > 0

        def queries(split, head=head, allowed=allowed):
            tokens = tokenize_captions(split.captions, tok)
            rows = [tokens.row(i) for i in range(len(tokens))]
            q = boost_own_words(encode_sparse(head, split.text_emb), rows, allowed, 2.0).tocsr()
            return q, rows, own_words(q.shape, rows)

        qv, _, own_v = queries(splits["val"])
        share = foreign_share(qv, own_v)
        ev = EvalData.from_split(splits["test"], "test")
        qt, rows_t, own_t = queries(splits["test"])
        docs = encode_sparse(head, ev.doc_emb, document=True)
        for limit in map(float, args.limits.split(",")):
            terms = np.flatnonzero(share > limit)
            q = capped(qt, own_t, terms) if terms.size else qt
            res = evaluate(ev, SparseVectors(q, docs), rows_t, None, EvalOptions(runs=("dense", "sparse")), names)
            s, co = res["runs"]["sparse"], res["coactivation"]
            print(f"{name} shift {shift} limit {limit}: capped {[names[c] for c in terms][:8]} "
                  f"R@1/dense {s['R@1'] / res['runs']['dense']['R@1']:.3f} FLOPs {s['FLOPs']:.2f} widest test expansion "
                  f"{co.get('max_foreign_query_term')} {co.get('max_foreign_query_share', 0):.3f}", flush=True)


if __name__ == "__main__":
    main()
