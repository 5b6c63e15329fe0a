"""Draw the sparsity-quality frontier of the runs in ``bench_d2s_frontier.py``'s runs.jsonl.

x: FLOPs (log scale); y: sparse R@1 as a share of the dense model's R@1 on the same test
set, so the D2S paper's BLIP/COCO points (same ratio, their Table 1) can be drawn beside
ours for shape. One line per recipe (runs sharing a ``--family`` prefix, sorted by FLOPs),
the dense line at 1, the issue's targets (0.90 at <= 12 FLOPs, 0.95 at <= 40) as marks.

    python benchmarks/plot_frontier.py test-artifacts/frontier/runs.jsonl --out docs/frontier.png \
        --shifted test-artifacts/document_shift.jsonl --boosted test-artifacts/document_shift_boost.jsonl

``--shifted``: ``bench_document_shift.py``'s rows; per head, a line from its unshifted point
through the document shifts chosen on validation for each FLOPs budget. ``--grid``: the same
script's rows written with ``--test-grid``; per head, its test curve over every shift.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

# D2S paper, Table 1, BLIP on COCO 5k: (FLOPs, R@1) with dense R@1 57.3.
PAPER_BLIP_COCO = {"exp=0": (2.8, 45.5), "c+w eta=1e-3": (11.5, 51.8), "exp=1": (49.1, 53.4),
                   "c+w eta=1e-5": (78.4, 54.5)}
PAPER_DENSE = 57.3
# Reference lines measured on the same test set (dense R@1 0.419), (FLOPs, R@1):
REFERENCE_LINES = {
    # docs/benchmarks.md "D2S training (issue 3)": the paper's head (L1, all terms, no bias), 6 epochs
    "issue 3: paper's head, L1, exp=c+w (eta 1e-2, 1e-3)": [(12.1, 0.282), (113.8, 0.358)],
    "issue 3: paper's head, L1, exp=c (eta 1e-2, 1e-3)": [(12.4, 0.291), (100.8, 0.371)],
    # W1 fitted to the captions' words, bias -10 / -8 / -6, words only: no training step at all
    "W1 fit to words, untrained (bias -10, -8, -6)": [(0.37, 0.122), (2.8, 0.173), (29.0, 0.230)],
    # docs/benchmarks.md "Sparsity-quality frontier", earlier runs (6 epochs unless noted)
    "words, bias -1/-2, FLOPS (random W1)": [(4.9, 0.295), (7.8, 0.302)],
    "words, W1 fit, bias -6, FLOPS (eta 0.1 .. 0.003)": [(3.3, 0.275), (5.3, 0.288), (7.4, 0.294), (8.1, 0.301)],
    "words, W1 fit, FLOPS, higher lr (6 and 12 epochs)": [(1.8, 0.309), (2.2, 0.298), (3.0, 0.305)],
}
REFERENCE_DENSE = 0.419


def family(row: dict) -> str:
    """Runs whose settings differ only in eta form one line, named after the recipe without its eta."""
    if row.get("family"):
        return row["family"]
    settings = ",".join(sorted(kv for kv in row["spec"].partition(":")[2].split(",") if not kv.startswith("eta=")))
    name = re.sub(r"-?\d+e-\d+", "", row["recipe"])
    name = name + "1" if name.endswith("-l") else name  # "...-l1e-2" is L1 at eta 1e-2
    return _FAMILY_NAMES.setdefault(settings, name)


_FAMILY_NAMES: dict[str, str] = {}


def table(rows: list[dict]) -> str:
    """The runs as a markdown table (docs/benchmarks.md)."""
    head = ("| recipe | settings | R@1 | / dense | R@5 | MRR@10 | FLOPs | Exact@20 | Semantic@20 | terms/query | "
            "terms/doc | most frequent expansion (share of queries) | FLOPs share of terms in >50% of docs | "
            "best epoch / epochs | min |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(rows, key=lambda r: (family(r), r["test"]["FLOPs"])):
        t, co = r["test"], r["coactivation"]
        fq = f"{co.get('max_foreign_query_term')} ({co.get('max_foreign_query_share', 0):.0%})"
        lines.append(
            f"| {r['recipe']} | `{r['spec'].partition(':')[2]}` | {t['R@1']:.3f} | {r['ratio_R@1']:.2f} | {t['R@5']:.3f} | "
            f"{t['MRR@10']:.3f} | {t['FLOPs']:.1f} | {t['Exact@20']:.3f} | {t.get('Semantic@20', float('nan')):.3f} | "
            f"{t['terms_per_query']:.1f} | {t['terms_per_image']:.1f} | {fq} | {co['flops_share_common_terms']:.0%} | "
            f"{r['best_epoch']} / {r.get('epochs_run', r['train']['epochs'])} of {r['train']['epochs']} | {r['train_seconds'] / 60:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser()
    ap.add_argument("runs", type=Path, nargs="*")
    ap.add_argument("--out", type=Path, default=Path("docs/frontier.png"))
    ap.add_argument("--table", action="store_true", help="Also print the runs as a markdown table.")
    ap.add_argument("--shifted", type=Path, help="bench_document_shift.py's JSON lines (caption-benchmark heads).")
    ap.add_argument("--boosted", type=Path, help="The same with --boost (shift and query word boost chosen together).")
    ap.add_argument("--grid", type=Path, action="append", default=[],
                    help="bench_document_shift.py --test-grid rows: each head's test curve over the shifts.")
    ap.add_argument("--no-references", action="store_true", help="Leave out the earlier sessions' reference lines.")
    ap.add_argument("--title", default="D2S on MiniLM captions (train Flickr30k, test COCO dev): R@1 vs FLOPs")
    args = ap.parse_args()
    rows = [json.loads(line) for p in args.runs for line in p.read_text().splitlines() if line.strip()]
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[family(r)].append(r)
    fig, ax = plt.subplots(figsize=(13, 6))
    for name, rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["test"]["FLOPs"])
        xs = [r["test"]["FLOPs"] for r in rs]
        ys = [r["ratio_R@1"] for r in rs]
        ax.plot(xs, ys, marker="o", label=name)
    for path, marker, what in ((args.shifted, "^", "document shift"), (args.boosted, "v", "shift + word boost")):
        if not path:
            continue
        chosen: dict[str, list[dict]] = defaultdict(list)
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else None
            if row and "frontier" in row["head"]:
                chosen[Path(row["head"]).parent.name].append(row)
        for name, rs in sorted(chosen.items()):
            pts = sorted({(rs[0]["test_no_shift"]["FLOPs"], rs[0]["test_no_shift"]["ratio"])}
                         | {(r["test"]["FLOPs"], r["test"]["ratio"]) for r in rs})
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker=marker, linestyle="-.",
                    label=f"{name} + {what} (chosen on val)")
    curves: dict[str, list[tuple[float, float]]] = {}
    for path in args.grid:
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else None
            if row and row.get("test_grid"):  # one curve per head (every budget's row carries the same grid)
                curves[Path(row["head"]).parent.name] = sorted((g["FLOPs"], g["ratio"]) for g in row["test_grid"])
    for name, pts in sorted(curves.items()):
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=4,
                linestyle="--" if name.startswith("base") else "-", label=f"{name}: test over shifts 0-4")
    for name, pts in ({} if args.no_references else REFERENCE_LINES).items():
        ax.plot([p[0] for p in pts], [p[1] / REFERENCE_DENSE for p in pts], marker="x", linestyle="--",
                linewidth=1, label=name)
    px = [v[0] for v in PAPER_BLIP_COCO.values()]
    py = [v[1] / PAPER_DENSE for v in PAPER_BLIP_COCO.values()]
    ax.scatter(px, py, marker="*", s=120, color="black", label="paper, BLIP/COCO (shape only)", zorder=5)
    for lbl, x, y in zip(PAPER_BLIP_COCO, px, py, strict=True):
        ax.annotate(lbl, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.axhline(1.0, color="grey", linestyle="--", label="dense MiniLM")
    ax.plot([0.1, 12], [0.90, 0.90], color="red", linewidth=1, linestyle=":", label="targets (0.90 @<=12, 0.95 @<=40)")
    ax.plot([0.1, 40], [0.95, 0.95], color="red", linewidth=1, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs (mean shared active terms per query-document pair, log scale)")
    ax.set_ylabel("sparse R@1 / dense R@1")
    ax.set_title(args.title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: the low-FLOPs points stay visible
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    if args.table:
        print(table(rows))


if __name__ == "__main__":
    main()
