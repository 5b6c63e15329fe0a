"""Sparsity-quality frontier of D2S training recipes on the MiniLM caption benchmark.

Same data as ``bench_d2s_minilm.py`` (frozen all-MiniLM-L6-v2; per image caption 0 is the
"document", captions 1-4 are queries; train on the Flickr30k dev+test caption files with
200 images held out for validation, test on the COCO dev file). Each ``--recipe`` is a name
and settings (``name:key=value,key=value``) over the training defaults; every run appends
one JSON line (test metrics, co-activation report, validation history) to ``<out>/runs.jsonl``.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_d2s_frontier.py \\
        --recipe "flops-bias:regularizer=flops,eta=1e-2,bias_init=-2,epochs=8"

Keys: any ``TrainConfig`` field (``eta``, ``epochs``, ``batch_size``, ``lr_proj``,
``lr_vocab``, ``lr_bias``, ``regularizer``, ``expansion``, ``gate_own_words``, ``warmup``,
...), and the head options ``bias_init``, ``norm_gain``, ``output_terms``, ``freeze_vocab``,
``vocab_init``. ``python benchmarks/plot_frontier.py`` draws the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

HEAD_KEYS = {"bias_init": float, "norm_gain": float, "output_terms": str, "freeze_vocab": bool, "vocab_init": str,
             "proj_init": str, "document_shift": float, "mlp_dim": int}


def _value(kind, raw: str):
    if kind is bool:
        return raw.lower() in ("1", "true", "yes")
    if kind in (float, int):
        return kind(float(raw)) if kind is int else float(raw)
    if kind is str or kind == "str":
        return raw
    if kind in ("float | None", float | None):
        return None if raw == "none" else float(raw)
    return raw


def parse_recipe(spec: str) -> tuple[str, dict, dict]:
    from d2s_search.train.trainer import TrainConfig

    name, _, body = spec.partition(":")
    fields = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    types = {"eta": float, "lam": float, "tau": float, "epochs": int, "batch_size": int, "lr_proj": float,
             "lr_vocab": float, "warmup": float, "seed": int, "val_images": int, "gate_own_words": bool,
             "select_after_warmup": bool, "lr_bias": "float | None", "lexical": float,
             "image_eta_scale": float, "mix": float, "mix_most": float, "mix_neighbours": int, "mix_side": str,
             "cluster_images": int, "average_decay": float, "val_distractors": int,
             "select_flops_budget": float, "select_boost": float, "select_tolerance": float}
    train_kw, head_kw = {}, {}
    for item in filter(None, body.split(",")):
        k, _, v = item.partition("=")
        if k in HEAD_KEYS:
            head_kw[k] = _value(HEAD_KEYS[k], v)
        elif k in fields:
            train_kw[k] = _value(types.get(k, str), v)
        else:
            raise SystemExit(f"unknown recipe key {k!r}")
    return name, train_kw, head_kw


def run(spec: str, data_dir: Path, out: Path, threads: int, eval_only: bool = False, all_pairs: bool = False,
        extra_flickr8k: bool = False) -> dict:
    import torch
    from bench_d2s_minilm import build_caption_dataset

    from d2s_search.evaluate import (
        EvalData,
        EvalOptions,
        evaluate,
        sparse_from_head,
        static_embeddings,
    )
    from d2s_search.train.data import load_dataset
    from d2s_search.train.modeling import build_head
    from d2s_search.train.trainer import TrainConfig, train
    from d2s_search.train.vocab import (
        excluded_token_ids,
        id_to_token,
        load_tokenizer,
        tokenize_captions,
    )

    torch.set_num_threads(threads)
    name, train_kw, head_kw = parse_recipe(spec)
    build_caption_dataset(data_dir, all_pairs=all_pairs, extra_flickr8k=extra_flickr8k)
    splits = load_dataset(data_dir)
    tok = load_tokenizer()
    toks = {k: tokenize_captions(s.captions, tok) for k, s in splits.items()}
    freeze = head_kw.pop("freeze_vocab", False)
    vocab_init = head_kw.pop("vocab_init", "minilm")
    proj_init = head_kw.pop("proj_init", "default")
    document_shift = head_kw.pop("document_shift", 0.0)  # images trained with it (and validated)
    head = build_head(splits["train"].dim, vocab_init, excluded_token_ids(tok), tok.get_vocab_size(),
                      tokenizer=tok, **head_kw)
    head.config.document_shift = document_shift
    if proj_init == "words":
        from d2s_search.train.modeling import fit_projection_to_words

        print(f"  [{name}] W1 fit to the captions' words: {fit_projection_to_words(head, splits['train'], toks['train'])}")
    if freeze:
        head.vocab.weight.requires_grad_(False)
    base = {"epochs": 6, "batch_size": 128, "lr_vocab": 5e-4, "val_images": 0}
    cfg = TrainConfig(**{**base, **train_kw})
    run_dir = out / name
    t0 = time.perf_counter()
    if eval_only:  # a run cut short (e.g. by a time limit): its best head so far and its history
        history = json.loads((run_dir / "history.json").read_text())
        eligible = [h for h in history if h["eligible"]]
        best = max(eligible, key=lambda h: h["val"]["R@1"])
        summary = {"best_epoch": best["epoch"], "history": history,
                   "steps": len(history) * -(-len(toks["train"]) // cfg.batch_size)}
        train_s = sum(h["seconds"] for h in history)
    else:
        summary = train(head, splits["train"], toks["train"], cfg, run_dir, splits["val"], toks["val"], progress=False,
                        log=lambda e: print(f"  [{name}] epoch {e.epoch}: ce {e.ce:.3f} l1 {e.l1_img:.0f}/{e.l1_cap:.0f} "
                                            f"val R@1 {e.val.get('R@1', 0):.3f}"
                                            + (f" (pool {e.val['R@1_pool']:.3f})" if "R@1_pool" in e.val else "") + " "
                                            f"FLOPs {e.val.get('FLOPs', 0):.1f} "
                                            f"({e.seconds:.0f}s)", flush=True))
        train_s = time.perf_counter() - t0
    test = splits["test"]
    ev = EvalData.from_split(test, "coco-dev-captions")
    qt = [toks["test"].row(i) for i in range(len(toks["test"]))]
    sv = sparse_from_head(run_dir / "head.pt", ev, qt)
    res = evaluate(ev, sv, qt, static_embeddings(), EvalOptions(runs=("dense", "sparse")), id_to_token(tok))
    sparse = res["runs"]["sparse"]
    row = {
        "recipe": name, "spec": spec, "train": dataclasses.asdict(cfg), "head": {**head_kw, "freeze_vocab": freeze,
                                                                                "vocab_init": vocab_init, "proj_init": proj_init},
        "dense_R@1": res["runs"]["dense"]["R@1"], "test": sparse, "ratio_R@1": sparse["R@1"] / res["runs"]["dense"]["R@1"],
        "coactivation": res["coactivation"], "best_epoch": summary["best_epoch"], "steps": summary["steps"],
        "train_seconds": train_s, "epochs_run": len(summary["history"]),
        "history": [{"epoch": h["epoch"], "R@1": h["val"].get("R@1"), "FLOPs": h["val"].get("FLOPs"),
                     "ce": h["ce"], "l1_img": h["l1_img"]} for h in summary["history"]],
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"), "load": os.getloadavg()[0],
        "threads": threads, "all_pairs": all_pairs,
    }
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps(row, default=float) + "\n")
    co = res["coactivation"]
    print(json.dumps({"recipe": name, "R@1": round(sparse["R@1"], 4), "ratio": round(row["ratio_R@1"], 3),
                      "FLOPs": round(sparse["FLOPs"], 2), "Exact@20": round(sparse["Exact@20"], 3),
                      "terms_q": round(sparse["terms_per_query"], 1), "terms_d": round(sparse["terms_per_image"], 1),
                      "max_foreign": [co.get("max_foreign_query_term"), round(co.get("max_foreign_query_share", 0), 3)],
                      "common_flops": round(co["flops_share_common_terms"], 3),
                      "top": [t["term"] for t in co["top_coactivated"][:8]], "best_epoch": summary["best_epoch"],
                      "min": round(train_s / 60, 1)}), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", action="append", required=True, help="name:key=value,...")
    ap.add_argument("--data", type=Path, default=ROOT / "test-artifacts" / "bench-d2s" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "frontier")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-only", action="store_true", help="Evaluate the best head of an existing (cut-short) run.")
    ap.add_argument("--all-pairs", action="store_true",
                    help="Every training caption plays the document once (5x the pairs; use its own --data folder).")
    ap.add_argument("--extra-flickr8k", action="store_true",
                    help="Train also on the flickr8k-800 photos' captions (use its own --data folder).")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.recipe:
        run(spec, args.data, args.out, args.threads, args.eval_only, args.all_pairs, args.extra_flickr8k)


if __name__ == "__main__":
    main()
