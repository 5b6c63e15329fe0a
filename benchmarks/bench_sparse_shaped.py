"""Sparse search latency on the real-shaped sparse collection (``sparse_shaped.py``): the local
index's exact and two-phase plans and the reference engines (PISA, Seismic) against brute force
measured in the same run, at k=10 and k=1000, one thread; recall against exact at the same k.

    python benchmarks/bench_sparse_shaped.py [--docs 123000] [--queries 200] [--json OUT]

Timed as ``bench_local_backend.py`` times them (cold: each plan right after a brute-force pass;
back to back: blocks of 50 queries). Also prints the collection's shape next to its source's
and the synthetic 123k collection's (``--synthetic`` an index built by bench_local_backend.py).
The index is built once through the real backend and cached under benchmarks/.cache/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _common
import bench_local_backend as blb
import numpy as np
import sparse_shaped

from d2s_search.backends.base import Document, IndexIdentity
from d2s_search.backends.local import LocalBackend
from d2s_search.search import QueryVectors, SearchOptions, run_query

DENSE_DIM = 16


def build_index(path: Path, n: int, seed: int) -> tuple[LocalBackend, list[sparse_shaped.Sparse], list[str]]:
    vocab, sources = sparse_shaped.read_index(sparse_shaped.PHOTOS / "index")
    docs = sparse_shaped.tile(sources, n, seed)
    # The sparse plans never read the dense side: small random vectors keep its graph cheap to
    # build (the photos' own vectors, a few hundred repeated a thousand times over, are not).
    dense = np.random.default_rng(seed).standard_normal((n, DENSE_DIM), dtype=np.float32)
    identity = IndexIdentity(fingerprint=f"sparse-shaped-{n}-{seed}-d{DENSE_DIM}", dense_dim=DENSE_DIM,
                             model="sparse-shaped")
    backend = LocalBackend(path, threads=1)
    if backend.exists():
        backend.open(identity, create=False)
        if backend.count() == n:
            return backend, docs, vocab
        backend.drop()
        backend = LocalBackend(path, threads=1)
    backend.open(identity)
    t0 = time.perf_counter()
    for start in range(0, n, 5000):
        backend.upsert([
            Document(id=f"{i:064x}", path=f"/sparse-shaped/{i}.jpg", size_bytes=0, width=0, height=0,
                     sparse={vocab[t]: float(w) for t, w in zip(*(a.tolist() for a in docs[i]))}, dense=dense[i])
            for i in range(start, min(start + 5000, n))])
        print(f"\rbuilding: {min(start + 5000, n)}/{n} docs ({time.perf_counter() - t0:.0f}s)", end="", file=sys.stderr)
    print(file=sys.stderr)
    backend._search_state()
    return backend, docs, vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=123_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", default="10,1000")
    parser.add_argument("--peers", default="pisa,seismic")
    parser.add_argument("--synthetic", default=str(_common.CACHE / "local-123000"),
                        help="the synthetic index whose shape is printed beside (skipped when absent)")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    summary = _common.provenance(threads="1 search thread")

    path = _common.CACHE / f"sparse-shaped-{args.docs}"
    backend, docs, _vocab = build_index(path, args.docs, args.seed)
    _vocab, sources = sparse_shaped.read_index(sparse_shaped.PHOTOS / "index")
    shapes = {"photos (source)": sparse_shaped.shape(sources), f"real-shaped {args.docs:,}": sparse_shaped.shape(docs)}
    if (Path(args.synthetic) / "index.sqlite").is_file():
        shapes["synthetic " + Path(args.synthetic).name] = sparse_shaped.shape(sparse_shaped.read_index(Path(args.synthetic))[1])
    del docs
    backend.close()
    backend = LocalBackend(path, threads=1)
    backend.open(None, create=False)
    state = backend._search_state()

    queries = [QueryVectors(full=q, own=dict(sorted(q.items(), key=lambda kv: -kv[1])[:8]), dense=np.zeros(1, np.float32))
               for q in sparse_shaped.queries(args.queries)]
    brute_sparse, _ = blb.brute_force(backend, state)
    ids = [s.string("ids", i) for s in state.shards for i in range(s.rows)]
    peer_list = blb.build_peers([p for p in args.peers.split(",") if p], state, backend._terms, ids,
                                np.zeros((1, 1), np.float32), path.parent)

    cold, warm, recall = {}, {}, {}
    checked = queries[:100]
    for k in ks:
        plans = {"sparse": lambda q, k=k: run_query(backend, q, SearchOptions(mode="sparse", k=k, explain=0)),
                 "two-phase": lambda q, k=k: run_query(backend, q, SearchOptions(mode="two-phase", k=k, explain=0))}
        for peer in peer_list:
            plans[peer.name] = lambda q, k=k, peer=peer: peer.search(q.full, q.dense, k)
        references = {"brute-force sparse": lambda q, k=k: brute_sparse(q, k)}
        for name, value in blb.interleaved(plans, references, queries).items():
            cold[f"{name} @{k}"] = value
        for name, value in blb.steady({**plans, **references}, queries).items():
            warm[f"{name} @{k}"] = value
        exact = [{ids[r] for r in brute_sparse(q, k)} for q in checked]
        found = {"sparse": lambda q, k=k: [h.id for h in backend.sparse_search(q.full, k, explain=0)],
                 "two-phase": lambda q, k=k: [h.id for h in run_query(backend, q, SearchOptions(mode="two-phase", k=k)).hits]}
        for peer in peer_list:
            found[peer.name] = lambda q, k=k, peer=peer: peer.search(q.full, q.dense, k)
        for name, search in found.items():
            recall[f"{name} @{k}"] = round(float(np.mean([len(set(search(q)) & e) / k for q, e in zip(checked, exact)])), 3)
    summary.update({
        "docs": args.docs, "queries": len(queries), "seed": args.seed,
        "mean_query_terms": round(float(np.mean([len(q.full) for q in queries])), 1),
        "shapes": {name: vars(s) for name, s in shapes.items()},
        "peers": {p.name: {"settings": p.settings, "build_seconds": round(p.build_seconds, 1),
                           "index_mb": round(p.index_bytes / 2**20)} for p in peer_list},
        "recall_vs_exact": recall, "latency": cold, "latency_steady": warm,
    })
    for peer in peer_list:
        peer.close()
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    """One row a plan, k=10 and k=1000 side by side (p50 ms, its speed-up over brute force, recall
    against exact at the same k), then the collections' shapes."""
    cold, warm, recall = summary["latency"], summary["latency_steady"], summary["recall_vs_exact"]
    ks = sorted({int(key.rsplit("@", 1)[1]) for key in cold})
    rows = []
    for name in ("sparse", "two-phase", *summary["peers"], "brute-force sparse"):
        row = [f"*{name} (reference)*" if name.startswith("brute") else name]
        for k in ks:
            ref_c, ref_w = cold[f"brute-force sparse @{k}"]["p50_ms"], warm[f"brute-force sparse @{k}"]["p50_ms"]
            c, w = cold[f"{name} @{k}"]["p50_ms"], warm[f"{name} @{k}"]["p50_ms"]
            row += [f"{c:.2f} ({ref_c / c:.1f}x)", f"{w:.2f} ({ref_w / w:.1f}x)", f"{recall.get(f'{name} @{k}', 1.0):.3f}"]
        rows.append(row)
    headers = ["plan"] + [f"k={k} {h}" for k in ks for h in ("cold p50 ms (vs brute force)", "back to back", "recall")]
    shapes = [[name, *sparse_shaped.Shape(**{key: tuple(v) if isinstance(v, list) else v for key, v in s.items()}).row()]
              for name, s in summary["shapes"].items()]
    peers = "; ".join(f"{n}: {p['settings']}, built in {p['build_seconds']} s, {p['index_mb']} MB"
                      for n, p in summary["peers"].items())
    return "\n\n".join([
        _common.table(headers, rows), _common.table(["collection", *sparse_shaped.SHAPE_HEADERS], shapes),
        f"{summary['queries']} queries of {summary['mean_query_terms']} terms (flickr8k-800 captions through the "
        f"bundle's text side); {peers}. " + _common.caption(summary)])


if __name__ == "__main__":
    main()
