"""A "model soup" of D2S heads: the uniform average of the weights of heads with one config.

Used for docs/benchmarks.md, "Session 6 (issue 12)": the heads of one recipe trained with
different seeds start from the same initialisation (W1 fitted to the words, W2 from MiniLM's
word embeddings, the bias at its init), so their weights can be averaged. The soup is saved
without a document shift (``bench_document_shift.py`` chooses one for it) and with the first
head's query word boost.

    python benchmarks/soup_heads.py OUT/head.pt RUN_A/head.pt RUN_B/head.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from onnx_export.head import load_head, save_head

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("heads", nargs="+", type=Path)
    args = ap.parse_args()
    if len(args.heads) < 2:
        ap.error("give at least two heads")
    heads = [load_head(p) for p in args.heads]
    sizes = {tuple((k, tuple(v.shape)) for k, v in h.state_dict().items()) for h in heads}
    if len(sizes) != 1:
        sys.exit("the heads differ in shape: only heads of one config can be averaged")
    soup = heads[0]
    states = [h.state_dict() for h in heads]
    soup.load_state_dict({k: sum(s[k].double() for s in states).div(len(states)).to(v.dtype)
                          for k, v in states[0].items()})
    soup.config.document_shift = 0.0
    save_head(soup, args.out)
    print(f"{args.out}: the average of {len(heads)} heads")


if __name__ == "__main__":
    main()
