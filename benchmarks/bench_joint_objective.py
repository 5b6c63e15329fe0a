"""The joint objective's parts, switched off one at a time, on the planted-word synthetic set.

    python benchmarks/bench_joint_objective.py [--seeds 0,1,2] [--epochs 8] [--lr 3e-3] [--batch-size 128]
        [--train-images 400] [--json OUT]

``train --objective joint`` follows the public code of the follow-up paper
(``holi-lab/mm-sparse-retrieval``; d2s_search/train/joint.py). This trains it on the synthetic
image-caption set of the tests (tests/train/train_synthetic.py: 400 training images, 3 captions
each; 100 validation images choose the epoch) and scores the kept epoch on 300 test images of
the same kind, once as set and once per variant: the fused distribution a fixed target
(``detach_fused``), the temperature frozen at its start (what a log-tau at lr 5e-5 amounts to),
no weight decay, no gradient clipping. A toy set: it says whether a part matters at all, not
what it buys on photos. About 20 seconds a seed on one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import _common

_common.use_repository()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from d2s_onnx_export.head import load_head  # noqa: E402

from d2s_search.train import joint as J  # noqa: E402
from d2s_search.train.modeling import build_head  # noqa: E402
from d2s_search.train.trainer import validate  # noqa: E402
from tests.train.train_synthetic import SPECIAL, VOCAB, make_dataset, make_split  # noqa: E402

VARIANTS = {  # name: (JointConfig overrides, temperature frozen)
    "as set (the public code's)": ({}, False),
    "fused target detached": ({"detach_fused": True}, False),
    "temperature frozen": ({}, True),
    "no weight decay": ({"weight_decay": 0.0}, False),
    "no gradient clipping": ({"grad_clip": 0.0}, False),
}


def test_split(seed: int = 0, n_images: int = 300):
    """Test images drawn as make_dataset draws its splits (same word vectors and frequencies)."""
    rng = np.random.default_rng(seed)
    word_vecs = rng.standard_normal((VOCAB, 48))
    word_p = 1.0 / np.arange(1, VOCAB - 10 + 1) ** 0.7
    split, tokens, _ = make_split("test", n_images, 3, seed + 3, word_vecs, word_p / word_p.sum())
    return split, tokens


def one_run(seed: int, overrides: dict, frozen: bool, epochs: int, lr: float, batch: int, data, test) -> dict:
    (tr, _, _), (va, vat, _), _ = data
    g = torch.Generator().manual_seed(seed)
    proj = {f"{n}.weight": torch.randn(24, tr.dim, generator=g) * 0.2 for n in J.PROJECTIONS}
    head = build_head(24, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32, seed=seed)
    cfg = J.JointConfig(lr=lr, epochs=epochs, batch_size=batch, seed=seed, **overrides)
    split, tokens = test
    start_dense = J.dense_metrics(J.project(J.JointModel(head, proj, cfg.tau), split))["R@1"]
    init = J.JointModel.__init__

    def frozen_init(self, *a, **k):
        init(self, *a, **k)
        self.temperature.requires_grad_(False)

    J.JointModel.__init__ = frozen_init if frozen else init
    try:
        with tempfile.TemporaryDirectory() as out:
            s = J.train_joint(head, proj, tr, cfg, out, va, vat)
            model = J.JointModel(load_head(Path(out) / "head.pt"), J.load_projections(Path(out) / "projections.safetensors"),
                                 cfg.tau)
    finally:
        J.JointModel.__init__ = init
    best = s["history"][s["best_epoch"] - 1]
    projected = J.project(model.eval(), split)
    sparse = validate(model.head, projected, tokens, cfg.expansion, torch.device("cpu"))
    return {"seed": seed, "val_sparse_r1": best["val_sparse"]["R@1"], "test_sparse_r1": sparse["R@1"],
            "test_flops": sparse["FLOPs"], "test_dense_r1": J.dense_metrics(projected)["R@1"], "test_dense_r1_start": start_dense,
            "tau": best["tau"], "tau_end": s["history"][-1]["tau"], "steps": s["steps"]}


def render(summary: dict) -> str:
    rows = []
    for name, runs in summary["variants"].items():
        def mean(k: str, runs: list = runs) -> float:
            return float(np.mean([r[k] for r in runs]))

        rows.append((name, f"{mean('val_sparse_r1'):.3f}", f"{mean('test_sparse_r1'):.3f}", f"{mean('test_flops'):.1f}",
                     f"{mean('test_dense_r1'):.3f}", f"{mean('tau'):.3f}", f"{mean('tau_end'):.4f}"))
    start = np.mean([r["test_dense_r1_start"] for runs in summary["variants"].values() for r in runs])
    head = (f"{summary['command']}; {summary['date']}; {summary['machine']}; load {summary['load_start']}. "
            f"Means over seeds {summary['seeds']}, {summary.get('train_images', 400)} training images, "
            f"{summary['epochs']} epochs of batch {summary.get('batch_size', 128)} at lr {summary['lr']:g} (test dense "
            f"R@1 of the starting projections: {start:.3f}).\n\n")
    return head + _common.table(["variant", "val sparse R@1", "test sparse R@1", "test FLOPs", "test dense R@1",
                                 "tau at the kept epoch", "tau at the end"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--train-images", type=int, default=400)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    summary = _common.provenance(threads="1 torch thread")
    seeds = [int(s) for s in args.seeds.split(",")]
    data, test = make_dataset(n_train=args.train_images), test_split()
    summary.update(seeds=seeds, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                   train_images=args.train_images, variants={})
    for name, (overrides, frozen) in VARIANTS.items():
        summary["variants"][name] = [one_run(s, overrides, frozen, args.epochs, args.lr, args.batch_size, data, test) for s in seeds]
        print(name, summary["variants"][name], file=sys.stderr)
    _common.finish(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(render(summary))


if __name__ == "__main__":
    main()
