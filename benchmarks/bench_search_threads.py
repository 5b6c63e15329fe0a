"""Where searching shards in groups at once pays: the sparse top-k and the dense top-k over the
first N shards of the cached synthetic index, one search thread against several, alternated
query by query in one process.

    OMP_NUM_THREADS=1 python benchmarks/bench_search_threads.py [--docs 1000000] [--threads 2]

The index is the one ``bench_local_backend.py`` builds (and caches under benchmarks/.cache/);
a 1M index has 16 shards of 65,536 documents. Times the sparse top 10 through ``_query.c``
(``LocalBackend._query_top``: one call per group of shards) and through the ctypes kernel shard by
shard (``_sparse_top``, the path without the build), and ``_dense_top`` (k=100, the candidates
a hybrid query asks) on sub-collections of 2-16 shards (dense only where no graph spans shards
past them: a 1M index's full shards share one graph, so its dense side is two parts), with
grouping forced on (``parallel_from`` 1) so the crossover shows. The thresholds
``SPARSE_PARALLEL_FROM`` / ``DENSE_PARALLEL_FROM`` in ``backends/local/backend.py`` come from
this table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
import _common  # noqa: E402

_common.use_repository()

from bench_local_backend import DIM, TERMS  # noqa: E402
from synthetic import dense_vectors, sample_vectors, zipf_probabilities  # noqa: E402

from d2s_search.backends.local import LocalBackend  # noqa: E402
from d2s_search.backends.local import backend as backend_module  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--cache", default=str(Path(__file__).parent / ".cache"))
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shards", default="2,3,4,6,8,16")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads=f"1 against {args.threads} search threads")
    path = Path(args.cache) / f"local-{args.docs}"
    if not (path / "index.sqlite").is_file():
        sys.exit(f"no index at {path}: run benchmarks/bench_local_backend.py --docs {args.docs} first")

    raw = sample_vectors(args.queries, 10, 40, zipf_probabilities(seed=0), seed=12345)
    queries = [{TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())} for ids, ws in raw]
    rng = np.random.default_rng(99)
    vectors = [dense_vectors(1, DIM, seed=int(rng.integers(1 << 30)))[0] for _ in queries]
    # grouping forced on from 2 shards: the table is what the thresholds are chosen from
    backend_module.SPARSE_PARALLEL_FROM = backend_module.DENSE_PARALLEL_FROM = 1
    backends = {}
    for threads in (1, args.threads):
        b = LocalBackend(path, threads=threads)
        b.open(None, create=False)
        backends[threads] = b
    full = backends[1]._search_state()
    columns = [backends[1]._query_columns(q) for q in queries]
    rows = []
    for n in [int(x) for x in args.shards.split(",") if int(x) <= len(full.shards)]:
        part = dataclasses.replace(full, shards=full.shards[:n])
        row = {"shards": n}
        plans = [("sparse k=10", lambda b, i, part=part: b._query_top(part, queries[i], 10)),
                 ("sparse k=10, ctypes", lambda b, i, part=part: b._sparse_top(part, columns[i], 10))]
        # a graph spanning shards past the first n has no sub-collection to search
        if all(first + span <= n for first, span in part.dense_units()):
            plans.append(("dense k=100", lambda b, i, part=part: b._dense_top(part, vectors[i], 100)))
        for name, run in plans:
            for b in backends.values():
                for i in range(5):
                    run(b, i)
            times: dict[int, list[float]] = {t: [] for t in backends}
            for i in range(len(queries)):
                for threads, b in backends.items():  # alternated query by query
                    t0 = time.perf_counter()
                    run(b, i)
                    times[threads].append(time.perf_counter() - t0)
            one, many = (float(np.median(times[t])) * 1000 for t in backends)
            row[name] = {"1 thread ms": round(one, 3), f"{args.threads} threads ms": round(many, 3),
                         "speed-up": round(one / many, 2)}
        rows.append(row)
        print(json.dumps(row))
    _common.write_json(_common.finish({**summary, "rows": rows}), args.json_out)


if __name__ == "__main__":
    main()
