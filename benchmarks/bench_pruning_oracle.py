"""What dynamic pruning could skip in an exact sparse top k, at best: an oracle in numpy that
knows each query's final k-th score before it starts.

    python benchmarks/bench_pruning_oracle.py [--collection real-shaped|synthetic] [--docs 123000]
                                              [--k 10] [--queries 100] [--json OUT]

Per shard of 65,536 documents (the local index's), each query term's bound is its query weight
times its largest weight in the shard. MaxScore: the terms whose bounds, smallest first, add up
below the k-th score are non-essential; the postings of the others must all be read (the
"essential share" of the query's postings), and a document in them stays a candidate while
its essential partial score plus every non-essential bound reaches the k-th score (the
non-essential lists are then probed for it). Block-max: blocks of 64 documents whose terms'
block maxima add up below the k-th score are skipped; the share of postings in the rest.
Real-shaped: the shipped head's 800 photos tiled (``sparse_shaped.py``) and the flickr8k-800
captions through the text side; synthetic: ``bench_local_backend.py``'s generator and queries.
"""

from __future__ import annotations

import argparse

import _common  # noqa: E402
import numpy as np
import scipy.sparse as sp

_common.use_repository()
import bench_local_backend as blb  # noqa: E402
import sparse_shaped  # noqa: E402
import synthetic  # noqa: E402

SHARD = 65536
BLOCK = 64


def real_shaped(n: int, queries: int) -> tuple[sp.csc_matrix, list[dict[int, float]]]:
    vocab, sources = sparse_shaped.read_index(sparse_shaped.PHOTOS / "index")
    docs = sparse_shaped.tile(sources, n)
    column = {t: i for i, t in enumerate(vocab)}
    found = [{column[t]: w for t, w in q.items() if t in column} for q in sparse_shaped.queries(queries)]
    return _matrix(docs, len(vocab)), found


def synthetic_collection(n: int, queries: int) -> tuple[sp.csc_matrix, list[dict[int, float]]]:
    probs = synthetic.zipf_probabilities(seed=0)
    docs = []
    for start in range(0, n, 5000):  # as bench_local_backend.py draws them
        docs += synthetic.sample_vectors(min(5000, n - start), 20, 200, probs, seed=1 + start)
    found = [{int(t[1:]): w for t, w in q.full.items()} for q in blb.benchmark_queries(queries)]
    return _matrix(docs, synthetic.VOCAB), found


def _matrix(docs: list, vocab: int) -> sp.csc_matrix:
    indptr = np.cumsum([0] + [t.size for t, _ in docs])
    data = np.concatenate([w for _, w in docs]).astype(np.float32)
    return sp.csr_matrix((data, np.concatenate([t for t, _ in docs]), indptr), shape=(len(docs), vocab)).tocsc()


def oracle(matrix: sp.csc_matrix, query: dict[int, float], k: int) -> dict:
    terms = np.array(sorted(query))
    weights = np.array([query[t] for t in terms], dtype=np.float32)
    postings = matrix[:, terms]
    kth = np.sort(postings @ weights)[-k]
    essential = candidates = live = 0
    for start in range(0, matrix.shape[0], SHARD):
        shard = postings[start : start + SHARD].tocsc()
        bounds = shard.max(axis=0).toarray().ravel() * weights
        order = np.argsort(bounds)
        below = np.cumsum(bounds[order]) < kth
        kept = order[~below]
        essential += int(np.diff(shard.indptr)[kept].sum())
        partial = shard[:, kept] @ weights[kept]
        touched = np.diff(shard[:, kept].tocsr().indptr) > 0
        candidates += int(np.sum(touched & (partial + bounds[order][below].sum() >= kth)))
        rows = shard.tocsr()
        owner = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr)) // BLOCK
        block_max = np.zeros((owner.max(initial=0) + 1, terms.size), dtype=np.float32)
        np.maximum.at(block_max, (owner, rows.indices), rows.data * weights[rows.indices])
        live += int(np.sum((block_max.sum(axis=1) >= kth)[owner]))
    return {"essential_share": essential / postings.nnz, "candidates": candidates, "block_max_live_share": live / postings.nnz}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", choices=("real-shaped", "synthetic"), default="real-shaped")
    parser.add_argument("--docs", type=int, default=123000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance()
    make = real_shaped if args.collection == "real-shaped" else synthetic_collection
    matrix, queries = make(args.docs, args.queries)
    found = [oracle(matrix, q, args.k) for q in queries]
    summary.update({
        "collection": args.collection, "docs": args.docs, "postings": int(matrix.nnz), "k": args.k,
        "queries": len(queries), "mean_query_terms": round(float(np.mean([len(q) for q in queries])), 1),
        **{f"{name}_p50": round(float(np.median([f[name] for f in found])), 3) for name in found[0]},
        **{f"{name}_mean": round(float(np.mean([f[name] for f in found])), 3) for name in found[0]},
    })
    _common.write_json(_common.finish(summary), args.json_out)


if __name__ == "__main__":
    main()
