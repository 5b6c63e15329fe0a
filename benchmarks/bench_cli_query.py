"""``d2s-search query`` as a whole process, as a user at a terminal waits for it.

    python benchmarks/bench_cli_query.py [--rounds 10] [--json OUT]

On the README's main job (the offline model's bundle and the 800 flickr8k photos, built once
and cached by ``_common.photo_index``), each round runs, in rotating order: a text query that
searches in its own process (``--no-serve``: imports, ONNX Runtime session, index open, search),
the same query answered by a running ``d2s-search serve`` on that index, and ``python -c pass``
(the interpreter's own start, the reference). Wall time of each process; medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common

_common.use_repository()

QUERY = "dogs in a car"


def timed(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-2000:]}")
    return seconds


def start_serve(exe: str, bundle: Path, index: Path, env: dict) -> subprocess.Popen:
    """``d2s-search serve`` on a free port, once it prints its ready line."""
    proc = subprocess.Popen([exe, "serve", "--bundle", str(bundle), "--index", str(index), "--port", "0", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise SystemExit("serve did not start")
    json.loads(line)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    bundle, index, env = _common.photo_index()
    summary = _common.provenance()
    exe = str(Path(sys.executable).with_name("d2s-search"))
    local = [exe, "query", QUERY, "--bundle", str(bundle), "--index", str(index), "--no-serve"]
    asked = [exe, "query", QUERY, "--bundle", str(bundle), "--index", str(index)]
    serve = start_serve(exe, bundle, index, env)
    try:
        commands = {"query, searched in its own process": local, "query answered by a running serve": asked,
                    "python -c pass (reference)": [sys.executable, "-c", "pass"]}
        names = list(commands)
        for name in names:  # warm the page cache and ONNX Runtime's optimised-graph cache
            timed(commands[name], env)
        runs: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                runs[name].append(timed(commands[name], env))
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=10)
        except subprocess.TimeoutExpired:
            serve.kill()
    summary.update({"query": QUERY, "photos": 800, "rounds": args.rounds,
                    "runs": {name: [round(x, 3) for x in values] for name, values in runs.items()},
                    "medians": {name: round(statistics.median(values), 3) for name, values in runs.items()}})
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    medians = summary["medians"]
    reference = medians["python -c pass (reference)"]
    rows = [[name, f"{m:.3f}", _common.ratio(m, reference), f"{min(summary['runs'][name]):.3f}-{max(summary['runs'][name]):.3f}"]
            for name, m in medians.items()]
    return (_common.table(["process", "median s", "vs python -c pass", "range s"], rows)
            + f"\n\n`d2s-search query \"{summary['query']}\"` on the {summary['photos']}-photo index of the quick start "
            f"(offline-mini bundle), {summary['rounds']} rounds in rotating order.\n\n" + _common.caption(summary))


if __name__ == "__main__":
    main()
