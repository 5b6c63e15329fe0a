"""The hybrid plan's candidates per side: with the default pool the fused top-k is that of
fusion over every document on a collection whose two sides agree as real ones do (documents
and queries drawn around shared topics); a pool of k is not."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.base import Document
from d2s_search.backends.local import LocalBackend
from d2s_search.errors import QueryError
from d2s_search.search import QueryVectors, SearchOptions, fuse_minmax, fuse_rrf, run_query
from tests.helpers import brute_force_dense, brute_force_sparse
from tests.reliability.local_index_fixtures import DIM, IDENTITY, VOCAB
from tests.reliability.test_local_index_exactness import as_hits


def topical(n: int, topics: int, seed: int) -> tuple[list[Document], list[QueryVectors]]:
    """Documents around ``topics`` centres, each with 3-6 of its topic's 6 words (and 0-2 weak
    others); queries: a topic's centre moved a little and 2-4 of its words."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(topics, DIM))
    words = [rng.choice(len(VOCAB), 6, replace=False) for _ in range(topics)]
    docs = []
    for i in range(n):
        t = i % topics
        sparse = {VOCAB[w]: float(rng.uniform(0.05, 0.5)) for w in rng.choice(len(VOCAB), int(rng.integers(0, 3)),
                                                                               replace=False)}
        sparse.update({VOCAB[w]: float(rng.uniform(0.3, 2.0)) for w in rng.choice(words[t], int(rng.integers(3, 7)),
                                                                                   replace=False)})
        docs.append(Document(id=f"{i:064x}", path=f"/topics/{i}.jpg", size_bytes=1, width=1, height=1, sparse=sparse,
                             dense=(centres[t] + 0.6 * rng.normal(size=DIM)).astype(np.float32)))
    queries = []
    for _ in range(40):
        t = int(rng.integers(topics))
        full = {VOCAB[w]: float(rng.uniform(0.3, 1.5)) for w in rng.choice(words[t], int(rng.integers(2, 5)),
                                                                             replace=False)}
        queries.append(QueryVectors(full=full, own=full, dense=(centres[t] + 0.5 * rng.normal(size=DIM)).astype(np.float32)))
    return docs, queries


def every_document_fusion(docs, q: QueryVectors, fusion: str, k: int):
    runs = {"sparse": as_hits(brute_force_sparse(docs, q.full), len(docs)),
            "dense": as_hits(brute_force_dense(docs, q.dense), len(docs))}
    return fuse_rrf(runs, k) if fusion == "rrf" else fuse_minmax(runs, {"sparse": 0.5, "dense": 0.5}, k)


@pytest.fixture(scope="module")
def topical_index(tmp_path_factory):
    docs, queries = topical(600, 12, seed=3)
    backend = LocalBackend(tmp_path_factory.mktemp("topical") / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    yield backend, docs, queries
    backend.close()


def recalls(backend, docs, queries, fusion: str, k: int, window: int | None) -> list[float]:
    out = []
    for q in queries:
        want = {h.id for h in every_document_fusion(docs, q, fusion, k)}
        got = run_query(backend, q, SearchOptions(mode="hybrid", k=k, fusion=fusion, window=window, explain=0)).hits
        assert len(got) == k
        out.append(len({h.id for h in got} & want) / k)
    return out


@pytest.mark.parametrize("k", [10, 30])
def test_rrf_with_the_default_pool_is_rrf_over_every_document(topical_index, k):
    backend, docs, queries = topical_index
    assert SearchOptions(mode="hybrid", k=k, fusion="rrf").candidates == 10 * k
    assert recalls(backend, docs, queries, "rrf", k, None) == [1.0] * len(queries)
    assert np.mean(recalls(backend, docs, queries, "rrf", k, k)) < 0.9  # a pool of k misses some


def test_minmax_over_every_document_and_with_the_default_pool(topical_index):
    """Min-max normalises by its pool: given every document it is exactly the brute-force
    fusion; the default pool keeps 0.87 of that top 10 here (the pool of k 0.67)."""
    backend, docs, queries = topical_index
    for q in queries[:10]:
        want = every_document_fusion(docs, q, "minmax", 10)
        got = run_query(backend, q, SearchOptions(mode="hybrid", k=10, window=len(docs), explain=0)).hits
        assert [h.id for h in got] == [h.id for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-6)
    default = np.mean(recalls(backend, docs, queries, "minmax", 10, None))
    assert default >= 0.85 and default > np.mean(recalls(backend, docs, queries, "minmax", 10, 10)) + 0.1


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "50"])
def test_a_bad_window_is_refused_in_one_line(window):
    with pytest.raises(QueryError) as err:
        SearchOptions(mode="hybrid", k=10, window=window).validate()
    assert str(err.value) == f"window (candidates) must be a whole number at least 1, not {window!r}"


def test_the_pool_rule_and_the_window_asks_for_more_candidates():
    assert SearchOptions(mode="hybrid", k=10).candidates == 100
    assert SearchOptions(mode="two-phase", k=1000, fusion="rrf").candidates == 10_000  # two-phase: max(100, 10k)
    assert SearchOptions(mode="two-phase", k=1000).candidates == 10_000
    # hybrid, either fusion: max(100, min(10k, k + max(k, 1000)))
    for fusion in ("rrf", "minmax"):
        assert [SearchOptions(mode="hybrid", k=k, fusion=fusion).candidates for k in (1, 10, 50, 100, 200, 500, 1000, 2000)] == \
               [100, 100, 500, 1000, 1200, 1500, 2000, 4000]
    assert SearchOptions(mode="hybrid", k=1000, fusion="rrf", window=10_000).candidates == 10_000
    assert SearchOptions(mode="hybrid", k=10, window=3000).candidates == 3000
    assert SearchOptions(mode="hybrid", k=50, window=20).candidates == 50  # never fewer than k
