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


def capped(q: sp.csr_matrix, query_tokens: list[np.ndarray], terms: np.ndarray) -> sp.csr_matrix:
    """``q`` without ``terms`` wherever they are not the query's own word."""
    q = q.tocsr(copy=True)
    for row, own in enumerate(query_tokens):
        s, e = q.indptr[row], q.indptr[row + 1]
        idx = q.indices[s:e]
        q.data[s:e][np.isin(idx, terms) & ~np.isin(idx, own)] = 0
    q.eliminate_zeros()
    return q


def main() -> None:
    from d2s_search import metrics as M
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
            return q, rows

        share = M.foreign_active_share(*queries(splits["val"]))
        ev = EvalData.from_split(splits["test"], "test")
        qt, rows_t = queries(splits["test"])
        docs = encode_sparse(head, ev.doc_emb, document=True)
        for limit in map(float, args.limits.split(",")):
            terms = np.flatnonzero(share > limit)
            q = capped(qt, rows_t, terms) if terms.size else qt
            res = evaluate(ev, SparseVectors(q, docs), rows_t, None, EvalOptions(runs=("dense", "sparse")), names)
            s, co = res["runs"]["sparse"], res["coactivation"]
            print(f"{name} shift {shift} limit {limit}: capped {[names[c] for c in terms][:8]} "
                  f"R@1/dense {s['R@1'] / res['runs']['dense']['R@1']:.3f} FLOPs {s['FLOPs']:.2f} widest test expansion "
                  f"{co.get('max_foreign_query_term')} {co.get('max_foreign_query_share', 0):.3f}", flush=True)


if __name__ == "__main__":
    main()
