"""Joint sparse-dense training vs frozen dense vs D2S, on the offline caption benchmark.

Same data as ``bench_d2s_minilm.py`` (MiniLM caption<->caption retrieval; train on the
Flickr30k dev+test caption files, 200 of their images held out for validation, test on the
COCO dev file). The frozen all-MiniLM-L6-v2 vectors play the *pre-projection features*; a
trainable projection initialised to the identity on each side stands in for BLIP's
``text_proj`` / ``vision_proj``. Before training the identity projection gives exactly the
frozen dense model.

Runs (each bounded by ``--epochs``; best epoch by validation sparse R@1 after the warm-up):

* ``dense``        frozen MiniLM (the reference);
* ``d2s:MODE:ETA`` D2S head distilled from the frozen dense model (``train``);
* ``joint:MODE:ETA_T:ETA_I[:init=DIR]`` joint training (``train --objective joint``), optionally
  starting from the head of an earlier run (``DIR/head.pt``, e.g. a D2S run's folder); reports
  its sparse run and its (fine-tuned) dense run.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_joint_minilm.py --out test-artifacts/bench-joint \
        --run d2s:c:1e-2 --run joint:1:5e-3:5e-3

Writes ``<out>/results.json`` and ``<out>/results.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_d2s_minilm as base  # noqa: E402

from d2s_search.evaluate import EvalData, EvalOptions, evaluate, sparse_from_head, static_embeddings  # noqa: E402
from d2s_search.train.data import load_dataset  # noqa: E402
from d2s_search.train.vocab import excluded_token_ids, load_tokenizer, tokenize_captions  # noqa: E402


def identity_projections(dim: int) -> dict:
    import torch

    return {f"{n}.{p}": (torch.eye(dim) if p == "weight" else torch.zeros(dim))
            for n in ("text_proj", "vision_proj") for p in ("weight", "bias")}


def test_runs(head_path: Path, split, toks, static, projections: Path | None = None) -> dict:
    """Sparse (and, with projections, the joint model's dense) run on the test split."""
    from d2s_search.train.joint import JointModel, load_projections, project
    from onnx_export.head import load_head

    if projections is not None:
        split = project(JointModel(load_head(head_path), load_projections(projections), 0.07).eval(), split)
    data = EvalData.from_split(split)
    qt = [toks.row(i) for i in range(len(toks))]
    sv = sparse_from_head(head_path, data, query_tokens=qt)
    r = evaluate(data, sv, qt, static, EvalOptions(runs=("dense", "sparse")))
    return {"sparse": r["runs"]["sparse"], "dense": r["runs"]["dense"], "query_mask": sv.info.get("query_mask")}


def run_d2s(spec: list[str], splits, toks, static, args, out: Path) -> dict:
    from d2s_search.train.modeling import build_head
    from d2s_search.train.trainer import TrainConfig, train

    mode, eta = spec[0], float(spec[1])
    head = build_head(splits["train"].dim, "minilm", excluded_token_ids(load_tokenizer()), seed=args.seed)
    cfg = TrainConfig(expansion=mode, eta=eta, epochs=args.epochs, batch_size=args.d2s_batch, seed=args.seed,
                      lr_proj=1e-3, lr_vocab=5e-4, val_images=0)
    t0 = time.perf_counter()
    s = train(head, splits["train"], toks["train"], cfg, out, splits["val"], toks["val"], progress=False)
    res = test_runs(out / "head.pt", splits["test"], toks["test"], static)
    return {"kind": "d2s", "mode": mode, "eta": eta, "best_epoch": s["best_epoch"], "steps": s["steps"],
            "train_seconds": time.perf_counter() - t0, "val": s["best_val"], "test": res}


def run_joint(spec: list[str], splits, toks, static, args, out: Path) -> dict:
    import torch

    from d2s_search.train.joint import JointConfig, train_joint
    from d2s_search.train.modeling import build_head
    from onnx_export.head import load_head

    mode, eta_t, eta_i = spec[0], float(spec[1]), float(spec[2])
    init = next((s[5:] for s in spec[3:] if s.startswith("init=")), None)
    if init:
        head = load_head(Path(init) / "head.pt")
        head.config.notes = {k: v for k, v in head.config.notes.items() if k not in ("best_epoch", "val")}
    else:
        head = build_head(splits["train"].dim, "minilm", excluded_token_ids(load_tokenizer()), seed=args.seed)
    cfg = JointConfig(lr=args.joint_lr, eta_text=eta_t, eta_image=eta_i, epochs=args.epochs,
                      batch_size=args.joint_batch, expansion=mode, seed=args.seed, val_images=0,
                      w1=args.w1, w2=args.w2, lambda1=args.lambda1, lambda2=args.lambda2, lambda3=args.lambda3,
                      select_max_flops=args.max_flops)
    t0 = time.perf_counter()
    s = train_joint(head, identity_projections(splits["train"].dim), splits["train"], cfg, out, splits["val"],
                    toks["val"], toks["train"],
                    log=lambda e: print(json.dumps({"run": out.name, "epoch": e["epoch"], "tau": round(e["tau"], 4),
                                                    "val_sparse_R@1": round(e["val_sparse"]["R@1"], 4),
                                                    "FLOPs": round(e["val_sparse"]["FLOPs"], 1),
                                                    "val_dense_R@1": round(e["val_dense"]["R@1"], 4),
                                                    "s": round(e["seconds"], 1)}), flush=True))
    res = test_runs(out / "head.pt", splits["test"], toks["test"], static, out / "projections.safetensors")
    return {"kind": "joint", "mode": mode, "eta_text": eta_t, "eta_image": eta_i, "init": init,
            "best_epoch": s["best_epoch"], "steps": s["steps"], "train_seconds": time.perf_counter() - t0,
            "val": s["best_val"], "val_dense": s["best_val_dense"], "test": res, "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "test-artifacts" / "bench-joint"))
    ap.add_argument("--captions", default=str(base.CAPS if base.CAPS.is_dir() else Path("/work/shared/data/karpathy-captions")),
                    help="Folder of the Karpathy caption files.")
    ap.add_argument("--run", action="append", required=True, help="d2s:MODE:ETA or joint:MODE:ETA_T:ETA_I[:init=NAME]")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--d2s-batch", type=int, default=128)
    ap.add_argument("--joint-batch", type=int, default=256)
    ap.add_argument("--joint-lr", type=float, default=5e-5)
    ap.add_argument("--w1", type=float, default=0.1)
    ap.add_argument("--w2", type=float, default=0.1)
    ap.add_argument("--lambda1", type=float, default=0.9)
    ap.add_argument("--lambda2", type=float, default=0.3)
    ap.add_argument("--lambda3", type=float, default=1.0)
    ap.add_argument("--max-flops", type=float, default=40.0, help="Joint runs: best epoch among those within this validation FLOPs budget.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    base.CAPS = Path(args.captions)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base.build_caption_dataset(out / "data")
    splits = load_dataset(out / "data")
    tok = load_tokenizer()
    toks = {k: tokenize_captions(s.captions, tok) for k, s in splits.items()}
    static = static_embeddings()
    res_file = out / "results.json"
    results = json.loads(res_file.read_text()) if res_file.is_file() else {"runs": {}}
    frozen = evaluate(EvalData.from_split(splits["test"]), None, options=EvalOptions(runs=("dense",)))
    results.update({"date": dt.date.today().isoformat(), "machine": f"{os.cpu_count()} cores, no GPU, {platform.machine()}",
                    "load_average_start": os.getloadavg(), "frozen_dense": frozen["runs"]["dense"],
                    "sizes": {k: {"queries": len(s.caption_ids), "documents": len(s.image_ids)} for k, s in splits.items()}})
    for run in args.run:
        kind, *spec = run.split(":")
        name = run.split(":init=")[0].replace(":", "_") + ("_init" if ":init=" in run else "")
        if kind not in ("d2s", "joint"):
            raise SystemExit(f"unknown run kind {kind!r}")
        t_args = {k: v for k, v in vars(args).items() if k != "run"}
        r = (run_d2s(spec, splits, toks, static, args, out / name) if kind == "d2s"
             else run_joint(spec, splits, toks, static, args, out / name))
        r.update({"dir": str(out / name), "args": t_args, "load_average_end": os.getloadavg()})
        results["runs"][run] = r
        res_file.write_text(json.dumps(results, indent=2))
        t = r["test"]
        print(json.dumps({"run": run, "sparse_R@1": round(t["sparse"]["R@1"], 4), "FLOPs": round(t["sparse"]["FLOPs"], 1),
                          "dense_R@1": round(t["dense"]["R@1"], 4), "best_epoch": r["best_epoch"],
                          "train_s": round(r["train_seconds"])}), flush=True)
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))


def markdown(r: dict) -> str:
    def f(x, n=3):
        return "-" if x is None else f"{x:.{n}f}"

    d = r["frozen_dense"]
    lines = ["| run | sparse R@1 | R@5 | MRR@10 | FLOPs | terms/query | terms/doc | Exact@20 | dense R@1 (same model) | epochs | best epoch | train s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|",
             f"| frozen dense MiniLM | - | - | - | - | - | - | - | {f(d['R@1'])} (R@5 {f(d['R@5'])}, MRR@10 {f(d['MRR@10'])}) | - | - | - |"]
    for name, x in r["runs"].items():
        s, dd = x["test"]["sparse"], x["test"]["dense"]
        dense_txt = f"{f(dd['R@1'])} (improved)" if x["kind"] == "joint" else f"{f(dd['R@1'])} (frozen)"
        lines.append(f"| `{name}` | {f(s['R@1'])} | {f(s['R@5'])} | {f(s['MRR@10'])} | {f(s['FLOPs'], 1)} | "
                     f"{f(s['terms_per_query'], 1)} | {f(s['terms_per_image'], 1)} | {f(s.get('Exact@20'))} | {dense_txt} | "
                     f"{x['args']['epochs']} | {x['best_epoch']} | {x['train_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
