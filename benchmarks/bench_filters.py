"""What a filter costs on the local index: the sparse top 10 with a filter that keeps about
0.1%, 10% and 90% of the documents against the same search unfiltered, and the dense top 10
(exact over the pictures that pass) against the unfiltered dense plan, in one run.

    OMP_NUM_THREADS=1 python benchmarks/bench_filters.py [--docs 123000] [--queries 300] [--json OUT]

The index is ``bench_local_backend.py``'s synthetic one, copied once (its database; the search
cache hard-linked) to ``benchmarks/.cache/local-<docs>-metadata`` and given metadata: a date
taken spread evenly over ten years, one of ten cameras, a folder of 1,000. The filters: one
folder (0.1%), one year (10%), "camera != one of the ten" (90%). Each query runs every plan
back to back, in turn (so no plan always runs on warm caches); times are the whole search call
(filter mask, scoring, hits with ids and paths); "a new filter each query" shifts the year by
a second per query, so no mask is kept from the query before. The first 20 queries of each run
are compared with brute force over the documents that pass: recall@10, and how many returned
exactly its top 10 in order (the dense plan at this size walks graphs, filtered or not).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _common
import numpy as np

_common.use_repository()
os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench_local_backend import DIM, TERMS  # noqa: E402
from synthetic import dense_vectors, sample_vectors, zipf_probabilities  # noqa: E402

from d2s_search.backends.local import LocalBackend  # noqa: E402
from d2s_search.filters import Condition, SearchFilter  # noqa: E402
from d2s_search.metadata import Metadata, parse_time  # noqa: E402

YEAR = 365.25 * 86400
START = parse_time("2015-01-01")
CAMERAS = [f"camera {i}" for i in range(10)]


def metadata_index(cache: Path, docs: int) -> Path:
    """A copy of the synthetic index with metadata, made once."""
    source, target = cache / f"local-{docs}", cache / f"local-{docs}-metadata"
    if (target / "index.sqlite").is_file():
        return target
    if not (source / "index.sqlite").is_file():
        sys.exit(f"no index at {source}: run benchmarks/bench_local_backend.py --docs {docs} first")
    part = target.with_name(target.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for name in ("index.sqlite", "d2s-index.json"):
        shutil.copy2(source / name, part / name)
    subprocess.run(["cp", "-al", str(source / "cache"), str(part / "cache")], check=True)  # never written in place
    backend = LocalBackend(part)
    backend.open(None, create=False)
    ids = [doc_id for doc_id, _ in backend.document_paths()]
    rng = np.random.default_rng(5)
    metadata = {doc_id: Metadata(taken_at=float(START + (i / len(ids)) * 10 * YEAR),
                                 camera=CAMERAS[int(rng.integers(0, len(CAMERAS)))])
                for i, doc_id in enumerate(ids)}
    for start in range(0, len(ids), 20_000):
        backend.set_metadata({i: metadata[i] for i in ids[start:start + 20_000]})
    # one folder in a thousand: the 0.1% filter
    db = backend._connect(False)
    with db:
        db.execute("UPDATE docs SET path = '/rare/' || path WHERE seq % 1000 = 7")
    backend.close()
    # the paths changed under the cache: it is rebuilt by the first search (paths are cached strings)
    shutil.rmtree(part / "cache")
    backend = LocalBackend(part)
    backend.open(None, create=False)
    backend.prepare_search()
    backend.close()
    part.rename(target)
    return target


FILTERS = {
    "0.1% (a folder)": SearchFilter(folders=("/rare",)),
    "10% (a year)": SearchFilter(after=START + 3 * YEAR, before=START + 4 * YEAR),
    "90% (camera != one)": SearchFilter(where=(Condition("camera", "!=", CAMERAS[0]),)),
}
NEW_EACH_QUERY = "10%, a new filter each query"  # no mask kept from the query before


def filter_for(name: str | None, i: int) -> SearchFilter | None:
    if name == NEW_EACH_QUERY:  # the year shifted by i seconds: another filter, the same share
        return SearchFilter(after=START + 3 * YEAR + i, before=START + 4 * YEAR + i)
    return FILTERS.get(name) if name else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads="1 search thread")
    path = metadata_index(Path(args.cache), args.docs)
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    raw = sample_vectors(args.queries, 10, 40, zipf_probabilities(seed=0), seed=4242)
    queries = [{TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())} for ids, ws in raw]
    vectors = dense_vectors(args.queries, DIM, seed=77)
    state = backend._search_state()
    columns = backend._filter_columns(state)
    kept = {name: round(float(columns.mask(f).mean()), 4) for name, f in FILTERS.items()}

    plans = {"sparse": lambda q, v, f: backend.sparse_search(q, 10, explain=0, filters=f),
             "dense": lambda q, v, f: backend.dense_search(v, 10, explain=0, filters=f)}
    kept[NEW_EACH_QUERY] = kept["10% (a year)"]
    runs = [(plan, name) for plan in plans for name in [None, *FILTERS, NEW_EACH_QUERY]]
    for i in range(5):  # warm-up: the first searches open the shards
        for plan, name in runs:
            plans[plan](queries[i], vectors[i], filter_for(name, -1 - i))
    times: dict[tuple[str, str | None], list[float]] = {run: [] for run in runs}
    found = {run: [] for run in runs}  # per checked query: the share of the exact top 10 returned
    for i in range(args.queries):
        order = runs[i % len(runs):] + runs[:i % len(runs)]
        for plan, name in order:
            f = filter_for(name, i)
            start = time.perf_counter()
            hits = plans[plan](queries[i], vectors[i], f)
            times[(plan, name)].append(time.perf_counter() - start)
            if i < CHECKED:
                found[(plan, name)].append(check(backend, state, plan, queries[i], vectors[i], f, hits))
    backend.close()
    rows = []
    for plan, name in runs:
        p = _common.percentiles(times[(plan, name)])
        base = _common.percentiles(times[(plan, None)])
        shares = found[(plan, name)]
        rows.append({"plan": plan, "filter": name or "none", "kept": kept.get(name, 1.0), **p,
                     "vs_unfiltered_p50": round(p["p50_ms"] / base["p50_ms"], 2),
                     "recall_at_10": round(float(np.mean(shares)), 3),
                     "exact_queries": sum(s == 1.0 for s in shares), "checked": len(shares)})
    summary.update(docs=args.docs, queries=args.queries, rows=rows)
    _common.write_json(_common.finish(summary), args.json_out)
    print(render(summary))


CHECKED = 20


def check(backend, state, plan, query, vector, f, hits) -> float:
    """The share of the brute-force top 10 over the documents that pass found in the hits
    (1.0 also asks them in the same order)."""
    allowed = backend._filter_columns(state).mask(f) if f is not None else np.ones(state.size, dtype=bool)
    rows = np.flatnonzero(allowed)
    if plan == "sparse":
        scores = backend._rescore(state, rows, backend._query_columns(query))
        keep = scores > 0
        rows, scores = rows[keep], scores[keep]
    else:
        dense = np.concatenate([s.arrays["dense"] for s in state.shards])
        scores = dense[rows] @ vector
    top = rows[np.lexsort((rows, -scores))][:10]
    ids = [h.id for h in backend._hits(state, top, np.zeros(top.size, dtype=np.float32), {}, 0)]
    got = [h.id for h in hits]
    if got == ids:
        return 1.0
    return min(len(set(ids) & set(got)) / max(len(ids), 1), 0.999)


def render(summary: dict) -> str:
    rows = [(r["plan"], r["filter"], f"{r['kept']:.1%}", r["p50_ms"], r["p99_ms"], f"{r['vs_unfiltered_p50']:.2f}x",
             f"{r['recall_at_10']:.3f} ({r['exact_queries']}/{r['checked']} exact)") for r in summary["rows"]]
    return _common.table(("plan", "filter", "kept", "p50 ms", "p99 ms", "p50 / unfiltered",
                          "recall@10 against brute force"), rows) \
        + "\n\n" + _common.caption(summary)


if __name__ == "__main__":
    main()
