"""What the benchmark scripts share: the repository on ``sys.path``, the machine and load a
run was measured on, percentiles, Markdown tables and the result files ``run.py`` collects.

Every maintained script writes one JSON summary (``--json OUT``) holding its exact command,
date, machine and load, and has a ``render(summary) -> str`` that turns it into the
Markdown table docs/benchmarks.md shows.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

# numpy's BLAS on one thread, as every latency here is measured, unless the caller's environment
# says otherwise: OpenBLAS reads this once, when numpy is first imported, and every benchmark
# imports this module before numpy (set later, it changes nothing: a scan ran on every core).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache"
RESULTS = ROOT / "benchmarks" / "results"
# ../shared/data beside the repository (from a nested worktree it is further up).
DATA = next((p / "shared" / "data" for p in ROOT.parents if (p / "shared" / "data").is_dir()),
            ROOT.parent / "shared" / "data")


def use_repository() -> None:
    """Import the project from this checkout, whatever is installed."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: str | None = None) -> str:
    """One line: CPU, cores, memory, Python (and the threads a run used)."""
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f", {kb / 2**20:.0f} GB"
    except (OSError, IndexError, ValueError):
        pass
    line = f"{cpu_model()}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}"
    return f"{line}, {threads}" if threads else line


def provenance(argv: Sequence[str] | None = None, threads: str | None = None) -> dict:
    """The command, date, machine and load at the start of a run."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = script.relative_to(ROOT)
    except ValueError:
        shown = script
    args = list(sys.argv[1:] if argv is None else argv)
    return {"command": " ".join(["python", str(shown), *args]),
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(threads), "load_start": [round(x, 2) for x in os.getloadavg()]}


def finish(summary: dict) -> dict:
    summary["load_end"] = [round(x, 2) for x in os.getloadavg()]
    return summary


def percentiles(seconds: Iterable[float]) -> dict:
    import numpy as np

    ms = np.asarray(list(seconds)) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3)}


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def caption(summary: dict) -> str:
    """The line under every table: command, date, machine, load."""
    load = " / ".join(f"{x:.2f}" for x in summary.get("load_start", []))
    end = summary.get("load_end")
    if end:
        load += " → " + " / ".join(f"{x:.2f}" for x in end)
    return f"`{summary['command']}` — {summary['date']}; {summary['machine']}; load {load}."


def write_json(summary: dict, path: str | os.PathLike | None) -> None:
    text = json.dumps(summary, indent=2)
    print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "–"


def photo_index(cache: Path = CACHE, photos: int = 800) -> tuple[Path, Path, dict]:
    """The README's main job, done once and cached: the offline model's bundle and a local index
    of the flickr8k-800 photos. Returns (bundle, index, environment for ``d2s-search``), the
    environment keeping the CLI's remembered bundle and caches inside ``cache``."""
    import shutil
    import subprocess

    root = cache / f"photos-{photos}"
    bundle, index = root / "bundle", root / "index"
    env = dict(os.environ, D2S_CONFIG_DIR=str(root / "config"), XDG_CACHE_HOME=str(root / "cache"))
    exe = str(Path(sys.executable).with_name("d2s-search"))
    if not (bundle / "manifest.json").is_file():
        subprocess.run([exe, "export-onnx", "--model", "offline-mini", "--out", str(bundle), "--json"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    if not (index / "index.sqlite").is_file():
        images = DATA / "flickr8k-800" / "images"
        if not images.is_dir():
            raise SystemExit(f"{images} is missing: the photo benchmarks need ../shared/data beside the repository")
        folder = root / "images"
        folder.mkdir(parents=True, exist_ok=True)
        for p in sorted(images.glob("*.jpg"))[:photos]:
            target = folder / p.name
            if not target.exists():
                shutil.copyfile(p, target)
        subprocess.run([exe, "ingest", str(folder), "--bundle", str(bundle), "--index", str(index), "--json"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    return bundle, index, env


def open_photo_index(bundle: str | None = None, index: str | None = None):
    """(CPU encoder, opened local backend) of ``bundle`` and ``index``, or of the cached
    photo index (:func:`photo_index`) when no bundle is given; the caller closes the backend."""
    from d2s_search.backends.local import LocalBackend
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder

    bundle_dir, index_dir = (Path(bundle), Path(index)) if bundle else photo_index()[:2]
    loaded = Bundle.load(bundle_dir)
    backend = LocalBackend(index_dir)
    backend.open(loaded.identity(), create=False)
    return Encoder(loaded, device="cpu"), backend


_BUILD = """
import json, sys, time
import d2s_search
from d2s_search.backends.local import LocalBackend
from d2s_search.backends.local import backend as backend_mod

graphs = 0.0
dense_graphs = backend_mod.LocalBackend._dense_graphs

def timed(self, *args, **kwargs):
    global graphs
    start = time.perf_counter()
    try:
        return dense_graphs(self, *args, **kwargs)
    finally:
        graphs += time.perf_counter() - start

backend_mod.LocalBackend._dense_graphs = timed
backend = LocalBackend(sys.argv[1])
backend.open(None, create=False)
t0 = time.perf_counter()
backend._search_state()
seconds = time.perf_counter() - t0
status = open("/proc/self/status").read()
print(json.dumps({"seconds": round(seconds, 1), "graphs_after_shards": round(graphs, 1),
                  "peak_rss_mb": int(status.split("VmHWM:")[1].split()[0]) // 1024, "package": d2s_search.__file__}))
"""


def build_in_a_process(path: Path, threads: int, tree: Path = ROOT) -> dict:
    """A local index's search structures built from its SQLite by a fresh process of ``tree``'s
    code, faiss (the dense graphs) on ``threads`` threads: {"seconds", "graphs_after_shards"
    (the part spent on the graphs once the shards were made), "peak_rss_mb", "package"} of that
    process alone. SystemExit when the process imported another tree's package."""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _BUILD, str(path)], capture_output=True, text=True, env=env,
                          check=True, cwd=tree)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["package"].startswith(str(tree)):  # a build of another tree would measure nothing asked
        raise SystemExit(f"the build in {tree} imported {out['package']}")
    return out
