"""Run the benchmark suite and write the tables docs/benchmarks.md shows.

    python benchmarks/run.py                 # the quick set: about 10 minutes on a laptop
    python benchmarks/run.py --full          # everything that runs on one machine: hours
    python benchmarks/run.py --only latency-123k,cli-query
    python benchmarks/run.py --list

Each entry runs one script of this folder in its own process (so their timings do not share
a heap or warm caches) with ``--json benchmarks/results/<name>.json``, then renders that
summary with the script's ``render()`` into ``benchmarks/results/<name>.md``. All tables, in
suite order, also go to ``benchmarks/results/summary.md`` and to stdout. The slow parts (a
search index, a bundle, the photo index, caption vectors) are built once and kept under
``benchmarks/.cache/``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import _common


@dataclass(frozen=True)
class Entry:
    name: str
    script: str
    args: tuple[str, ...]
    quick: bool
    what: str


SUITE = (
    Entry("latency-123k", "bench_local_backend.py", ("--docs", "123000", "--queries", "300"), True,
          "search latency at 123k documents, every plan, against brute force and the reference engines"),
    Entry("encoders", "bench_encoders.py", ("--model", "offline-mini", "--ingest", "200"), True,
          "encoder throughput, torch against ONNX Runtime, and ingest end to end"),
    Entry("cli-query", "bench_cli_query.py", ("--rounds", "10"), True,
          "`d2s-search query` as a whole process, alone and answered by a running serve"),
    Entry("bundle-verify", "bench_bundle_verify.py", (), True, "what checking a bundle costs at start-up"),
    Entry("filters", "bench_filters.py", ("--docs", "123000", "--queries", "300"), False,
          "the sparse and dense top 10 with filters keeping 0.1%, 10% and 90% against unfiltered, 123k documents"),
    Entry("latency-sparse-shaped", "bench_sparse_shaped.py", ("--docs", "123000", "--queries", "200"), False,
          "sparse plans and PISA / Seismic on the real-shaped sparse 123k collection"),
    Entry("latency-real-shaped-123k", "bench_local_backend.py",
          ("--collection", "real-shaped", "--docs", "123000", "--queries", "300"), False,
          "every plan at 123k on the bundle's output tiled on both sides, against brute force and the reference engines"),
    Entry("latency-real-shaped-1m", "bench_local_backend.py",
          ("--collection", "real-shaped", "--docs", "1000000", "--queries", "100", "--peers", ""), False,
          "every plan at 1M on the real-shaped collection, one search thread"),
    Entry("latency-1m", "bench_local_backend.py", ("--docs", "1000000", "--queries", "100", "--k", "10"), False,
          "search latency at 1M documents, one search thread"),
    Entry("latency-1m-2-threads", "bench_local_backend.py",
          ("--docs", "1000000", "--queries", "100", "--k", "10", "--threads", "2", "--peers", ""), False,
          "search latency at 1M documents, two search threads"),
    Entry("search-threads", "bench_search_threads.py", ("--docs", "1000000", "--threads", "2"), False,
          "where searching shards in groups on several threads pays"),
    Entry("dense-recall", "bench_dense_recall.py", ("--synthetic", "123000", "--queries", "200"), False,
          "recall of the HNSW graphs against exact dense search"),
    Entry("words-shown", "bench_words_shown.py", ("--queries", "200"), False,
          "the words shown: inflections collapsed, a picture's words by weight x IDF, and what it costs"),
    Entry("graph-params", "bench_graph_params.py", ("--split", "test", "--builds", "32x80,32x40", "--widths",
                                                    "16,32,64,128", "--k1000"), False,
          "the graphs' parameters on a real-shaped 123k collection: recall@10 and @1000 and p50 per width"),
    Entry("hybrid-pool", "bench_hybrid_pool.py", ("--queries", "100"), False,
          "hybrid candidates per side: fused recall against every document's fusion and p50, 123k documents"),
    Entry("hybrid-pool-photos", "bench_hybrid_pool.py", ("--photos", "--k", "10,50", "--queries", "200"), False,
          "hybrid candidates per side on the 800 real photos with held-out captions"),
    Entry("serve", "bench_serve.py", ("--top-k", "64"), False, "the search page: request to rendered results"),
    Entry("ray-ingest", "bench_ray_ingest.py", ("--rounds", "3"), False,
          "ingest --engine ray on this machine against one process (1 and 2 workers)"),
    Entry("opensearch", "bench_opensearch.py", ("--docs", "10000", "--queries", "100"), False,
          "the OpenSearch client path against the test server"),
    Entry("elasticsearch", "bench_elasticsearch.py", ("--docs", "3000", "--queries", "60"), False,
          "the Elasticsearch client path next to the OpenSearch one"),
    Entry("quality", "bench_quality.py", ("--seeds", "0,1"), False,
          "the default training recipe at 1,000 and 5,000 documents, validation against test, and its words"),
    Entry("expansion-modes", "bench_d2s_minilm.py", ("--epochs", "6", "--time-batch", "0"), False,
          "the paper's expansion modes at a short schedule"),
)


def run(entry: Entry, results: Path) -> str:
    here = Path(__file__).parent
    out = results / f"{entry.name}.json"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.perf_counter()
    print(f"== {entry.name}: {entry.what}", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, str(here / entry.script), *entry.args, "--json", str(out)], env=env,
                          stdout=subprocess.DEVNULL, check=False)
    minutes = (time.perf_counter() - t0) / 60
    if done.returncode != 0:
        return f"## {entry.name}\n\nfailed (exit {done.returncode}) after {minutes:.1f} min\n"
    module = importlib.import_module(Path(entry.script).stem)
    render = getattr(module, "render", None)
    body = render(json.loads(out.read_text())) if render else f"results in `{out.relative_to(_common.ROOT)}`"
    markdown = f"## {entry.name}\n\n{entry.what} ({minutes:.1f} min)\n\n{body}\n"
    (results / f"{entry.name}.md").write_text(markdown)
    return markdown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="every entry, not only the quick set")
    parser.add_argument("--only", help="comma-separated entry names")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    parser.add_argument("--results", default=str(_common.RESULTS))
    args = parser.parse_args()
    if args.list:
        for e in SUITE:
            print(f"{e.name:22} {'quick' if e.quick else 'full ':5}  {e.script:26} {e.what}")
        return 0
    names = set(args.only.split(",")) if args.only else None
    unknown = (names or set()) - {e.name for e in SUITE}
    if unknown:
        parser.error(f"unknown entries: {', '.join(sorted(unknown))} (see --list)")
    chosen = [e for e in SUITE if (e.name in names if names else (args.full or e.quick))]
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    sections = [run(e, results) for e in chosen]
    summary = "\n".join(sections)
    (results / "summary.md").write_text(summary)
    print(summary)
    return 0 if all("failed (exit" not in s for s in sections) else 1


if __name__ == "__main__":
    sys.exit(main())
