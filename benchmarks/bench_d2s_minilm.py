"""Offline D2S benchmark: MiniLM as the frozen dense model, caption<->caption retrieval.

Data: ../shared/data/karpathy-captions/ (5 consecutive lines per image). For every image
the first caption is the "document" (it plays the image), the other captions are queries.
Train on the Flickr30k dev+test files (200 of their images held out for validation R@1 and
best-checkpoint selection), test on the COCO dev file (1,000 documents, 4,000 queries).
Runs: dense, and sparse for exp=0, 1, c, c+w at two eta values. Then a sanity run on the
real CLIP ViT-B/32 embeddings of ../shared/data/flickr8k-100-clip-b32/.

    nice -n 10 python benchmarks/bench_d2s_minilm.py --out test-artifacts/bench-d2s

The paper trains 200 epochs of ~1,100 steps; here each run gets a few hundred steps, so the
defaults use batch 128 (4x the updates per epoch for the same compute) and a 10x higher
LayerNorm/W2 learning rate (5e-4) than the paper's 5e-5. One epoch at the paper's batch 512
is timed separately (``--time-batch``) for the epoch-time / peak-memory numbers.

Writes ``<out>/results.json`` and ``<out>/results.md`` (the tables for docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2s_search.evaluate import EvalData, EvalOptions, evaluate, static_embeddings  # noqa: E402
from d2s_search.train.data import load_dataset, write_embeddings  # noqa: E402
from d2s_search.train.vocab import (  # noqa: E402
    excluded_token_ids,
    load_tokenizer,
    tokenize_captions,
)

# ../shared/data from the repository root; from a worktree (/work/wt/<name>) it is further up.
DATA = next((p / "shared" / "data" for p in ROOT.parents if (p / "shared" / "data").is_dir()),
            ROOT.parent / "shared" / "data")
CAPS = DATA / "karpathy-captions"
FLICKR8K_CAPTIONS = DATA / "flickr8k-800" / "captions.txt"
CLIP = DATA / "flickr8k-100-clip-b32"


def read_groups(path: Path, size: int = 5) -> list[list[str]]:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    return [lines[i : i + size] for i in range(0, len(lines), size) if len(lines[i : i + size]) >= 2]


def flickr8k_groups(path: Path = FLICKR8K_CAPTIONS) -> list[list[str]]:
    """The 5 captions of each photo of ``../shared/data/flickr8k-800`` (``image,caption`` rows)."""
    import csv

    groups: dict[str, list[str]] = {}
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            groups.setdefault(row["image"], []).append(row["caption"].strip())
    return [g for g in groups.values() if len(g) >= 2]


def caption_groups(n_val: int = 200, seed: int = 0, extra_flickr8k: bool = False) -> list[tuple[str, str, list[str]]]:
    """(source, split, captions) per image: Flickr30k dev+test with ``n_val`` images held out for
    validation, the flickr8k-800 captions (training only) when asked, COCO dev as the test."""
    groups = [g for name in ("f30k_precomp_dev_caps.txt", "f30k_precomp_test_caps.txt") for g in read_groups(CAPS / name)]
    val_set = set(np.random.default_rng(seed).permutation(len(groups))[:n_val].tolist())
    out = [("f30k", "val" if k in val_set else "train", g) for k, g in enumerate(groups)]
    if extra_flickr8k:  # drawn after the permutation: the validation images stay the same
        out += [("f8k", "train", g) for g in flickr8k_groups()]
    return out + [("coco", "test", g) for g in read_groups(CAPS / "coco_precomp_dev_caps.txt")]


def build_caption_dataset(out: Path, n_val: int = 200, seed: int = 0, all_pairs: bool = False,
                          extra_flickr8k: bool = False) -> dict:
    """Authors' layout: doc captions as 'images', the other captions as their sentences.

    ``all_pairs``: in the training split every caption of an image plays the document once
    (5 training "images" per image, the other 4 captions their queries: 5x the pairs from
    the same text); validation and test keep caption 0 as the document.
    ``extra_flickr8k``: the flickr8k-800 photos' captions join the training split (800 more
    documents, 3,200 more queries); validation and test are unchanged."""
    if (out / "dataset_meta.json").is_file():
        prep = json.loads((out / "prep.json").read_text())
        for key, wanted in (("all_pairs", all_pairs), ("extra_flickr8k", extra_flickr8k)):
            if prep.get(key, False) != wanted:
                raise SystemExit(f"{out} holds the dataset built with {key}={prep.get(key, False)}: use another --data")
        return prep
    from d2s_search.train.minilm import MiniLMEncoder

    images, docs, queries, q_ids, doc_ids = [], [], [], [], []
    for k, (src, split, g) in enumerate(caption_groups(n_val, seed, extra_flickr8k)):
        roles = range(len(g)) if (all_pairs and split == "train") else [0]
        for d in roles:
            iid = f"{src}-{k:05d}" if d == 0 else f"{src}-{k:05d}-d{d}"
            sents = []
            for j, cap in enumerate(c for i, c in enumerate(g) if i != d):
                sid = f"{iid}-q{j}"
                sents.append({"sentid": sid, "raw": cap})
                queries.append(cap)
                q_ids.append(sid)
            images.append({"imgid": iid, "split": split, "doc": g[d], "sentences": sents})
            docs.append(g[d])
            doc_ids.append(iid)
    enc = MiniLMEncoder()
    t0 = time.perf_counter()
    embed = lambda texts: np.vstack([enc(texts[i : i + 128]) for i in range(0, len(texts), 128)])  # noqa: E731
    write_embeddings(out, "img", doc_ids, embed(docs))
    write_embeddings(out, "text", q_ids, embed(queries))
    (out / "dataset_meta.json").write_text(json.dumps({"images": images}))
    prep = {"encode_seconds": time.perf_counter() - t0, "texts": len(docs) + len(queries), "all_pairs": all_pairs,
            "extra_flickr8k": extra_flickr8k}
    (out / "prep.json").write_text(json.dumps(prep))
    return prep


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def run_sparse(split_tr, tok_tr, split_va, tok_va, test, tok_test, static, args, mode, eta, out, dim):
    from d2s_search.evaluate import sparse_from_head
    from d2s_search.train.modeling import build_head
    from d2s_search.train.trainer import TrainConfig, train

    tokenizer = load_tokenizer()
    head = build_head(dim, args.vocab_init, excluded_token_ids(tokenizer), seed=args.seed)
    cfg = TrainConfig(
        expansion=mode, eta=eta, epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
        lr_proj=args.lr_proj, lr_vocab=args.lr_vocab, val_images=0,
    )
    t0 = time.perf_counter()
    summary = train(head, split_tr, tok_tr, cfg, out, split_va, tok_va, progress=not args.quiet)
    train_s = time.perf_counter() - t0
    data = EvalData.from_split(test)
    sv = sparse_from_head(Path(out) / "head.pt", data, query_tokens=[tok_test.row(i) for i in range(len(tok_test))])
    res = evaluate(data, sv, [tok_test.row(i) for i in range(len(tok_test))], static, EvalOptions(runs=("dense", "sparse")))
    epoch_s = [h["seconds"] for h in summary["history"]]
    return {
        "mode": mode, "eta": eta, "epochs": args.epochs, "best_epoch": summary["best_epoch"],
        "train_seconds": train_s, "epoch_seconds_mean": float(np.mean(epoch_s)),
        "val_best": summary["best_val"], "test": res["runs"]["sparse"], "dense": res["runs"]["dense"],
        "query_mask": sv.info.get("query_mask"), "peak_rss_gb": peak_rss_gb(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "test-artifacts" / "bench-d2s"))
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr-proj", type=float, default=1e-3)
    ap.add_argument("--lr-vocab", type=float, default=5e-4)
    ap.add_argument("--time-batch", type=int, default=512, help="Time one epoch at this batch size (0: skip).")
    ap.add_argument("--etas", default="1e-2,1e-3")
    ap.add_argument("--modes", default="0,1,c,c+w")
    ap.add_argument("--vocab-init", default="minilm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clip-epochs", type=int, default=40)
    ap.add_argument("--skip-clip", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--json", dest="json_out", help="also write the results here")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    prep = build_caption_dataset(out / "data")
    splits = load_dataset(out / "data")
    tokenizer = load_tokenizer()
    toks = {k: tokenize_captions(s.captions, tokenizer) for k, s in splits.items()}
    static = static_embeddings()
    results = {
        "date": dt.date.today().isoformat(), "machine": f"{os.cpu_count()} cores, no GPU, {platform.processor() or platform.machine()}",
        "args": vars(args), "prep": prep,
        "sizes": {k: {"queries": len(s.caption_ids), "documents": len(s.image_ids)} for k, s in splits.items()},
        "runs": [],
    }
    res_file = out / "results.json"
    if args.time_batch:
        results["timing"] = time_epoch(splits, toks, args, out / "timing")
        res_file.write_text(json.dumps(results, indent=2))
        print(json.dumps(results["timing"]), flush=True)
    for eta in [float(e) for e in args.etas.split(",")]:
        for mode in args.modes.split(","):
            r = run_sparse(splits["train"], toks["train"], splits["val"], toks["val"], splits["test"], toks["test"],
                           static, args, mode, eta, out / f"exp{mode}-eta{eta:g}", splits["train"].dim)
            results["runs"].append(r)
            res_file.write_text(json.dumps(results, indent=2))
            print(json.dumps({k: r[k] for k in ("mode", "eta", "best_epoch", "epoch_seconds_mean")}
                             | {k: round(v, 4) for k, v in r["test"].items() if isinstance(v, float)}), flush=True)
    if not args.skip_clip:
        results["clip"] = clip_sanity(args, out / "clip", static)
        res_file.write_text(json.dumps(results, indent=2))
    results["total_seconds"] = time.time() - started
    results["peak_rss_gb"] = peak_rss_gb()
    res_file.write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


def time_epoch(splits, toks, args, out: Path) -> dict:
    """One epoch of exp=c+w at ``--time-batch`` (the paper's 512): seconds and peak RSS."""
    import torch

    from d2s_search.train.modeling import build_head
    from d2s_search.train.trainer import TrainConfig, train

    before = peak_rss_gb()
    head = build_head(splits["train"].dim, args.vocab_init, excluded_token_ids(load_tokenizer()), seed=args.seed)
    cfg = TrainConfig(expansion="c+w", eta=1e-3, epochs=1, batch_size=args.time_batch, seed=args.seed, val_images=0)
    t0 = time.perf_counter()
    s = train(head, splits["train"], toks["train"], cfg, out, None, None, progress=False)
    return {"batch_size": args.time_batch, "epoch_seconds": time.perf_counter() - t0,
            "steps": s["steps"], "torch_threads": torch.get_num_threads(),
            "peak_rss_gb_before": before, "peak_rss_gb_after": peak_rss_gb()}


def clip_sanity(args, out: Path, static) -> dict:
    from d2s_search.evaluate import sparse_from_head
    from d2s_search.train.modeling import build_head
    from d2s_search.train.trainer import TrainConfig, train

    splits = load_dataset(CLIP, val_fraction=0.2, seed=args.seed)
    tokenizer = load_tokenizer()
    toks = {k: tokenize_captions(s.captions, tokenizer) for k, s in splits.items()}
    head = build_head(splits["train"].dim, args.vocab_init, excluded_token_ids(tokenizer), seed=args.seed)
    cfg = TrainConfig(expansion="c+w", eta=1e-3, epochs=args.clip_epochs, batch_size=128, seed=args.seed,
                      lr_proj=args.lr_proj, lr_vocab=args.lr_vocab, val_images=0)
    summary = train(head, splits["train"], toks["train"], cfg, out, splits["val"], toks["val"], progress=not args.quiet)
    res = {"train_images": len(splits["train"].image_ids), "val_images": len(splits["val"].image_ids),
           "epochs": args.clip_epochs, "best_epoch": summary["best_epoch"]}
    for name in ("val", "train"):
        data = EvalData.from_split(splits[name])
        qt = [toks[name].row(i) for i in range(len(toks[name]))]
        sv = sparse_from_head(out / "head.pt", data, query_tokens=qt)
        r = evaluate(data, sv, qt, static, EvalOptions(runs=("dense", "sparse")))
        res[name] = {"dense": r["runs"]["dense"], "sparse": r["runs"]["sparse"]}
    return res


def markdown(r: dict) -> str:
    def f(x, n=3):
        return "-" if x is None else f"{x:.{n}f}"

    s = r["sizes"]
    lines = [
        f"Test: COCO dev captions, {s['test']['documents']} documents / {s['test']['queries']} queries; "
        f"train: Flickr30k dev+test, {s['train']['documents']} documents / {s['train']['queries']} queries "
        f"(val {s['val']['documents']} / {s['val']['queries']}). {r['args']['epochs']} epochs, batch "
        f"{r['args']['batch_size']}, lr W1 {r['args']['lr_proj']:g} / LayerNorm+W2 {r['args']['lr_vocab']:g}, "
        f"W2 init `{r['args']['vocab_init']}`, seed {r['args']['seed']}; best epoch by validation R@1.",
        "",
        "| run | eta | R@1 | R@5 | MRR@10 | FLOPs | Exact@20 | Semantic@20 | terms/query | terms/doc | top-10 overlap w/ dense | best epoch | s/epoch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if r["runs"]:
        d = r["runs"][0]["dense"]
        lines.append(f"| dense MiniLM | - | {f(d['R@1'])} | {f(d['R@5'])} | {f(d['MRR@10'])} | - | - | - | - | - | - | - | - |")
    for x in r["runs"]:
        t = x["test"]
        lines.append(
            f"| D2S exp={x['mode']} | {x['eta']:g} | {f(t['R@1'])} | {f(t['R@5'])} | {f(t['MRR@10'])} | "
            f"{f(t['FLOPs'], 1)} | {f(t.get('Exact@20'))} | {f(t.get('Semantic@20'))} | {f(t['terms_per_query'], 1)} | "
            f"{f(t['terms_per_image'], 1)} | {f(t.get('top10_overlap_dense'))} | {x['best_epoch']} | {x['epoch_seconds_mean']:.1f} |"
        )
    c = r.get("clip")
    if c:
        lines += [
            "",
            f"CLIP ViT-B/32 sanity (flickr8k-100-clip-b32, exp=c+w, eta=1e-3, {c['epochs']} epochs, batch 128; "
            f"{c['train_images']} train / {c['val_images']} held-out images):",
            "",
            "| images searched | dense R@1 | sparse R@1 | dense MRR@10 | sparse MRR@10 | FLOPs | Exact@20 |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in ("val", "train"):
            dd, ss = c[name]["dense"], c[name]["sparse"]
            lines.append(
                f"| {name} ({c['val_images'] if name == 'val' else c['train_images']}) | {f(dd['R@1'])} | {f(ss['R@1'])} | "
                f"{f(dd['MRR@10'])} | {f(ss['MRR@10'])} | {f(ss['FLOPs'], 1)} | {f(ss.get('Exact@20'))} |"
            )
    t = r.get("timing")
    if t:
        lines += ["", f"One epoch at batch {t['batch_size']} ({t['steps']} steps, exp=c+w): {t['epoch_seconds']:.1f} s "
                  f"on {t['torch_threads']} torch threads; peak RSS {t['peak_rss_gb_after']:.2f} GB "
                  f"(process, {t['peak_rss_gb_before']:.2f} GB before training)."]
    if "total_seconds" in r:
        lines += ["", f"Whole benchmark: {r['total_seconds'] / 60:.1f} min, peak RSS {r['peak_rss_gb']:.2f} GB."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
