"""What ``d2s-search train`` gives with its defaults, on a split no choice was made on.

    OMP_NUM_THREADS=1 python benchmarks/bench_caption_recipe.py --seeds 0,1,2 --json OUT.json

The caption benchmark (``bench_d2s_minilm.build_caption_dataset``): the real all-MiniLM-L6-v2
is the frozen dense model; per image the first caption plays the image, the other four are
queries. Train on the Flickr30k dev+test caption files (200 of their images held out for
validation), test on the COCO dev file (1,000 documents, 4,000 queries), which no choice
sees. Each seed runs the product's own commands with default flags:
``d2s-search train --data D --seed S`` (the epoch and the document shift are chosen on
validation, within 12 FLOPs), then ``d2s-search evaluate --split val`` and ``--split test``
with the head. Reported per seed and as a mean: sparse and dense R@1 on validation and test,
the sparse/dense ratio on each and the drop between them, FLOPs, Exact@20, terms per query,
and the widest expansion term (the term active in most queries that lack it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common

_common.use_repository()


def cli(*args: str) -> dict:
    exe = Path(sys.executable).with_name("d2s-search")
    done = subprocess.run([str(exe), *args, "--json"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"d2s-search {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def split_metrics(result: dict) -> dict:
    dense, sparse = result["runs"]["dense"], result["runs"]["sparse"]
    co = result.get("coactivation") or {}
    return {"dense_R@1": dense["R@1"], "sparse_R@1": sparse["R@1"], "ratio": sparse["R@1"] / dense["R@1"],
            "FLOPs": sparse["FLOPs"], "Exact@20": sparse.get("Exact@20"), "terms_per_query": sparse.get("terms_per_query"),
            "widest_expansion": co.get("max_foreign_query_term"), "widest_expansion_share": co.get("max_foreign_query_share")}


def run_seed(data: Path, out: Path, seed: int, threads: int) -> dict:
    head = out / f"seed-{seed}"
    t0 = time.perf_counter()
    if not (head / "head.pt").is_file() or not (head / "summary.json").is_file():
        summary = cli("train", "--data", str(data), "--out", str(head), "--seed", str(seed), "--threads", str(threads))
        (head / "summary.json").write_text(json.dumps(summary))
    summary = json.loads((head / "summary.json").read_text())
    train_s = time.perf_counter() - t0
    row = {"seed": seed, "epoch_kept": summary.get("best_epoch"), "train_minutes": round(train_s / 60, 1)}
    shift = summary.get("document_shift") or {}
    row["document_shift"] = shift.get("document_shift")
    for split in ("val", "test"):
        result = cli("evaluate", "--data", str(data), "--split", split, "--head", str(head / "head.pt"),
                     "--runs", "dense,sparse")
        row[split] = split_metrics(result)
    row["drop"] = row["val"]["ratio"] - row["test"]["ratio"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--data", default=str(_common.CACHE / "captions"), help="caption benchmark vectors (built once)")
    parser.add_argument("--out", default=str(_common.CACHE / "caption-recipe"), help="heads, one folder per seed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training run")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads=f"{args.threads} torch thread(s)")
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_d2s_minilm import build_caption_dataset

    data = Path(args.data)
    build_caption_dataset(data)
    rows = [run_seed(data, Path(args.out), int(s), args.threads) for s in args.seeds.split(",")]
    test_ratios = [r["test"]["ratio"] for r in rows]
    summary.update({
        "data": "train Flickr30k dev+test captions (val: 200 images, 800 queries); test COCO dev (1,000 documents, 4,000 queries)",
        "seeds": rows,
        "mean": {"val_ratio": statistics.mean(r["val"]["ratio"] for r in rows),
                 "test_ratio": statistics.mean(test_ratios),
                 "test_ratio_se": statistics.stdev(test_ratios) / math.sqrt(len(rows)) if len(rows) > 1 else None,
                 "test_FLOPs": statistics.mean(r["test"]["FLOPs"] for r in rows),
                 "test_Exact@20": statistics.mean(r["test"]["Exact@20"] for r in rows),
                 "drop": statistics.mean(r["drop"] for r in rows)},
    })
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    def f(x, d=3):
        return "–" if x is None else f"{x:.{d}f}"

    rows = []
    for r in summary["seeds"]:
        v, t = r["val"], r["test"]
        rows.append([r["seed"], r["epoch_kept"], f(r["document_shift"], 1),
                     f"{f(v['sparse_R@1'])} / {f(v['dense_R@1'])} = **{f(v['ratio'])}**", f(v["FLOPs"], 1),
                     f"{f(t['sparse_R@1'])} / {f(t['dense_R@1'])} = **{f(t['ratio'])}**", f(t["FLOPs"], 1),
                     f(r["drop"]), f(t["Exact@20"]), f(t["terms_per_query"], 1),
                     f"{t['widest_expansion']} ({t['widest_expansion_share']:.0%})" if t["widest_expansion"] else "–"])
    m = summary["mean"]
    se = f" ± {m['test_ratio_se']:.3f}" if m.get("test_ratio_se") else ""
    rows.append(["mean", "", "", f"**{f(m['val_ratio'])}**", "", f"**{f(m['test_ratio'])}**{se}", f(m["test_FLOPs"], 1),
                 f(m["drop"]), f(m["test_Exact@20"]), "", ""])
    head = ["seed", "epoch kept", "shift", "val: sparse / dense R@1", "val FLOPs", "test: sparse / dense R@1",
            "test FLOPs", "drop val → test", "test Exact@20", "terms / query", "widest expansion (test queries)"]
    return _common.table(head, rows) + "\n\n" + _common.caption(summary)


if __name__ == "__main__":
    main()
