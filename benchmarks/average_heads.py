"""Average the weights of trained heads (a "model soup", Wortsman et al. 2022): issue 12, session 17.

    python benchmarks/average_heads.py test-artifacts/frontier/soup5 test-artifacts/frontier/last-s{0,1,2,3,4}/head.pt

Writes ``OUT/head.pt`` with the first head's config and the mean of every weight; the heads
must have the same shapes (one recipe, different seeds). Calibrate and score it with
``bench_document_shift.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("heads", nargs="+", type=Path)
    args = ap.parse_args()
    loaded = [torch.load(p, map_location="cpu", weights_only=False) for p in args.heads]
    shapes = {k: tuple(v.shape) for k, v in loaded[0]["state_dict"].items()}
    for path, head in zip(args.heads, loaded):
        if {k: tuple(v.shape) for k, v in head["state_dict"].items()} != shapes:
            raise SystemExit(f"{path}: its weights do not have the first head's shapes")
    averaged = dict(loaded[0])
    averaged["state_dict"] = {k: sum(h["state_dict"][k].float() for h in loaded) / len(loaded) for k in shapes}
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(averaged, args.out / "head.pt")
    print(f"wrote {args.out / 'head.pt'} (the mean of {len(loaded)} heads)")


if __name__ == "__main__":
    main()
