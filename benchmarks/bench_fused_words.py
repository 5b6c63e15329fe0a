"""A search's words collapsed in the pass that reads each hit's row (``_query.c``, the local
index told how many words are shown) against the plans' collapse of every matched term
(``search.collapse_matches``, ``_words.c``), and the same search without words (the reference).

    python benchmarks/bench_fused_words.py [--queries 100] [--synthetic local-123000]
                                           [--shaped real-shaped-1000000] [--json OUT]

On the synthetic index bench_local_backend.py builds (its terms are in no group of forms:
five words a hit), on the real-shaped index it builds with ``--collection real-shaped`` when
it is there, and on the quick start's 800 photos, both with caption queries (every one holds
two forms of some word: each hit's words are read from all the query's terms, then collapsed).
The three take turns query by query (the first 5 queries not timed); both ways must give the
same hits, scores, raw terms and words. One thread.
"""

from __future__ import annotations

import argparse
import csv
import time

import _common  # noqa: E402

_common.use_repository()
import bench_local_backend as blb  # noqa: E402
import shaped_collection  # noqa: E402

from d2s_search import inflections  # noqa: E402
from d2s_search.backends.local import LocalBackend, kernels  # noqa: E402
from d2s_search.search import SearchOptions, encode_text_query, run_query  # noqa: E402

WAYS = ("in the row pass", "plans' collapse", "no words (reference)")


def taking_turns(backend: LocalBackend, queries: list, options: SearchOptions, settle: int = 5) -> dict:
    """p50 and p99 of each way, the ways taking turns query by query (which goes first rotating):
    on a host whose page cache and neighbours drift, blocks of queries measured the drift."""
    plain = SearchOptions(mode=options.mode, k=options.k, explain=0)
    times: dict[str, list[float]] = {name: [] for name in WAYS}
    for i, q in enumerate(queries):
        shown = {}
        for name in WAYS[i % 3:] + WAYS[:i % 3]:
            LocalBackend.collapses_words = name == WAYS[0]
            t0 = time.perf_counter()
            found = run_query(backend, q, plain if name == WAYS[2] else options).hits
            if i >= settle:
                times[name].append(time.perf_counter() - t0)
            if name != WAYS[2]:
                shown[name] = [(h.id, h.score, h.matched, repr(h.words), h.parts) for h in found]
            del found  # dropped at once: hits kept to the end would make the collector's passes grow
        assert shown[WAYS[0]] == shown[WAYS[1]], "both ways must give the same hits, scores and words"
    LocalBackend.collapses_words = True
    return {name: _common.percentiles(t) for name, t in times.items()}


def on_index(path, queries: list) -> dict:
    """The three ways on a built index: sparse k=1000, hybrid k=10 and k=1000."""
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    try:
        return {f"{path.name} {mode} @{k}": taking_turns(backend, queries, SearchOptions(mode=mode, k=k, explain=5))
                for mode, k in (("sparse", 1000), ("hybrid", 10), ("hybrid", 1000))}
    finally:
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--synthetic", default="local-123000")
    parser.add_argument("--shaped", default="real-shaped-1000000")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    if inflections._c_words is None or kernels._c_query is None:
        raise SystemExit("_words.c or _query.c is not built here: nothing to compare")
    summary = _common.provenance(threads="1 search thread")
    results = {}
    path = _common.CACHE / args.synthetic
    if not (path / "index.sqlite").is_file():
        raise SystemExit(f"no index at {path}: build it with bench_local_backend.py")
    results.update(on_index(path, blb.benchmark_queries(args.queries)))
    path = _common.CACHE / args.shaped
    if (path / "index.sqlite").is_file():
        results.update(on_index(path, shaped_collection.queries(args.queries)))
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
