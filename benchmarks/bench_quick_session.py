"""ONNX Runtime text-session creation for a one-query process, layouts of the optimised graph
side by side (issue 17): each layout is timed in a fresh process, rounds interleaved.

    python benchmarks/bench_quick_session.py --bundle B --rounds 8 --work test-artifacts/quick-session

Layouts: the bundle's ``text.onnx`` optimised at load (no cache), the optimised graph saved as
one ``.onnx`` file (the cache before this change), and the graph with its weights as external
data (the cache ``d2s-search query`` keeps now). All without weight pre-packing, one query run
each; the first outputs are compared so a faster layout cannot give other vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import onnxruntime as ort
path, level = sys.argv[1], sys.argv[2]
opts = ort.SessionOptions()
opts.log_severity_level = 3
opts.add_session_config_entry("session.disable_prepacking", "1")
opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
t1 = time.perf_counter()
session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
ids = np.array([[101, 3899, 1999, 1037, 2482, 102]], dtype=np.int64)
dense, sparse = session.run(["dense", "sparse"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "session": t2 - t1, "run": t3 - t2,
                  "sparse": sparse[0].tolist()[:2000], "dense": dense[0].tolist()}))
"""

MAKE = r"""
import sys
import onnxruntime as ort
src, out, external = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
opts = ort.SessionOptions()
opts.log_severity_level = 3
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
opts.optimized_model_filepath = out
if external:
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.data")
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True, type=Path)
    parser.add_argument("--work", required=True, type=Path, help="Folder for the two optimised layouts.")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    source = args.bundle / "text.onnx"
    single, external = args.work / "single" / "graph.onnx", args.work / "external" / "graph.onnx"
    for out, ext in ((single, "0"), (external, "1")):
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-c", MAKE, str(source), str(out), ext], check=True)
    layouts = {"bundle graph, optimised at load": (source, "ORT_ENABLE_EXTENDED"),
               "optimised graph, one file": (single, "ORT_DISABLE_ALL"),
               "optimised graph, weights as external data": (external, "ORT_DISABLE_ALL")}
    names = list(layouts)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    load = os.getloadavg()
    for round_no in range(args.rounds):
        for name in names[round_no % len(names):] + names[: round_no % len(names)]:
            path, level = layouts[name]
            done = subprocess.run([sys.executable, "-c", CHILD, str(path), level], capture_output=True, text=True,
                                  check=True)
            runs[name].append(json.loads(done.stdout))
    first = runs[names[0]][0]
    print(f"load {' / '.join(f'{x:.2f}' for x in load)} -> {' / '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{args.rounds} rounds\n")
    print("| layout | session creation median s | first run median s | max abs diff vs bundle graph |")
    print("|---|---|---|---|")
    for name in names:
        diff = max(max(abs(a - b) for a, b in zip(r["sparse"], first["sparse"])) for r in runs[name])
        diff = max(diff, max(max(abs(a - b) for a, b in zip(r["dense"], first["dense"])) for r in runs[name]))
        print(f"| {name} | {statistics.median(r['session'] for r in runs[name]):.3f} | "
              f"{statistics.median(r['run'] for r in runs[name]):.3f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
