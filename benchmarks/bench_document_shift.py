"""The document shift chosen on validation, measured on test.

For trained caption-benchmark heads (``bench_d2s_frontier.py`` runs) or the offline model's
head: :func:`d2s_search.train.calibrate.choose_document_shift` picks, on the validation
split, the shift of the image/document side with the best R@1 within each FLOPs budget;
the test split is then scored with that shift and without one (sparse R@1 against dense,
FLOPs, terms per query and per document, the widest query expansion term, the largest share
of documents one term is active in).

    OMP_NUM_THREADS=1 python benchmarks/bench_document_shift.py \\
        --data test-artifacts/bench-d2s/data --budget 12 --budget 40 \\
        test-artifacts/frontier/long-hilr-flops1e-3-40ep/head.pt
    OMP_NUM_THREADS=1 python benchmarks/bench_document_shift.py --no-static \\
        --data test-artifacts/offline/align-ridge/embeddings --budget 12 \\
        test-artifacts/offline/ridge-heads2/both-e01/head.pt

Appends one JSON line per head and budget to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def score_test_split(head, split, tokens, names, static: bool) -> dict:
    from d2s_search import metrics as M
    from d2s_search.evaluate import (
        EvalData,
        EvalOptions,
        SparseVectors,
        boost_own_words,
        evaluate,
        static_embeddings,
    )
    from d2s_search.train.modeling import encode_sparse

    ev = EvalData.from_split(split, split.name)
    qt = [tokens.row(i) for i in range(len(tokens))]
    q = boost_own_words(encode_sparse(head, ev.query_emb), qt, head.allowed.numpy() > 0, head.config.query_word_boost)
    sv = SparseVectors(q, encode_sparse(head, ev.doc_emb, document=True))
    res = evaluate(ev, sv, qt, static_embeddings() if static else None, EvalOptions(runs=("dense", "sparse")), names)
    sparse, dense, co = res["runs"]["sparse"], res["runs"]["dense"], res["coactivation"]
    share = M.active_share(sv.docs)
    return {"R@1": round(sparse["R@1"], 4), "dense_R@1": round(dense["R@1"], 4),
            "ratio": round(sparse["R@1"] / dense["R@1"], 3), "FLOPs": round(sparse["FLOPs"], 2),
            "Exact@20": round(sparse["Exact@20"], 3), "terms_per_query": round(sparse["terms_per_query"], 1),
            "terms_per_doc": round(sparse["terms_per_image"], 1),
            "widest_query_expansion": [co.get("max_foreign_query_term"), round(co.get("max_foreign_query_share", 0), 3)],
            "widest_doc_term": [names[int(np.argmax(share))], round(float(share.max()), 3)]}


def test_grid(head, split, tokens, names, shifts) -> list[dict]:
    """Test R@1 / FLOPs at every shift, the head's boost kept; leaves the chosen shift set."""
    chosen, rows = head.config.document_shift, []
    for shift in shifts:
        head.config.document_shift = shift
        scored = score_test_split(head, split, tokens, names, False)
        rows.append({"shift": shift, **{k: scored[k] for k in ("ratio", "FLOPs", "Exact@20")}})
    head.config.document_shift = chosen
    return rows


def main() -> None:
    import torch
    from d2s_onnx_export.head import load_head

    from d2s_search.train.calibrate import BOOSTS, SHIFTS, choose_document_shift
    from d2s_search.train.data import load_dataset
    from d2s_search.train.validation import pick_distractors
    from d2s_search.train.vocab import id_to_token, load_tokenizer, tokenize_captions

    ap = argparse.ArgumentParser()
    ap.add_argument("heads", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, required=True, help="Embeddings with train/val/test splits.")
    ap.add_argument("--budget", type=float, action="append", required=True)
    ap.add_argument("--mode", default="c+w", help="The heads' expansion mode (query masking for 0).")
    ap.add_argument("--no-static", action="store_true", help="No static-embedding Semantic@k (offline photos).")
    ap.add_argument("--boost", action="store_true", help="Also choose the query word boost (calibrate.BOOSTS).")
    ap.add_argument("--shifts", help="Comma-separated shifts to try (default calibrate.SHIFTS).")
    ap.add_argument("--boosts", help="Comma-separated boosts to try (default calibrate.BOOSTS with --boost).")
    ap.add_argument("--test-grid", action="store_true",
                    help="Also score test at every shift (the chosen boost): the curve, apart from the choice.")
    ap.add_argument("--distractors", type=int, default=0,
                    help="Validation R@1 against this many training images too (train's default: 4000; 0 = "
                         "the validation images alone).")
    ap.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "document_shift.jsonl")
    args = ap.parse_args()
    grid = lambda text: tuple(float(v) for v in text.split(","))  # noqa: E731
    shifts = grid(args.shifts) if args.shifts else SHIFTS
    boosts = grid(args.boosts) if args.boosts else (BOOSTS if args.boost else (0.0,))
    torch.set_num_threads(1)
    splits = load_dataset(args.data)
    tok = load_tokenizer()
    names = id_to_token(tok)
    val_tokens = tokenize_captions(splits["val"].captions, tok)
    test_tokens = tokenize_captions(splits["test"].captions, tok)
    distractors = pick_distractors(splits["train"].image_emb, splits["train"].caption_image, args.distractors)
    for path in args.heads:
        head = load_head(path).eval()
        head.config.document_shift = head.config.query_word_boost = 0.0
        base = score_test_split(head, splits["test"], test_tokens, names, not args.no_static)
        grids: dict[float, list[dict]] = {}  # per boost: the same for every budget
        for budget in args.budget:
            choice = choose_document_shift(head, splits["val"], val_tokens, args.mode, budget,
                                           shifts=shifts, boosts=boosts, distractors=distractors)
            if args.test_grid and choice.boost not in grids:
                grids[choice.boost] = test_grid(head, splits["test"], test_tokens, names, shifts)
            row = {"head": str(path), "budget": budget, "document_shift": choice.shift,
                   "query_word_boost": choice.boost, "distractors": choice.distractors, "val": choice.table,
                   "test": score_test_split(head, splits["test"], test_tokens, names, not args.no_static), "test_no_shift": base,
                   "test_grid": grids.get(choice.boost),
                   "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"), "load": os.getloadavg()[0]}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({"head": path.parent.name, "budget": budget, "shift": choice.shift, "boost": choice.boost,
                              "test": row["test"],
                              "no_shift": {k: base[k] for k in ("ratio", "FLOPs", "widest_doc_term")}}), flush=True)


if __name__ == "__main__":
    main()
