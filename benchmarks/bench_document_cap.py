"""A per-term cap on the documents' side, simulated on stored vectors (issue 12, session 10).

No term may be active on more than ``cap`` of the calibration documents: a term above it keeps
only the documents where its shifted score reaches the score's ``1 - cap`` quantile over the
calibration split (a per-term floor; the weights kept are unchanged). The idea: a term on most
photos (`man` on 58% of the offline model's held-out photos) costs FLOPs and says little, and
the documents, unlike the queries, are the user's own collection. Test R@1, FLOPs and the
widest test document term are reported per shift and cap (and image term precision@10 with
``--precision``, for photo data whose test split has captions per photo).

    OMP_NUM_THREADS=1 python benchmarks/bench_document_cap.py --data test-artifacts/bench-d2s/data \\
        --boost 2 test-artifacts/frontier/base-s0/head.pt
    OMP_NUM_THREADS=1 python benchmarks/bench_document_cap.py --data test-artifacts/offline/align-ridge/embeddings \\
        --calibration val --precision --shifts 1.5,2,2.5,3 --caps 1,0.3,0.25 test-artifacts/offline/shipped-head.pt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def document_logits(head, z: np.ndarray, batch: int = 512) -> np.ndarray:
    """The head's pre-activation vocabulary scores; disallowed terms can never be active."""
    import torch

    with torch.no_grad():
        out = [head.logits(torch.as_tensor(z[i : i + batch], dtype=torch.float32)).numpy()
               for i in range(0, len(z), batch)]
    return np.vstack(out) + np.where(head.allowed.numpy() > 0, 0.0, -np.inf).astype(np.float32)


def floors(calibration_logits: np.ndarray, shift: float, cap: float) -> np.ndarray:
    """Per term, the least shifted score a document needs to keep it (0: no cap)."""
    x = calibration_logits + shift
    floor = np.zeros(x.shape[1], dtype=np.float32)
    over = (x > 0).mean(axis=0) > cap
    if over.any():
        floor[over] = np.quantile(x[:, over], 1 - cap, axis=0)
    return floor


def capped_documents(logits: np.ndarray, shift: float, floor: np.ndarray) -> sp.csr_matrix:
    y = logits + shift
    return sp.csr_matrix((np.log1p(np.maximum(y, 0)) * (y >= floor)).astype(np.float32))


def main() -> None:
    from d2s_search import metrics as M
    from d2s_search.evaluate import boost_own_words
    from d2s_search.train.data import load_dataset
    from d2s_search.train.modeling import encode_sparse
    from d2s_search.train.trainer import validation_metrics
    from d2s_search.train.vocab import id_to_token, load_tokenizer, tokenize_captions
    from onnx_export.head import load_head

    ap = argparse.ArgumentParser()
    ap.add_argument("heads", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--calibration", default="train", help="The split the floors are computed on.")
    ap.add_argument("--boost", type=float, default=0.0, help="Query word boost.")
    ap.add_argument("--shifts", default="0.5,1,1.5,2,2.5,3,4")
    ap.add_argument("--caps", default="1,0.5,0.3,0.2,0.1")
    ap.add_argument("--precision", action="store_true", help="Also image term precision@10 on test.")
    args = ap.parse_args()
    grid = lambda text: [float(v) for v in text.split(",")]  # noqa: E731
    splits, tok = load_dataset(args.data), load_tokenizer()
    names = id_to_token(tok)
    for path in args.heads:
        head = load_head(path).eval()
        head.config.document_shift, head.config.query_word_boost = 0.0, 0.0
        allowed = head.allowed.numpy() > 0
        scored = []
        for name in ("val", "test"):
            split = splits[name]
            tokens = tokenize_captions(split.captions, tok)
            q = boost_own_words(encode_sparse(head, split.text_emb), [tokens.row(i) for i in range(len(tokens))],
                                allowed, args.boost)
            scored.append((name, split, q, document_logits(head, split.image_emb)))
        calibration = document_logits(head, splits[args.calibration].image_emb)
        for shift in grid(args.shifts):
            for cap in grid(args.caps):
                floor = floors(calibration, shift, cap)
                row = {"head": path.parent.name, "shift": shift, "cap": cap, "capped_terms": int((floor > 0).sum())}
                for name, split, q, logits in scored:
                    d = capped_documents(logits, shift, floor)
                    m = validation_metrics(q, d, split)
                    row[name] = {"R@1": round(m["R@1"], 4), "FLOPs": round(m["FLOPs"], 2)}
                share = M.active_share(d)  # test, the last split scored
                row["widest_test_document_term"] = [names[int(np.argmax(share))], round(float(share.max()), 3)]
                if args.precision:
                    from bench_offline_head import image_term_precision

                    row["image_term_precision@10"] = round(image_term_precision(d, splits["test"], names), 3)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
