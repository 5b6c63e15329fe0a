"""The dense graphs' settings: the recall `index stats` reports (measured when a graph is
built, kept in the cache's header, validated when read back) against a brute-force
recomputation, and the search width (``dense_ef``, ``query --ef``): the candidates a graph
search rescores, at least k, bad values refused in one line."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from d2s_search.backends.base import Document
from d2s_search.backends.local import LocalBackend, cache, graph
from d2s_search.errors import QueryError
from tests.helpers import brute_force_dense, run_cli, run_cli_json
from tests.reliability.local_index_fixtures import IDENTITY, VOCAB

pytestmark = pytest.mark.skipif(not graph.available(), reason="faiss 1.11+ (the faiss extra) builds the graphs")

DIM = 16


def documents(n: int, seed: int = 3) -> list[Document]:
    """Loose clusters in 16-d: near neighbours close enough in score that a narrow graph
    search misses some."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, DIM)).astype(np.float32)
    return [Document(id=f"{i:064x}", path=f"/p/{i}", size_bytes=1, width=1, height=1, sparse={VOCAB[i % len(VOCAB)]: 1.0},
                     dense=centres[i % 20] + rng.normal(size=DIM).astype(np.float32) * 0.9) for i in range(n)]


@pytest.fixture
def forced(tmp_path, monkeypatch):
    """Graphs at any size, shards of 256 rows, the graph for every k below a shard's rows,
    and a narrow build-time width (8) so the recall measured is below 1."""
    from d2s_search.backends.local import backend as backend_mod

    monkeypatch.setattr(cache, "SHARD_ROWS", 256)
    monkeypatch.setattr(backend_mod, "APPROXIMATE_DENSE_FROM", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_FROM_ROWS", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1.0)
    monkeypatch.setattr(graph, "EF_SEARCH", 8)
    docs = documents(700)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    return backend, docs


def test_stats_recall_equals_brute_force_recomputation(forced, capsys):
    """Per shard, 50 evenly spaced rows as queries: their exact top 10 in the shard (the row
    itself left out) by brute force in float64, against the graph's 11 best without the row."""
    backend, docs = forced
    state = backend._search_state()
    assert [s.rows for s in state.shards] == [256, 256, 188] and all("hnsw" in s.arrays for s in state.shards)
    found = wanted = 0
    for shard in state.shards:
        part = docs[shard.start : shard.start + shard.rows]
        picked = sorted({int(x) for x in np.linspace(0, shard.rows - 1, num=50)})
        for row in picked:
            exact = [doc_id for doc_id, _ in brute_force_dense(part, part[row].dense) if doc_id != part[row].id][:10]
            rows, _ = graph.search(shard.dense_graph(), shard.dense_rows(), np.asarray(part[row].dense), 11, 8)
            got = [part[r].id for r in rows.tolist() if r != row][:10]
            found += len(set(exact) & set(got))
            wanted += 10
    expected = round(found / wanted, 3)
    assert 0.3 < expected < 1.0  # narrow enough to miss some, so the number says something
    assert backend.stats()["dense_recall_at_10"] == expected
    reopened = LocalBackend(backend.path)  # read back from the cache header
    reopened.open(None, create=False)
    assert [s.graph_recall for s in reopened._search_state().shards] == [s.graph_recall for s in state.shards]
    code, stats = run_cli_json(["index", "stats", "--index", backend.path], capsys)
    assert code == 0 and stats["dense_search"] == "hnsw" and stats["dense_recall_at_10"] == expected
    code, out, _ = run_cli(["index", "stats", "--index", backend.path], capsys)
    assert f"dense_recall_at_10         {expected}" in out


def test_an_exact_index_reports_no_graph_recall(tmp_path):
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(documents(50))
    assert backend.stats()["dense_search"] == "exact" and backend.stats()["dense_recall_at_10"] is None


@pytest.mark.parametrize("value", [[60, 50], [-1, 10], [3], [1.5, 10], [True, 10], "7/10", [10, 10_000], None])
def test_a_bad_recorded_recall_reads_back_as_unknown(forced, value):
    backend, _ = forced
    state_dir = backend._search_state().state_dir
    header = json.loads((state_dir / "header.json").read_bytes())
    for meta in header["shards"]:
        meta["graph_recall"] = value
    data = json.dumps(header).encode()
    (state_dir / "header.json").write_bytes(data)  # with a matching checksum: only the value is wrong
    (state_dir.parent / cache.POINTER).write_text(f"{state_dir.name} {zlib.crc32(data)}\n")
    reopened = LocalBackend(backend.path)
    reopened.open(None, create=False)
    assert all(s.graph_recall is None for s in reopened._search_state().shards)
    assert reopened.stats()["dense_recall_at_10"] is None
    assert cache.recorded_recall([7, 10]) == (7, 10)


def test_dense_ef_sets_the_candidates_searched_and_never_fewer_than_k(forced, monkeypatch):
    backend, docs = forced
    backend._search_state()  # graphs built (and their recall sampled) before counting
    asked = []
    real = graph._search_parameters.__wrapped__

    def spy(ef: int):
        asked.append(ef)
        return real(ef)

    monkeypatch.setattr(graph, "_search_parameters", spy)
    query = np.asarray(docs[5].dense) + 0.1
    for ef, k, width in ((None, 5, 8), (40, 5, 40), (40, 60, 60), (1, 3, 3)):
        backend.dense_ef = ef
        asked.clear()
        hits = backend.dense_search(query, k, explain=0)
        assert asked == [width] * 3 and len(hits) == k  # one search per shard, max(ef, k) candidates
    assert backend.dense_ef == 1
    backend.dense_ef = None
    assert backend.dense_ef == graph.EF_SEARCH == 8
    # Every row a candidate: the graph reaches them all, the result is the exact one.
    backend.dense_ef = 100_000
    want = brute_force_dense(docs, query)[:10]
    hits = backend.dense_search(query, 10, explain=0)
    assert [h.id for h in hits] == [d for d, _ in want]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-5, atol=1e-6)
    assert LocalBackend(backend.path, dense_ef=32).dense_ef == 32


@pytest.mark.parametrize("value", [0, -4, 100_001, 2.5, True, "64"])
def test_bad_dense_ef_is_refused(tmp_path, value):
    with pytest.raises(QueryError, match=r"^dense search candidates \(--ef\) must be a whole number from 1 to 100,000"):
        LocalBackend(tmp_path / "idx", dense_ef=value)
    backend = LocalBackend(tmp_path / "idx")
    with pytest.raises(QueryError):
        backend.dense_ef = value
    assert backend.dense_ef == graph.EF_SEARCH


@pytest.mark.parametrize("given", ["0", "100001", "many"])
def test_bad_ef_on_the_command_line_is_one_line(tmp_path, capsys, given):
    code, out, err = run_cli(["query", "dog", "--mode", "dense", "--index", tmp_path / "idx", "--ef", given], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--ef" in err


def test_ef_is_for_the_local_index(tmp_path, capsys):
    code, _, err = run_cli(["query", "dog", "--url", "http://127.0.0.1:9", "--ef", "32"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--ef" in err


def test_query_ef_reaches_the_graph_search(tmp_path, tiny_blip_bundle, image_folder, capsys, monkeypatch):
    """`query --ef N` on a local index with graphs: each graph is asked for max(N, k)
    candidates; without it, the default."""
    from d2s_search.backends.local import backend as backend_mod

    monkeypatch.setattr(backend_mod, "APPROXIMATE_DENSE_FROM", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_FROM_ROWS", 0)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 1.0)
    index = tmp_path / "idx"
    code, _ = run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0
    asked = []
    real = graph._search_parameters.__wrapped__
    monkeypatch.setattr(graph, "_search_parameters", lambda ef: asked.append(ef) or real(ef))
    base = ["query", "a dog", "--mode", "dense", "-k", "3", "--no-serve", "--bundle", tiny_blip_bundle, "--index", index]
    for extra, width in (([], graph.EF_SEARCH), (["--ef", "21"], 21), (["--ef", "2"], 3)):
        asked.clear()
        code, result = run_cli_json([*base, *extra], capsys)
        assert code == 0 and len(result["results"]) == 3 and asked == [width]
    monkeypatch.setenv("D2S_DENSE_EF", "17")
    asked.clear()
    assert run_cli_json(base, capsys)[0] == 0 and asked == [17]
    monkeypatch.delenv("D2S_DENSE_EF")
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    monkeypatch.setenv("D2S_CONFIG_DIR", str(config_dir))
    monkeypatch.chdir(tmp_path)
    (config_dir / "config.toml").write_text("dense_ef = 19\n")
    asked.clear()
    assert run_cli_json(base, capsys)[0] == 0 and asked == [19]
    (config_dir / "config.toml").write_text("dense_ef = 0\n")
    code, out, err = run_cli(base, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--ef" in err
