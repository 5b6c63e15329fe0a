"""What a full garbage collection costs a serving process, with and without ``gc.freeze()``
after start-up (what ``d2s-search serve`` does).

    python benchmarks/bench_serve_gc.py --index d2s-index [--bundle BUNDLE] [--queries 400]

Opens the index and its bundle as ``serve`` does (the app, the models, the index), then: the
number of objects the collector tracks and the time of a full collection; and the API's
``/api/search`` answering the first ``--queries`` flickr8k-800 captions (in process, through
FastAPI's test client), counting the full collections that happen meanwhile and their times,
first as start-up left the collector, then after ``gc.collect(); gc.freeze()``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED = Path(os.environ.get("D2S_SHARED_DATA") or ROOT.parent / "shared" / "data")


def searches(app, captions: list[str], label: str) -> None:
    from fastapi.testclient import TestClient

    full: list[float] = []
    started = [0.0]

    def watch(phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                full.append(time.perf_counter() - started[0])

    gc.callbacks.append(watch)
    client = TestClient(app)
    latency = []
    try:
        for caption in captions:
            t = time.perf_counter()
            response = client.get("/api/search", params={"q": caption, "k": 20})
            latency.append(time.perf_counter() - t)
            if response.status_code != 200:
                raise SystemExit(f"search failed: {response.text}")
    finally:
        gc.callbacks.remove(watch)
    ms = np.asarray(latency) * 1e3
    print(f"{label:28s} full collections {len(full)} ({', '.join(f'{x * 1e3:.1f}' for x in full)} ms); "
          f"request p50 {np.median(ms):.2f} ms, p99 {np.quantile(ms, 0.99):.2f}, max {ms.max():.1f}")


def main() -> None:
    from d2s_search.cli.options import (
        bundle_for_index,
        index_location,
        make_backend,
        recorded_identity,
        require_index,
    )
    from d2s_search.serve import create_app

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", default="d2s-index")
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--queries", type=int, default=400)
    args = ap.parse_args()
    store = make_backend("local", args.index, None, None, 1)
    require_index(store)
    where = index_location(store)
    bundle = bundle_for_index(args.bundle, recorded_identity("local", args.index, None, None), where)
    app = create_app(bundle, store)
    app.state.service.start()
    print(f"objects the collector tracks after start-up: {len(gc.get_objects()):,}")
    for _ in range(3):
        t = time.perf_counter()
        gc.collect()
        print(f"a full collection: {(time.perf_counter() - t) * 1e3:.1f} ms")
    lines = (SHARED / "flickr8k-800" / "captions.txt").read_text(encoding="utf-8").splitlines()[1:]
    captions = [line.split(",", 1)[1].strip() for line in lines][: args.queries]
    searches(app, captions, "as start-up left it")
    gc.collect()
    gc.freeze()
    t = time.perf_counter()
    gc.collect()
    print(f"frozen: a full collection {(time.perf_counter() - t) * 1e3:.1f} ms")
    searches(app, captions, "frozen after start-up")
    app.state.service.stop()


if __name__ == "__main__":
    main()
