"""A query-side shift beside the document shift, both chosen on validation (issue 12, session 17).

    OMP_NUM_THREADS=1 python benchmarks/bench_query_shift.py test-artifacts/frontier/sel-s0/head.pt ...

The document shift adds a constant to every image score before the ReLU (more words per
image); here the same is tried on the query side (added to the head's output bias while the
captions are encoded). For each head: queries at every query shift (boost 2), documents at
every document shift; validation R@1 against the validation images plus 4,000 training images
(as ``train`` calibrates) and FLOPs on the validation images; for each budget the best pair
within it (documents alone, and with a query shift) and its test score (COCO dev: R@1 / dense,
FLOPs, the widest expansion term's share of queries). Prints one JSON line per head and
budget, then the whole grid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUERY_SHIFTS = (0.0, 0.5, 1.0, 1.5)
DOCUMENT_SHIFTS = (1.5, 2.0, 2.5, 3.0, 4.0)


@contextlib.contextmanager
def query_shift(head, shift: float):
    import torch

    with torch.no_grad():
        head.vocab.bias += shift
    try:
        yield
    finally:
        with torch.no_grad():
            head.vocab.bias -= shift


def main() -> None:
    import torch

    from benchmarks.caption_calibration import load_calibration_data
    from d2s_search.evaluate import EvalData, EvalOptions, SparseVectors, boost_own_words, evaluate
    from d2s_search.train import validation
    from d2s_search.train.modeling import encode_sparse
    from d2s_search.train.vocab import id_to_token
    from onnx_export.head import load_head

    ap = argparse.ArgumentParser()
    ap.add_argument("heads", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, default=ROOT / "test-artifacts" / "bench-d2s" / "data")
    ap.add_argument("--budget", type=float, action="append", help="FLOPs budgets (default 12 and 40)")
    args = ap.parse_args()
    budgets = args.budget or [12.0, 40.0]
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    data = load_calibration_data(args.data)
    names = id_to_token(data.tokenizer)
    val, val_tokens, test_tokens, distractors, pool = data.val, data.val_tokens, data.test_tokens, data.distractors, data.pool
    ev = EvalData.from_split(data.test, "test")
    own = [test_tokens.row(i) for i in range(len(test_tokens))]
    for path in args.heads:
        head = load_head(path).eval()
        head.config.query_word_boost = 2.0
        allowed = head.allowed.numpy() > 0
        val_queries, test_queries = {}, {}
        for q in QUERY_SHIFTS:
            with query_shift(head, q):
                val_queries[q] = validation.validation_queries(head, val, val_tokens, "c+w", cpu)
                test_queries[q] = boost_own_words(encode_sparse(head, ev.query_emb), own, allowed, 2.0)
        grid = []
        for d in DOCUMENT_SHIFTS:
            head.config.document_shift = d
            val_docs = validation.validation_documents(head, val, cpu)
            pool_docs = validation.pool_documents(head, val_docs, distractors, cpu)
            test_docs = encode_sparse(head, ev.doc_emb, document=True)
            for q in QUERY_SHIFTS:
                res = evaluate(ev, SparseVectors(test_queries[q], test_docs), own, None,
                               EvalOptions(runs=("dense", "sparse")), names)
                sparse, dense, co = res["runs"]["sparse"], res["runs"]["dense"], res["coactivation"]
                grid.append({"query_shift": q, "document_shift": d,
                             "val_R@1": round(validation.validation_metrics(val_queries[q], pool_docs, pool)["R@1"], 4),
                             "val_FLOPs": round(validation.validation_metrics(val_queries[q], val_docs, val)["FLOPs"], 2),
                             "test_ratio": round(sparse["R@1"] / dense["R@1"], 3), "test_FLOPs": round(sparse["FLOPs"], 2),
                             "widest_query_expansion": [co.get("max_foreign_query_term"),
                                                        round(co.get("max_foreign_query_share", 0), 3)]})
        for budget in budgets:
            for shifts in ((0.0,), QUERY_SHIFTS):
                fits = [r for r in grid if r["val_FLOPs"] <= budget and r["query_shift"] in shifts]
                chosen = max(fits, key=lambda r: (r["val_R@1"], -r["document_shift"], -r["query_shift"])) if fits else None
                print(json.dumps({"head": str(path), "budget": budget, "query_shifts": list(shifts), "chosen": chosen}),
                      flush=True)
        print(json.dumps({"head": str(path), "grid": grid}), flush=True)


if __name__ == "__main__":
    main()
