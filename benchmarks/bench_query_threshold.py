"""A query-side threshold chosen with the document shift (issue 12, session 14): tried, not adopted.

Query terms whose weight (own words boosted by 2) is below a threshold t are dropped, which
cuts FLOPs on the query side; the document shift then has more of the budget. For each
trained caption-benchmark head (``bench_d2s_frontier.py`` runs, named by folder), every pair
(shift, t) is scored on validation (R@1 against the validation images plus 4,000 training
images, FLOPs on the validation images, as ``train`` calibrates) and on test (COCO dev); the
pair with the best validation R@1 within each budget is reported beside the shift alone.

    OMP_NUM_THREADS=1 python benchmarks/bench_query_threshold.py sel-s0 sel-s1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHIFTS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
THRESHOLDS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25)


def thresholded(q, t: float):
    q = q.tocsr(copy=True)
    q.data[q.data < t] = 0
    q.eliminate_zeros()
    return q


def main() -> None:
    from benchmarks.caption_calibration import load_calibration_data
    from d2s_search.train import validation
    from onnx_export.head import load_head

    ap = argparse.ArgumentParser()
    ap.add_argument("heads", nargs="+", help="run folders under --runs")
    ap.add_argument("--runs", type=Path, default=ROOT / "test-artifacts" / "frontier")
    ap.add_argument("--data", type=Path, default=ROOT / "test-artifacts" / "bench-d2s" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "query_threshold.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = load_calibration_data(args.data)
    val, test, val_tokens, test_tokens = data.val, data.test, data.val_tokens, data.test_tokens
    distractors, pool, device = data.distractors, data.pool, torch.device("cpu")
    for name in args.heads:
        head = load_head(args.runs / name / "head.pt").eval()
        head.config.query_word_boost = 2.0
        q_val = validation.validation_queries(head, val, val_tokens, "c+w", device)
        q_test = validation.validation_queries(head, test, test_tokens, "c+w", device)
        table = []
        for shift in SHIFTS:
            head.config.document_shift = shift
            d_val = validation.validation_documents(head, val, device)
            d_pool = validation.pool_documents(head, d_val, distractors, device)
            d_test = validation.validation_documents(head, test, device)
            for t in THRESHOLDS:
                qv, qt = thresholded(q_val, t), thresholded(q_test, t)
                tested = validation.validation_metrics(qt, d_test, test)
                table.append({"shift": shift, "threshold": t, "val_FLOPs": validation.validation_metrics(qv, d_val, val)["FLOPs"],
                              "val_R@1": validation.validation_metrics(qv, d_pool, pool)["R@1"], "test_R@1": tested["R@1"],
                              "test_FLOPs": tested["FLOPs"], "test_terms_per_query": tested["terms_per_query"]})
        for budget in (12.0, 40.0):
            fits = [r for r in table if r["val_FLOPs"] <= budget]
            joint = max(fits, key=lambda r: r["val_R@1"])
            alone = max((r for r in fits if r["threshold"] == 0), key=lambda r: r["val_R@1"])
            line = {"head": name, "budget": budget, "joint": joint, "shift_alone": alone, "grid": table}
            print(json.dumps({k: v for k, v in line.items() if k != "grid"}), flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
