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
from tests.reliability.local_index_fixtures import IDENTITY, VOCAB, graphs_at_any_size

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
    graphs_at_any_size(monkeypatch, 256)
    monkeypatch.setattr(graph, "EF_SEARCH", 8)
    docs = documents(700)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    return backend, docs


def test_stats_recall_equals_brute_force_recomputation(forced, capsys):
    """Per graph (one spanning the two full shards, one for the last), 50 evenly spaced rows
    as queries: their exact top 10 among the graph's rows (the row itself left out) by brute
    force in float64, against the graph's 11 best without the row."""
    backend, docs = forced
    state = backend._search_state()
    assert [s.rows for s in state.shards] == [256, 256, 188] and state.dense_units() == [(0, 2), (2, 1)]
    found = wanted = 0
    for first, span in state.dense_units():
        members = state.shards[first : first + span]
        start, rows = members[0].start, sum(m.rows for m in members)
        part = docs[start : start + rows]
        picked = sorted({int(x) for x in np.linspace(0, rows - 1, num=50)})
        for row in picked:
            exact = [doc_id for doc_id, _ in brute_force_dense(part, part[row].dense) if doc_id != part[row].id][:10]
            found_rows, _ = graph.search(members[0].dense_graph(), backend._unit_vectors(members),
                                         np.asarray(part[row].dense), 11, 8)
            got = [part[r].id for r in found_rows.tolist() if r != row][:10]
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


def widths_asked(monkeypatch) -> list[int]:
    """The candidates each graph search asks for, in order (appended as they are asked)."""
    asked: list[int] = []
    real = graph.OpenedGraph.candidates

    def spy(self, query, wanted, allowed=None):
        asked.append(wanted)
        return real(self, query, wanted, allowed)

    monkeypatch.setattr(graph.OpenedGraph, "candidates", spy)
    return asked


def test_dense_ef_sets_the_candidates_searched_and_never_fewer_than_k(forced, monkeypatch):
    backend, docs = forced
    backend._search_state()  # graphs built (and their recall sampled) before counting
    asked = widths_asked(monkeypatch)
    query = np.asarray(docs[5].dense) + 0.1
    for ef, k, width in ((None, 5, 8), (40, 5, 40), (40, 60, 60), (1, 3, 3)):
        backend.dense_ef = ef
        asked.clear()
        hits = backend.dense_search(query, k, explain=0)
        assert asked == [width] * 2 and len(hits) == k  # one search per graph, max(ef, k) candidates
    assert backend.dense_ef == 1
    backend.dense_ef = None
    assert backend.dense_ef == graph.EF_SEARCH == 8
    # More candidates than a graph's rows: each part is scanned instead (no graph asked), exact.
    backend.dense_ef = 100_000
    want = brute_force_dense(docs, query)[:10]
    asked.clear()
    hits = backend.dense_search(query, 10, explain=0)
    assert asked == []
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
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 10**6)  # a few pictures: the graph even so
    index = tmp_path / "idx"
    code, _ = run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0
    asked = widths_asked(monkeypatch)
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


def test_a_graph_extended_by_a_shard_searches_as_one_built_over_both():
    """A graph spanning shards is extended when another fills: it then numbers the new rows
    after the old ones, as one built over both does; with every row a candidate both give the
    brute-force top 10 of the rows together, and a narrow search finds most of it."""
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(20, DIM)).astype(np.float32)
    first, second = (centres[rng.integers(0, 20, n)] + rng.normal(size=(n, DIM)).astype(np.float32) * 0.9
                     for n in (300, 200))
    both = np.vstack([first, second])
    spanned = graph.SpannedRows([first, second])
    assert spanned.shape == both.shape
    picked = np.array([0, 299, 300, 499, 17, 350])
    np.testing.assert_array_equal(spanned[picked], both[picked])
    np.testing.assert_array_equal(spanned[301], both[301])
    query = rng.normal(size=DIM).astype(np.float32)
    np.testing.assert_allclose(spanned @ query, both @ query, rtol=1e-6)
    extended = graph.extend(graph.build([first]), 300, DIM, [second])
    built = graph.build([first, second])
    for blob, compiled in ((extended, True), (built, True), (extended, False), (built, False)):
        index = graph.OpenedGraph(blob, graph.layout(blob, 500, DIM), 500, DIM, compiled=compiled)
        found = 0
        for _ in range(30):
            query = rng.normal(size=DIM).astype(np.float32)
            exact = np.argsort(-(both.astype(np.float64) @ query), kind="stable")[:10]
            rows, scores = graph.search(index, spanned, query, 10, 500)
            assert rows.tolist() == exact.tolist()
            np.testing.assert_allclose(scores, both[rows] @ query, rtol=1e-6)
            found += len(set(graph.search(index, spanned, query, 10, 16)[0].tolist()) & set(exact.tolist()))
        assert found >= 0.85 * 300


def test_rows_gathered_in_c_equal_numpy_indexing(tmp_path):
    """The rows a graph's candidates or a code scan's best are rescored from, copied by
    ``_graph.c`` with the next ones asked for ahead: the same floats as numpy's indexing, from a
    read-only mapping as from memory, rows in any order or repeated, odd row widths; a row
    outside the matrix is refused, never read."""
    assert graph._c_graph is not None, "the compiled walk is part of the build under test"
    rng = np.random.default_rng(9)
    for dim in (5, 16, 384):
        matrix = rng.normal(size=(1000, dim)).astype(np.float32)
        np.save(tmp_path / f"m{dim}.npy", matrix)
        mapped = np.load(tmp_path / f"m{dim}.npy", mmap_mode="r")
        for rows in (np.arange(1000), rng.integers(0, 1000, 3000), np.array([999, 0, 999]), np.zeros(0, np.int64)):
            for source in (matrix, mapped):
                got = graph.gather(source, rows)
                assert got.shape == (rows.size, dim) and np.array_equal(got, matrix[rows])
        for outside in ([1000], [0, -1], [2**40]):
            with pytest.raises(IndexError):
                graph.gather(mapped, np.array(outside))
    parts = [rng.normal(size=(n, 8)).astype(np.float32) for n in (100, 1, 57)]
    spanned, together = graph.SpannedRows(parts), np.vstack(parts)
    for rows in (np.arange(158), np.sort(rng.integers(0, 158, 400)), rng.integers(0, 158, 400)):
        assert np.array_equal(spanned[rows], together[rows])
    for outside in ([158], [3, -1]):
        with pytest.raises(IndexError):
            spanned[np.array(outside)]


def test_extending_a_damaged_graph_is_refused():
    rng = np.random.default_rng(6)
    first, second = rng.normal(size=(200, DIM)).astype(np.float32), rng.normal(size=(50, DIM)).astype(np.float32)
    blob = graph.build([first]).copy()
    where = graph.layout(blob, 200, DIM)
    start, count = where.neighbors
    blob[start : start + 4] = np.frombuffer(np.int32(10**6).tobytes(), np.uint8)
    with pytest.raises(graph.DamagedArrays):
        graph.extend(blob, 200, DIM, [second])
    with pytest.raises(graph.DamagedArrays):
        graph.extend(graph.build([first]), 201, DIM, [second])  # not the rows it was built over


@pytest.mark.parametrize("change", [
    {0: 3}, {0: 4}, {0: 0}, {0: -1}, {0: "2"}, {0: 2.0}, {0: True}, {1: 1}, {0: 1},
], ids=["over-the-partial-shard", "past-the-end", "zero", "negative", "text", "float", "bool",
        "on-a-shard-without-a-graph", "fewer-shards-than-the-graph-holds"])
def test_a_bad_graph_span_in_the_header_is_damage(forced, capsys, monkeypatch, change):
    """The header says how many shards the first graph spans: a span that covers a partial
    shard, runs past the end, is not a whole number, or lands on shards without (or with their
    own) graphs makes the cache unusable: one warning, rebuilt, answers exact."""
    backend, docs = forced
    state_dir = backend._search_state().state_dir
    header = json.loads((state_dir / "header.json").read_bytes())
    assert [m.get("graph_span", 1) for m in header["shards"]] == [2, 1, 1]
    for j, value in change.items():
        header["shards"][j]["graph_span"] = value
    data = json.dumps(header).encode()
    (state_dir / "header.json").write_bytes(data)  # a matching checksum: only the span is wrong
    (state_dir.parent / cache.POINTER).write_text(f"{state_dir.name} {zlib.crc32(data)}\n")
    capsys.readouterr()
    from d2s_search.backends.local import backend as backend_mod

    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 10**6)  # the graph, even asked for every row
    reopened = LocalBackend(backend.path, dense_ef=100_000)
    reopened.open(None, create=False)
    query = np.asarray(docs[9].dense) + 0.05
    hits = reopened.dense_search(query, 10, explain=0)
    assert [h.id for h in hits] == [d for d, _ in brute_force_dense(docs, query)[:10]]
    err = capsys.readouterr().err
    assert err.count("unusable") == 1 and "graph" in err, err
    assert reopened._search_state().dense_units() == [(0, 2), (2, 1)]
    reopened.close()


def test_a_graph_spanning_many_shards_keeps_more_candidates_unless_asked(tmp_path, monkeypatch):
    """Recall at a fixed width falls as a graph grows: a graph over eight shards searches with
    twice the default candidates (graph.default_ef), a width asked for is used as it is, and
    a width of more candidates than a share of the rows scans them instead (exact)."""

    assert [graph.default_ef(span) for span in (1, 2, 3, 4, 8, 16)] == [graph.EF_SEARCH] * 4 + [
        2 * graph.EF_SEARCH, 4 * graph.EF_SEARCH]
    graphs_at_any_size(monkeypatch, 64)
    monkeypatch.setattr(graph, "EF_SEARCH", 8)
    docs = documents(8 * 64 + 20)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    assert backend._search_state().dense_units() == [(0, 8), (8, 1)]
    asked = widths_asked(monkeypatch)
    query = np.asarray(docs[3].dense)
    backend.dense_search(query, 5, explain=0)
    assert sorted(asked) == [8, 16]  # the last shard's graph, then the one over eight shards
    asked.clear()
    backend.dense_ef = 30
    backend.dense_search(query, 5, explain=0)
    assert asked == [30]  # the last shard (20 rows) is scanned: 30 candidates are over its share
    asked.clear()
    backend.dense_ef = 600
    hits = backend.dense_search(query, 10, explain=0)
    assert asked == [] and [h.id for h in hits] == [d for d, _ in brute_force_dense(docs, query)[:10]]
    backend.close()


def test_the_plan_scans_where_a_graph_would_rescore_too_many_candidates():
    """A graph over one shard answers while it rescores under 1/48 of the shard's rows; one
    spanning 15 shards under about 1/147 of its rows (measured: 3,000 candidates 33 ms, 10,000
    103 ms, a scan of the rows 74 ms): above that its shards are scanned."""
    rows = cache.SHARD_ROWS
    assert LocalBackend._graph_pays(10, rows, 64) and LocalBackend._graph_pays(1300, rows, 64)
    assert not LocalBackend._graph_pays(1400, rows, 64) and not LocalBackend._graph_pays(10, rows, 1400)
    assert LocalBackend._graph_pays(3000, 15 * rows, 256) and LocalBackend._graph_pays(10, 15 * rows, 6500)
    assert not LocalBackend._graph_pays(10_000, 15 * rows, 256) and not LocalBackend._graph_pays(10, 15 * rows, 7000)
    assert not LocalBackend._graph_pays(10, 4000, 100) and LocalBackend._graph_pays(10, 4000, 64)  # a small shard's own


def test_a_damaged_spanning_graph_is_built_anew_when_a_shard_fills(tmp_path, monkeypatch):
    """The spanning graph read back to be extended is checked first: damaged (checksums forged
    to match), it is built again over every full shard instead, and searches find what they did."""
    from tests.reliability.local_index_fixtures import rewrite_array, state_dir

    graphs_at_any_size(monkeypatch, 64)
    docs = documents(3 * 64 + 10)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs[:2 * 64 + 10])
    assert backend._search_state().dense_units() == [(0, 2), (2, 1)]
    backend.close()
    blob = np.load(state_dir(tmp_path / "idx") / "shard-00000-hnsw.npy").copy()
    start, count = graph.layout(blob, 128, DIM).neighbors
    blob[start + 4 * (count // 2) : start + 4 * (count // 2) + 4] = np.frombuffer(np.int32(10**6).tobytes(), np.uint8)
    rewrite_array(tmp_path / "idx", "shard-00000-hnsw.npy", blob)
    again = LocalBackend(tmp_path / "idx")
    again.open(None, create=False)
    again.upsert(docs[2 * 64 + 10 :])  # fills the third shard: the damaged graph is not extended
    state = again._search_state()
    assert state.dense_units() == [(0, 3), (3, 1)]
    graph.check(state.shards[0].arrays["hnsw"], graph.layout(state.shards[0].arrays["hnsw"], 192, DIM), 192)
    found = 0
    for doc in docs[::20]:
        query = np.asarray(doc.dense) + 0.05
        want = {d for d, _ in brute_force_dense(docs, query)[:10]}
        found += len(want & {h.id for h in again.dense_search(query, 10, explain=0)})
    assert found >= 0.9 * 10 * len(docs[::20])
    again.close()


def test_a_graph_built_while_its_shards_are_made_is_the_one_built_after(tmp_path):
    """graph.Builder adds each part on a thread of its own as it is handed over: trained on the
    same rows and on one faiss thread its bytes equal graph.build's over the same parts, in
    memory and written to a file; each part's done() runs there once its rows are in, in
    order; a part faiss refuses is raised by finish on the caller's thread; abandon stops it."""
    import threading

    import faiss

    rng = np.random.default_rng(8)
    first, second = (rng.normal(size=(n, DIM)).astype(np.float32) for n in (300, 200))
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # one thread adds in a fixed order: the same graph twice
    try:
        done: list[tuple[int, str]] = []
        builder = graph.Builder(np.vstack([first, second]))
        for i, part in enumerate((first, second)):
            builder.add(part, lambda i=i: done.append((i, threading.current_thread().name)))
        ahead = builder.finish()
        written = graph.Builder(np.vstack([first, second]))
        written.add(first)
        written.add(second)
        on_disk = written.finish(out=tmp_path / "graph.npy")
        after = graph.build([first, second])
    finally:
        faiss.omp_set_num_threads(threads)
    assert done == [(0, "d2s-search-graph"), (1, "d2s-search-graph")]
    assert ahead.tobytes() == after.tobytes() == np.asarray(on_disk).tobytes()
    assert np.array_equal(np.load(tmp_path / "graph.npy"), after)

    refused = graph.Builder(first)
    refused.add(rng.normal(size=(5, DIM + 1)).astype(np.float32))  # not the graph's dimension
    refused.add(second)
    with pytest.raises((AssertionError, RuntimeError)):
        refused.finish()
    left = graph.Builder(first)
    left.add(first)
    left.abandon()
    left.abandon()
    assert not left._thread.is_alive()
    with pytest.raises(RuntimeError, match="already finished"):
        left.finish()


def test_a_build_from_scratch_makes_the_spanning_graph_while_it_makes_the_shards(tmp_path, monkeypatch):
    """Rebuilt from the database, the full shards go into the spanning graph as each is written
    (its pages released once in) and the graph is the one the build began, not one built after;
    with every row a candidate dense search is brute force, and at the default width it finds
    most of the top 10. Rows that turn out damaged leave fewer full shards than counted: the
    graph begun is dropped, and the shards get graphs of their own."""
    import shutil
    import sqlite3

    from d2s_search.backends.local import backend as backend_mod

    graphs_at_any_size(monkeypatch, 64)
    monkeypatch.setattr(backend_mod, "GRAPH_K_SHARE", 10**6)  # the graph, even asked for every row
    docs = documents(3 * 64 + 10)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IDENTITY)
    backend.upsert(docs)
    backend._search_state()
    backend.close()
    shutil.rmtree(tmp_path / "idx" / "cache")

    began, after, released = [], [], []
    real_finish, real_build, real_release = graph.Builder.finish, graph.build, cache.StateWriter.release
    monkeypatch.setattr(graph.Builder, "finish", lambda self, out=None: began.append(self.parts) or real_finish(self, out))
    monkeypatch.setattr(graph, "build", lambda parts, *a, **kw: after.append(len(parts)) or real_build(parts, *a, **kw))
    monkeypatch.setattr(cache.StateWriter, "release",
                        lambda self, j, name: released.append((j, name)) or real_release(self, j, name))
    again = LocalBackend(tmp_path / "idx")
    again.open(None, create=False)
    state = again._search_state()
    assert state.dense_units() == [(0, 3), (3, 1)]
    assert began == [3] and after == [1]  # the spanning graph begun early; the last shard's own after
    assert {(j, "dense") for j in range(3)} <= set(released)
    found = 0
    for doc in docs[::20]:
        query = np.asarray(doc.dense) + 0.05
        want = [d for d, _ in brute_force_dense(docs, query)[:10]]
        again.dense_ef = 100_000  # every row a candidate of its graph
        assert [h.id for h in again.dense_search(query, 10, explain=0)] == want
        again.dense_ef = None
        found += len(set(want) & {h.id for h in again.dense_search(query, 10, explain=0)})
    assert found >= 0.9 * 10 * len(docs[::20])
    again.close()

    db = sqlite3.connect(tmp_path / "idx" / "index.sqlite")  # two shards' worth, one row not a vector
    db.execute("DELETE FROM docs WHERE seq > ?", (2 * 64,))
    db.execute("UPDATE docs SET dense = ? WHERE id = ?", (b"\x01\x02\x03", docs[5].id))
    db.commit()
    db.close()
    shutil.rmtree(tmp_path / "idx" / "cache")
    began.clear()
    after.clear()
    short = LocalBackend(tmp_path / "idx")
    short.open(None, create=False)
    state = short._search_state()
    assert [s.rows for s in state.shards] == [64, 63] and state.dense_units() == [(0, 1), (1, 1)]
    assert began == [] and after == [1, 1]
    kept = [d for d in docs[: 2 * 64] if d.id != docs[5].id]
    short.dense_ef = 100_000
    query = np.asarray(kept[40].dense)
    assert [h.id for h in short.dense_search(query, 10, explain=0)] == [d for d, _ in brute_force_dense(kept, query)[:10]]
    short.close()
