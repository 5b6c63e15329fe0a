"""How much of the dense columns block-max skipping could leave unread, with an oracle.

    OMP_NUM_THREADS=1 python benchmarks/bench_block_max_oracle.py [--queries 100]

On the cached synthetic 123k index of ``bench_local_backend.py`` (built there first), for
each query: the exact scores of every row split into the sparse terms' part and the dense
columns' part (terms in at least half of a shard's rows, :mod:`d2s_search.backends.local.cache`),
the true 10th best score as the threshold (an oracle: a real search only learns it as it goes),
and for blocks of B rows an upper bound = the block's highest sparse part + the sum over the
query's dense terms of weight x the column's maximum in the block. A block whose bound is below
the threshold need not read its dense columns. Prints the share of blocks that must still be
read (median, mean, 90th percentile over the queries): an upper bound on what skipping saves.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_local_backend import TERMS, build_index  # noqa: E402
from benchmarks.synthetic import sample_vectors, zipf_probabilities  # noqa: E402
from d2s_search.backends.local import kernels  # noqa: E402

BLOCKS = (64, 256, 1024, 4096)


def parts_of(shard, cols: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(sparse part of every row's score, each dense term's column times its weight)."""
    a = shard.arrays
    dense_terms, dense_columns = a["dense_terms"], a["dense_columns"]
    indptr, indices, data = a["csc_indptr"], a["csc_indices"], a["csc_data"]
    sparse = np.zeros(shard.rows, np.float32)
    dense = []
    for col, weight in zip(cols.tolist(), weights.tolist()):
        slot = np.flatnonzero(dense_terms == col)
        if slot.size:
            dense.append(kernels.decode_weights(dense_columns[slot[0]]) * np.float32(weight))
        elif col < indptr.size - 1:
            span = slice(indptr[col], indptr[col + 1])
            np.add.at(sparse, indices[span].astype(np.int64), kernels.decode_weights(data[span]) * np.float32(weight))
    return sparse, dense


def block_max(values: np.ndarray, rows: int) -> np.ndarray:
    blocks = -(-values.size // rows)
    return np.pad(values, (0, blocks * rows - values.size)).reshape(blocks, rows).max(axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=100)
    args = ap.parse_args()
    backend, _ = build_index(ROOT / "benchmarks" / ".cache" / "local-123000", 123000)
    state = backend._search_state()
    raw = sample_vectors(args.queries, 10, 40, zipf_probabilities(seed=0), seed=12345)
    shares = {rows: [] for rows in BLOCKS}
    dense_terms = []
    for ids, ws in raw:
        cols, weights = backend._query_columns({TERMS[t]: float(w) for t, w in zip(ids.tolist(), ws.tolist())})
        parts = [parts_of(shard, cols, weights) for shard in state.shards]
        dense_terms.append(len(parts[0][1]))
        totals = np.concatenate([sparse + (sum(dense) if dense else 0) for sparse, dense in parts])
        threshold = np.sort(totals)[-10]
        for rows in BLOCKS:
            needed = total = 0
            for sparse, dense in parts:
                bound = block_max(sparse, rows)
                for column in dense:
                    bound = bound + block_max(column, rows)
                needed += int((bound >= threshold).sum())
                total += bound.size
            shares[rows].append(needed / total)
    print(f"dense terms per query (median): {np.median(dense_terms):.0f}")
    for rows, values in shares.items():
        print(f"blocks of {rows:5d} rows that must read their dense columns: median {np.median(values):.3f}, "
              f"mean {np.mean(values):.3f}, p90 {np.quantile(values, 0.9):.3f}")


if __name__ == "__main__":
    main()
