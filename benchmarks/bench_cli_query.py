"""Whole-process wall time of shell commands, interleaved round by round (issue 17).

Each round runs every command once under ``/usr/bin/time -f %e`` (the order rotating per
round, output discarded) and the table gives medians, every run, and the ratio of each
median to the reference's (the command named by ``--reference``, measured in the same run).

    python benchmarks/bench_cli_query.py --rounds 8 --reference main \\
        --cmd 'branch=d2s-search query "dogs in a car" --no-serve --bundle B --index I' \\
        --cmd 'main=/work/main/.venv/bin/d2s-search query "dogs in a car" --no-serve --bundle B --index I2' \\
        --cmd 'python -c pass=python -c pass'
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess


def timed(command: str) -> float:
    """Seconds ``/usr/bin/time`` reports for one run of ``command`` (a shell line)."""
    done = subprocess.run(["/usr/bin/time", "-f", "%e", "sh", "-c", command], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    lines = done.stderr.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"failed ({done.returncode}): {command}\n{done.stderr}")
    return float(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmd", action="append", required=True, help="NAME=SHELL COMMAND (repeat)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--reference", help="NAME whose median the ratios divide by (default: the first)")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed runs of each command first.")
    parser.add_argument("--json", dest="json_out", help="Also write the runs here.")
    args = parser.parse_args()
    commands = dict(c.split("=", 1) for c in args.cmd)
    reference = args.reference or next(iter(commands))
    names = list(commands)
    for _ in range(args.warmup):
        for name in names:
            timed(commands[name])
    start = (dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), os.getloadavg())
    runs: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(args.rounds):
        order = names[round_no % len(names):] + names[: round_no % len(names)]
        for name in order:
            runs[name].append(timed(commands[name]))
    end = (dt.datetime.now(dt.UTC).strftime("%H:%M UTC"), os.getloadavg())
    medians = {name: statistics.median(values) for name, values in runs.items()}
    print(f"{start[0]} -> {end[0]}; load {' / '.join(f'{x:.2f}' for x in start[1])} -> "
          f"{' / '.join(f'{x:.2f}' for x in end[1])}; {platform.machine()}, {os.cpu_count()} cores; "
          f"{args.rounds} rounds interleaved\n")
    print(f"| | median s | ratio to {reference} | runs (s) |\n|---|---|---|---|")
    for name in names:
        values = " ".join(f"{v:.2f}" for v in sorted(runs[name]))
        print(f"| {name} | {medians[name]:.3f} | {medians[name] / medians[reference]:.2f} | {values} |")
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"commands": commands, "runs": runs, "load_start": start[1], "load_end": end[1],
                       "date": start[0]}, out, indent=2)


if __name__ == "__main__":
    main()
