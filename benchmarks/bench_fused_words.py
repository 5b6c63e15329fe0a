"""A search's words and a hybrid's fusion: the words collapsed in C (``_words.c``) and the fused
runs' rows joined in one argsort (``kernels.union_positions``), against the Python collapse
(``inflections.MatchWords.__call__``) and ``np.unique`` plus a ``np.searchsorted`` per run.

    python benchmarks/bench_fused_words.py [--queries 100] [--synthetic local-123000] [--json OUT]

On the synthetic index bench_local_backend.py builds (its terms are in no group of forms:
five words a hit) and on the quick start's 800 photos with caption queries (every one holds two
forms of some word: each hit explained with all the query's terms, then collapsed). Blocks of 20
queries back to back (the first 3 of each not timed), the two ways and the search without words
(the reference) taking turns block by block; both ways must give the same hits, scores and
words. One thread.
"""

from __future__ import annotations

import argparse
import csv
import time

import _common  # noqa: E402
import numpy as np

_common.use_repository()
import bench_local_backend as blb  # noqa: E402

from d2s_search import inflections  # noqa: E402
from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402
from d2s_search.search import SearchOptions, encode_text_query, run_query  # noqa: E402

C_WORDS, UNION = inflections._c_words, kernels.union_positions


def unique_and_searchsorted(parts: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    rows = np.unique(np.concatenate(parts))
    return rows, [np.searchsorted(rows, p) for p in parts]


def before(on: bool) -> None:
    """The Python collapse and np.unique's union (on), or this install's ways back (off)."""
    inflections._c_words = None if on else C_WORDS
    kernels.union_positions = unique_and_searchsorted if on else UNION


def taking_turns(backend: LocalBackend, queries: list, options: SearchOptions, block: int = 20,
                 settle: int = 3) -> dict:
    plain = SearchOptions(mode=options.mode, k=options.k, explain=0)
    times: dict[str, list[float]] = {"now": [], "before": [], "no words (reference)": []}
    for b, start in enumerate(range(0, len(queries), block)):
        chunk = queries[start : start + block]
        # compared block by block and dropped: a run's hits kept to the end would make the
        # garbage collector's full passes, and so the times, grow as the run goes on
        shown: dict[str, list] = {"now": [], "before": []}
        for name in tuple(times)[:: 1 if b % 2 else -1]:
            before(name == "before")
            for i, q in enumerate(chunk):
                t0 = time.perf_counter()
                found = run_query(backend, q, plain if name not in shown else options).hits
                if i >= settle:
                    times[name].append(time.perf_counter() - t0)
                if name in shown:
                    shown[name].append([(h.id, h.score, h.matched, repr(h.words), h.parts) for h in found])
                del found
        assert shown["now"] == shown["before"], "both ways must give the same hits, scores and words"
    before(False)
    return {name: _common.percentiles(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--synthetic", default="local-123000")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    if C_WORDS is None:
        raise SystemExit("_words.c is not built here: nothing to compare")
    summary = _common.provenance(threads="1 search thread")
    results = {}
    path = _common.CACHE / args.synthetic
    if not (path / "index.sqlite").is_file():
        raise SystemExit(f"no index at {path}: build it with bench_local_backend.py")
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    queries = blb.benchmark_queries(args.queries)
    for mode, k in (("sparse", 1000), ("hybrid", 10), ("hybrid", 1000)):
        results[f"{args.synthetic} {mode} @{k}"] = taking_turns(backend, queries, SearchOptions(mode=mode, k=k, explain=5))
    backend.close()
    encoder, backend = _common.open_photo_index()
    with open(_common.DATA / "flickr8k-800" / "captions.txt", newline="") as f:
        captions = [r["caption"] for r in csv.DictReader(f)][::5][: args.queries]
    queries = [encode_text_query(encoder, c) for c in captions]
    for mode, k in (("sparse", 10), ("sparse", 100), ("hybrid", 100)):
        results[f"photos-800 {mode} @{k}"] = taking_turns(backend, queries, SearchOptions(mode=mode, k=k, explain=5))
    backend.close()
    summary.update({"queries": args.queries, "latency": results})
    _common.write_json(_common.finish(summary), args.json_out)


if __name__ == "__main__":
    main()
