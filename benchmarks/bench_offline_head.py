"""The offline model's D2S head trained with a recipe, from photos, caption pairs or both.

Training sources (the head is shared by both sides, so either kind of pair teaches it):

* ``photos``: the aligned Flickr8k training photos of an ``align`` run (500 photos x 5
  captions), image side = aligned photo vector, caption side = aligned caption vector;
* ``captions``: caption pairs of the Flickr30k caption files (caption 0 plays the image,
  captions 1-4 are the queries; ``bench_d2s_minilm.py`` builds and caches their MiniLM
  vectors), passed through the run's trained text projection so they live in the same
  space as the photos' captions;
* ``both``: the union.

Model selection on the run's 100 val photos (the best epoch, then, as ``train --flops-budget``
does, the document shift and query word boost); numbers on its 200 held-out test photos:
dense and sparse R@1, FLOPs, Exact@20 (Eq. 2), image term precision (the share of a photo's
top-10 terms that occur as whole words in any of its 5 captions), the largest share of
photos in which one term is active, and the terms of a few example queries.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_offline_head.py --run runs/align \\
        --sources both --recipe "regularizer=flops,eta=0.1,bias_init=-2" --out test-artifacts/offline/heads/both

Appends one JSON line per run to ``<out>/../offline_heads.jsonl``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

EXAMPLES = ("dogs in a car", "a man riding a bike", "two children playing on the beach", "qwertyuiop")
WORD = re.compile(r"[a-z]+")


def text_projection(run: Path):
    from safetensors.numpy import load_file

    state = load_file(str(run / "projections.safetensors"))
    return state["text.linear.weight"], state["text.linear.bias"]


def project(z: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = z @ w.T + b
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def caption_pairs(run: Path, caption_data: Path):
    """The caption benchmark's pairs (Flickr30k train/val, COCO dev test) moved into the run's text space."""
    from bench_d2s_minilm import build_caption_dataset

    from d2s_search.train.data import load_dataset

    build_caption_dataset(caption_data)
    splits = load_dataset(caption_data)
    w, b = text_projection(run)
    for s in splits.values():
        s.text_emb = project(s.text_emb, w, b)
        s.image_emb = project(s.image_emb, w, b)
    return splits


def concat(name: str, a, b):
    from d2s_search.train.data import PairSplit

    return PairSplit(
        name, list(a.caption_ids) + list(b.caption_ids), list(a.captions) + list(b.captions),
        np.vstack([a.text_emb, b.text_emb]), list(a.image_ids) + list(b.image_ids),
        np.vstack([a.image_emb, b.image_emb]),
        np.concatenate([a.caption_image, np.asarray(b.caption_image) + len(a.image_ids)]),
    )


def caption_word_sets(split) -> list[set[str]]:
    """Per photo, the whole words of its captions."""
    words: list[set[str]] = [set() for _ in split.image_ids]
    for cap, img in zip(split.captions, split.caption_image, strict=True):
        words[int(img)].update(WORD.findall(cap.lower()))
    return words


def word_precision(top_words: list[list[str]], words: list[set[str]]) -> float:
    """Mean share of each photo's listed words that occur in its captions (0 for no words)."""
    return float(np.mean([np.mean([w in words[i] for w in top]) if len(top) else 0.0
                          for i, top in enumerate(top_words)]))


def image_term_precision(docs, split, names, k: int = 10) -> float:
    """Mean share of each photo's top-k terms that occur as whole words in its captions."""
    top_words = []
    for i in range(docs.shape[0]):
        s, e = docs.indptr[i], docs.indptr[i + 1]
        idx, val = docs.indices[s:e], docs.data[s:e]
        top_words.append([names[t] for t in idx[np.argsort(-val, kind="stable")[:k]]])
    return word_precision(top_words, caption_word_sets(split))


def main() -> None:
    import torch
    from bench_d2s_frontier import parse_recipe

    from d2s_search import metrics as M
    from d2s_search.evaluate import EvalData, EvalOptions, evaluate, sparse_from_head
    from d2s_search.train.data import load_dataset
    from d2s_search.train.minilm import MiniLMEncoder
    from d2s_search.train.modeling import build_head, encode_sparse
    from d2s_search.train.trainer import TrainConfig, train
    from d2s_search.train.vocab import (
        excluded_token_ids,
        id_to_token,
        load_tokenizer,
        tokenize_captions,
    )

    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, required=True, help="An `align` run directory.")
    ap.add_argument("--sources", choices=("photos", "captions", "both"), default="both")
    ap.add_argument("--recipe", default="", help="key=value,... over the defaults (see bench_d2s_frontier.py)")
    ap.add_argument("--caption-data", type=Path, default=ROOT / "test-artifacts" / "bench-d2s" / "data")
    ap.add_argument("--caption-splits", default="train,val",
                    help="Which splits of --caption-data give caption pairs: train,val (Flickr30k) and test "
                         "(COCO dev: distinct captions the held-out photos never see).")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flops-budget", type=float, default=12.0,
                    help="As `train --flops-budget`: the document shift and query word boost chosen on the val photos "
                         "and saved in head.pt (0 = neither).")
    ap.add_argument("--calibration-distractors", type=int, default=0,
                    help="As `train --calibration-distractors`: the shift is chosen by R@1 against the val photos "
                         "plus up to this many training photos (not caption pairs); 0 = the val photos alone.")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tok = load_tokenizer()
    names = id_to_token(tok)
    photos = load_dataset(args.run / "embeddings")
    parts = []
    if args.sources in ("photos", "both"):
        parts.append(photos["train"])
    if args.sources in ("captions", "both"):
        caps = caption_pairs(args.run, args.caption_data)
        wanted = args.caption_splits.split(",")
        unknown = set(wanted) - set(caps)
        if unknown:
            raise SystemExit(f"--caption-splits: no split {', '.join(sorted(unknown))} (have {', '.join(caps)})")
        parts.append(functools.reduce(lambda a, b: concat("captions", a, b), [caps[name] for name in wanted]))
    train_split = parts[0] if len(parts) == 1 else concat("train", *parts)
    train_tokens = tokenize_captions(train_split.captions, tok)
    val, test = photos["val"], photos["test"]
    val_tokens = tokenize_captions(val.captions, tok)

    _, train_kw, head_kw = parse_recipe("offline:" + args.recipe)
    proj_init = head_kw.pop("proj_init", "default")
    head_kw.pop("freeze_vocab", None)
    head_kw.setdefault("output_terms", "words")
    head = build_head(train_split.dim, "minilm", excluded_token_ids(tok), tok.get_vocab_size(), tokenizer=tok,
                      **head_kw)
    head.vocab.weight.requires_grad_(False)  # shipped models rebuild W2 from MiniLM: it must not change
    if proj_init == "words":
        from d2s_search.train.modeling import fit_projection_to_words

        fit_projection_to_words(head, train_split, train_tokens)
    defaults = {"epochs": 30, "batch_size": 64, "lr_proj": 5e-3, "lr_vocab": 1e-2, "val_images": 0}
    cfg = TrainConfig(**{**defaults, **train_kw})
    head.config.notes = {**head.config.notes, "sources": args.sources}
    photo_distractors = photos["train"].image_emb[: max(args.calibration_distractors, cfg.val_distractors)]
    summary = train(head, train_split, train_tokens, cfg, args.out, val, val_tokens, progress=False,
                    distractors=photo_distractors,
                    log=lambda e: print(f"  epoch {e.epoch}: ce {e.ce:.3f} val R@1 {e.val['R@1']:.3f} "
                                        f"FLOPs {e.val['FLOPs']:.1f} ({e.seconds:.0f}s)", flush=True))
    shift = None
    if args.flops_budget > 0:  # as `train` does after training: what `align ship` then ships
        from d2s_onnx_export.head import save_head

        from d2s_search.train.calibrate import BOOSTS, choose_document_shift

        extra = photo_distractors[: args.calibration_distractors]
        shift = choose_document_shift(head, val, val_tokens, cfg.expansion, args.flops_budget, boosts=BOOSTS,
                                      distractors=extra if len(extra) else None).to_json()
        save_head(head, args.out / "head.pt")
    ev = EvalData.from_split(test, "flickr8k-800/test")
    ct = tokenize_captions(test.captions, tok)
    qt = [ct.row(i) for i in range(len(ct))]
    sv = sparse_from_head(args.out / "head.pt", ev, qt)
    res = evaluate(ev, sv, qt, None, EvalOptions(runs=("dense", "sparse")), names)
    sparse, dense = res["runs"]["sparse"], res["runs"]["dense"]
    photo_share = M.active_share(sv.docs)
    enc = MiniLMEncoder()
    w, b = text_projection(args.run)
    ex = encode_sparse(head, project(enc(list(EXAMPLES)), w, b))
    examples = {}
    for i, q in enumerate(EXAMPLES):
        s, e = ex.indptr[i], ex.indptr[i + 1]
        order = np.argsort(-ex.data[s:e], kind="stable")[:12]
        examples[q] = [names[ex.indices[s:e][j]] for j in order]
    top_photo = {}
    for i in range(3):
        s, e = sv.docs.indptr[i], sv.docs.indptr[i + 1]
        order = np.argsort(-sv.docs.data[s:e], kind="stable")[:10]
        top_photo[test.image_ids[i]] = {"terms": [names[sv.docs.indices[s:e][j]] for j in order],
                                        "captions": [c for c, im in zip(test.captions, test.caption_image, strict=True)
                                                     if im == i][:2]}
    row = {
        "sources": args.sources, "recipe": args.recipe, "train_pairs": len(train_split.caption_ids),
        "best_epoch": summary["best_epoch"], "steps": summary["steps"],
        "dense": {k: dense[k] for k in ("R@1", "R@5", "R@10", "MRR@10")},
        "sparse": {k: v for k, v in sparse.items() if isinstance(v, float)},
        "ratio_R@1": sparse["R@1"] / dense["R@1"],
        "image_term_precision@10": image_term_precision(sv.docs, test, names),
        "max_photo_share": float(photo_share.max()), "max_photo_term": names[int(np.argmax(photo_share))],
        "coactivation": res["coactivation"], "examples": examples, "photos": top_photo, "document_shift": shift,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"), "load": os.getloadavg()[0],
    }
    with (args.out.parent / "offline_heads.jsonl").open("a") as f:
        f.write(json.dumps(row, default=float) + "\n")
    print(json.dumps({k: row[k] for k in ("sources", "recipe", "ratio_R@1", "image_term_precision@10",
                                          "max_photo_share", "max_photo_term", "best_epoch")}
                     | {"R@1": round(sparse["R@1"], 3), "dense": round(dense["R@1"], 3),
                        "FLOPs": round(sparse["FLOPs"], 1), "Exact@20": round(sparse["Exact@20"], 3),
                        "dogs in a car": examples["dogs in a car"]}, default=float), flush=True)


if __name__ == "__main__":
    main()
