"""Collect `d2s-search evaluate --json` outputs into the paper's table layout.

    python benchmarks/collect_d2s_runs.py runs/ > table.md

Reads every ``<dataset>-<model>-exp<mode>-eta<eta>.eval.json`` under the folder.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"(?P<ds>[^-]+)-(?P<model>[^-]+)-exp(?P<mode>[^-]+)-eta(?P<eta>[^.]+(?:\.\d+)?(?:e-?\d+)?)\.eval\.json$")


def main(folder: str) -> None:
    rows, dense = [], {}
    for f in sorted(Path(folder).glob("*.eval.json")):
        m = NAME.match(f.name)
        if not m:
            continue
        r = json.loads(f.read_text())["runs"]
        dense[(m["ds"], m["model"])] = r["dense"]
        rows.append((m["ds"], m["model"], f"D2S eta={m['eta']}, exp={m['mode']}", r["sparse"]))
    print("| dataset | model | run | R@1 | R@5 | R@10 | MRR@10 | FLOPs |")
    print("|---|---|---|---|---|---|---|---|")
    for (ds, model), d in sorted(dense.items()):
        print(f"| {ds} | {model} | dense | {100 * d['R@1']:.1f} | {100 * d['R@5']:.1f} | {100 * d['R@10']:.1f} | {100 * d['MRR@10']:.1f} | - |")
        for ds2, model2, name, s in rows:
            if (ds2, model2) == (ds, model):
                print(f"| {ds} | {model} | {name} | {100 * s['R@1']:.1f} | {100 * s['R@5']:.1f} | "
                      f"{100 * s['R@10']:.1f} | {100 * s['MRR@10']:.1f} | {s['FLOPs']:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs")
