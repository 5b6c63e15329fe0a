"""Query plans on the local backend against brute-force numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.base import Document, Hit
from d2s_search.backends.local import LocalBackend, kernels
from d2s_search.backends.opensearch.features import lucene_feature_value
from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder
from d2s_search.ingest import ingest
from d2s_search.search import SearchOptions, encode_text_query, fuse_minmax, fuse_rrf, run_query
from tests.helpers import brute_force_dense, brute_force_sparse, run_cli, run_cli_json, write_image

QUERIES = ["a dog in a car", "two children playing on the beach", "a man riding a bike", "snow", "red"]


@pytest.fixture(scope="module")
def searchable(tmp_path_factory, tiny_blip_bundle, image_folder):
    """An index of generated photos (top-64 pruned terms, so postings differ per doc)."""
    bundle = Bundle.load(tiny_blip_bundle)
    encoder = Encoder(bundle, device="cpu")
    backend = LocalBackend(tmp_path_factory.mktemp("search") / "idx")
    backend.open(bundle.identity())
    extra = tmp_path_factory.mktemp("extra")
    for i in range(80):
        write_image(extra / f"x{i:03d}.jpg", seed=500 + i)
    report = ingest([image_folder, extra], encoder, backend, batch_size=16, top_k=64)
    assert report.stored == 120
    ids = sorted(backend.ids_present(_all_ids(backend)))
    docs = backend.get(ids)
    seq_order = {d: i for i, d in enumerate(_ids_in_seq_order(backend))}
    docs.sort(key=lambda d: seq_order[d.id])
    return encoder, backend, docs


def _all_ids(backend: LocalBackend) -> list[str]:
    return [r[0] for r in backend._connect(False).execute("SELECT id FROM docs")]


def _ids_in_seq_order(backend: LocalBackend) -> list[str]:
    return [r[0] for r in backend._connect(False).execute("SELECT id FROM docs ORDER BY seq")]


def assert_same_ranking(hits: list[Hit], reference: list[tuple[str, float]], k: int) -> None:
    want = reference[:k]
    assert [h.id for h in hits] == [doc_id for doc_id, _ in want]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text", QUERIES)
@pytest.mark.parametrize("k", [1, 10, 1000])
def test_sparse_equals_brute_force(searchable, text, k):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, text)
    hits = run_query(backend, q, SearchOptions(mode="sparse", k=k)).hits
    reference = brute_force_sparse(docs, q.full)
    assert len(reference) > 50  # the query really overlaps most documents
    assert_same_ranking(hits, reference, k)


@pytest.mark.parametrize("text", QUERIES)
@pytest.mark.parametrize("k", [1, 10, 1000])
def test_dense_equals_brute_force(searchable, text, k):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, text)
    hits = run_query(backend, q, SearchOptions(mode="dense", k=k)).hits
    assert_same_ranking(hits, brute_force_dense(docs, q.dense), min(k, len(docs)))


def reference_two_phase(docs, q, k, window):
    first = brute_force_sparse(docs, q.own)[:window]
    full = {doc_id: s for doc_id, s in brute_force_sparse(docs, q.full)}
    rescored = [(-full.get(doc_id, 0.0), rank, doc_id) for rank, (doc_id, _) in enumerate(first)]
    rescored.sort()
    return [(doc_id, -neg) for neg, _, doc_id in rescored][:k]


@pytest.mark.parametrize("text", QUERIES)
def test_two_phase_rescores_the_own_word_window(searchable, text):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, text)
    assert q.own and set(q.own) <= set(q.full) and len(q.own) < len(q.full)
    hits = run_query(backend, q, SearchOptions(mode="two-phase", k=10, window=20)).hits
    assert_same_ranking(hits, reference_two_phase(docs, q, 10, 20), 10)
    again = run_query(backend, q, SearchOptions(mode="two-phase", k=10, window=20)).hits
    assert [h.id for h in again] == [h.id for h in hits]
    # With a window covering every document the plan is the full sparse ranking of the
    # documents that contain at least one of the query's own words.
    everything = run_query(backend, q, SearchOptions(mode="two-phase", k=1000, window=1000)).hits
    reachable = {doc_id for doc_id, _ in brute_force_sparse(docs, q.own)}
    want = [(d, s) for d, s in brute_force_sparse(docs, q.full) if d in reachable]
    assert_same_ranking(everything, want, 1000)


def reference_minmax(runs: dict[str, list[tuple[str, float]]], weights: dict[str, float], k: int):
    totals: dict[str, float] = {}
    for name, run in runs.items():
        scores = [s for _, s in run]
        low, high = min(scores), max(scores)
        for doc_id, s in run:
            totals[doc_id] = totals.get(doc_id, 0.0) + weights[name] * ((s - low) / (high - low))
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_hybrid_minmax_equals_reference(searchable, alpha):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, "a dog in a car")
    hits = run_query(backend, q, SearchOptions(mode="hybrid", k=10, window=30, alpha=alpha)).hits
    runs = {"sparse": brute_force_sparse(docs, q.full)[:30], "dense": brute_force_dense(docs, q.dense)[:30]}
    want = reference_minmax(runs, {"sparse": 1 - alpha, "dense": alpha}, 10)
    assert [h.id for h in hits] == [d for d, _ in want]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-5, atol=1e-6)
    if alpha == 1.0:  # all weight on dense: the dense ranking
        assert [h.id for h in hits] == [d for d, _ in runs["dense"][:10]]
    assert all(h.matched for h in hits)  # every fused hit still says why it matched
    for hit in hits:  # each run's own score of the hits it found
        for name, run in runs.items():
            found = dict(run)
            if hit.id in found:
                assert hit.parts[name] == pytest.approx(found[hit.id], rel=1e-5, abs=1e-6)
            else:
                assert name not in hit.parts


def test_hybrid_rrf_equals_reference(searchable):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, "two children playing on the beach")
    hits = run_query(backend, q, SearchOptions(mode="hybrid", fusion="rrf", k=10, window=25)).hits
    runs = [brute_force_sparse(docs, q.full)[:25], brute_force_dense(docs, q.dense)[:25]]
    totals: dict[str, float] = {}
    for run in runs:
        for rank, (doc_id, _) in enumerate(run, start=1):
            totals[doc_id] = totals.get(doc_id, 0.0) + 1 / (60 + rank)
    want = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    assert [h.id for h in hits] == [d for d, _ in want]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-9)


def test_fusion_by_hand():
    sparse = [Hit("a", 10.0, "a"), Hit("b", 6.0, "b"), Hit("c", 2.0, "c")]
    dense = [Hit("c", 0.9, "c"), Hit("a", 0.5, "a"), Hit("d", 0.1, "d")]
    fused = fuse_minmax({"sparse": sparse, "dense": dense}, {"sparse": 0.5, "dense": 0.5}, 4)
    # a: .5*1 + .5*.5 = .75; c: .5*0 + .5*1 = .5; b: .5*.5 = .25; d: 0
    assert [(h.id, round(h.score, 6)) for h in fused] == [("a", 0.75), ("c", 0.5), ("b", 0.25), ("d", 0.0)]
    assert fused[0].parts == {"sparse": 10.0, "dense": 0.5}
    rrf = fuse_rrf({"sparse": sparse, "dense": dense}, 2, rank_constant=60)
    assert [h.id for h in rrf] == ["a", "c"]
    assert rrf[0].score == pytest.approx(1 / 61 + 1 / 62)


def test_matched_terms_explain_the_score(searchable):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, "a man riding a bike")
    (hit,) = backend.sparse_search(q.full, 1, explain=10_000)
    doc = next(d for d in docs if d.id == hit.id)
    assert sum(c for _, c in hit.matched) == pytest.approx(hit.score, rel=1e-4)
    for term, contribution in hit.matched:  # the stored weight: 9 significant bits, as OpenSearch's
        assert contribution == pytest.approx(q.full[term] * lucene_feature_value(doc.sparse[term]), rel=1e-6)
    top = backend.sparse_search(q.full, 1, explain=3)[0].matched
    assert top == hit.matched[:3]


def test_cache_extends_on_add_and_rebuilds_on_delete(tmp_path, tiny_blip_bundle):
    bundle = Bundle.load(tiny_blip_bundle)
    identity = bundle.identity()
    backend = LocalBackend(tmp_path / "idx")
    backend.open(identity)
    rng = np.random.default_rng(0)

    def doc(i: int, terms: dict[str, float]) -> Document:
        dense = rng.normal(size=16).astype(np.float32)
        return Document(id=f"{i:064x}", path=f"/p/{i}", size_bytes=1, width=1, height=1, sparse=terms, dense=dense)

    backend.upsert([doc(1, {"dog": 1.0, "car": 0.5}), doc(2, {"dog": 0.2})])
    assert [h.id[-1] for h in backend.sparse_search({"dog": 1.0}, 10)] == ["1", "2"]
    backend.upsert([doc(3, {"dog": 2.0, "zebra": 1.0})])  # a new term after the cache was built
    hits = backend.sparse_search({"dog": 1.0, "zebra": 1.0}, 10)
    # 0.2 is stored as OpenSearch keeps it: 9 significant bits, 0.19970703125
    assert [(h.id[-1], round(h.score, 5)) for h in hits] == [("3", 3.0), ("1", 1.0), ("2", 0.19971)]
    assert backend.delete([f"{3:064x}", "not-there"]) == 1
    assert [h.id[-1] for h in backend.sparse_search({"dog": 1.0, "zebra": 1.0}, 10)] == ["1", "2"]
    backend.upsert([doc(2, {"car": 4.0})])  # replaced in place
    assert [h.id[-1] for h in backend.sparse_search({"car": 1.0}, 10)] == ["2", "1"]
    backend.close()
    # A new process sees the same thing, from the cache on disk.
    reopened = LocalBackend(tmp_path / "idx")
    reopened.open(identity, create=False)
    assert [(h.id[-1], h.score) for h in reopened.sparse_search({"car": 1.0}, 10)] == [("2", 4.0), ("1", 0.5)]
    assert reopened.stats()["documents"] == 2
    # A damaged cache is rebuilt from SQLite (one warning line) and correctly.
    for shard_file in (tmp_path / "idx" / "cache").glob("state-*/shard-*-csc_indices.npy"):
        shard_file.write_bytes(b"garbage")
    fresh = LocalBackend(tmp_path / "idx")
    fresh.open(identity, create=False)
    assert [h.id[-1] for h in fresh.sparse_search({"car": 1.0}, 10)] == ["2", "1"]


def test_zero_and_negative_weights_are_never_stored(tmp_path, tiny_blip_bundle):
    backend = LocalBackend(tmp_path / "idx")
    backend.open(Bundle.load(tiny_blip_bundle).identity())
    backend.upsert([Document("a" * 64, "/a", 1, 1, 1, {"dog": 0.0, "cat": -1.0, "car": 0.3}, np.ones(16, np.float32))])
    (stored,) = backend.get(["a" * 64])
    assert stored.sparse == {"car": pytest.approx(0.3)}
    assert backend.sparse_search({"dog": 1.0, "cat": 1.0}, 5) == []


def test_query_cli_prints_ranked_results_and_json(tmp_path, tiny_blip_bundle, image_folder, capsys):
    index = tmp_path / "idx"
    run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    code, out, err = run_cli(["query", "dogs in a car", "--bundle", tiny_blip_bundle, "--index", index, "-k", "3"], capsys)
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines[0].split()[:3] == ["#", "score", "path"]
    assert [ln.split()[0] for ln in lines[1:4]] == ["1", "2", "3"] or "1" in out
    for mode in ("sparse", "two-phase", "dense", "hybrid"):
        code, result = run_cli_json(
            ["query", "dogs in a car", "--mode", mode, "--bundle", tiny_blip_bundle, "--index", index, "-k", "5"], capsys
        )
        assert code == 0 and result["mode"] == mode
        assert [r["rank"] for r in result["results"]] == [1, 2, 3, 4, 5]
        scores = [r["score"] for r in result["results"]]
        assert scores == sorted(scores, reverse=True)
        assert all(r["matched"] and r["path"].endswith((".jpg", ".png")) for r in result["results"])
    code, _, err = run_cli(["query", "   ", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 2 and "the query is empty" in err
    code, _, err = run_cli(["query", "dog", "--bundle", tiny_blip_bundle, "--index", tmp_path / "none"], capsys)
    assert code == 1 and "no index at" in err


def test_index_stats_and_delete(tmp_path, tiny_blip_bundle, image_folder, capsys):
    index = tmp_path / "idx"
    run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert code == 0 and stats["documents"] == 40 and stats["bundle_model"] == "tiny-blip"
    assert stats["mean_terms_per_document"] > 0 and stats["disk_bytes"] > 0
    assert stats["scoring_kernel"] == ("compiled" if kernels.c_kernel_loaded() else "numpy")
    assert stats["hit_builder"] == ("compiled" if kernels._c_hits is not None else "python")
    assert stats["graph_walk"] == ("compiled" if kernels._c_graph is not None else "faiss")
    assert stats["sparse_query"] == ("compiled" if kernels._c_query is not None and kernels.c_kernel_loaded() else "python")
    assert stats["dense_search"] == "exact"  # 40 documents: every vector scored
    from d2s_search.backends.local import backend as backend_mod
    from d2s_search.backends.local import graph

    old = backend_mod.APPROXIMATE_DENSE_FROM
    backend_mod.APPROXIMATE_DENSE_FROM = 40
    try:
        code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    finally:
        backend_mod.APPROXIMATE_DENSE_FROM = old
    assert code == 0 and stats["dense_search"] == ("hnsw" if graph.available() else "exact")
    code, out = run_cli_json(["index", "delete", "--index", index, "--yes"], capsys)
    assert code == 0 and not index.exists()
    code, _, err = run_cli(["index", "delete", "--index", index, "--yes"], capsys)
    assert code == 1 and "no index to delete" in err


@pytest.mark.parametrize("n", [1, 7, 100, 5000, 40_000])
@pytest.mark.parametrize("k", [1, 3, 10, 64, 65, 1000])
def test_top_rows_equals_full_sort_even_with_ties(n, k):
    from d2s_search.backends.local import _top_rows

    rng = np.random.default_rng(n * 31 + k)
    scores = rng.integers(0, 6, size=n).astype(np.float32)  # many ties, many zeros
    scores[rng.random(n) < 0.3] = 0
    smooth = rng.random(n).astype(np.float32)
    for values in (scores, smooth):
        want = [i for i in np.lexsort((np.arange(n), -values)) if values[i] > 0][:k]
        assert _top_rows(values, k).tolist() == want
        # the shard kernel (C heap up to k=64 when built, numpy above): one term covering every row
        rows, top = kernels.shard_top(np.array([0, n], np.int32), np.arange(n, dtype=np.uint16), values, n,
                                      np.array([0]), np.ones(1, np.float32), np.empty(n, np.float32), k)
        assert rows.tolist() == want and top.tolist() == values[want].tolist()


@pytest.mark.parametrize("n", [1, 7, 100, 5000])
@pytest.mark.parametrize("k", [1, 10, 100, 6000])
def test_top_rows_of_inner_products_equals_full_sort_even_with_ties(n, k):
    """The dense plan's top k (any sign): score descending, ties by row, as a full sort."""
    rng = np.random.default_rng(n * 7 + k)
    for values in (rng.integers(-3, 4, size=n).astype(np.float32), rng.standard_normal(n).astype(np.float32)):
        want = np.lexsort((np.arange(n), -values))[:k].tolist()
        assert kernels.top_rows_any_sign(values, k).tolist() == want


def test_heads_trained_without_expansion_search_with_the_query_words_only(tmp_path):
    """A head trained with exp=0 records query_mask=own_tokens; queries are masked the same way."""
    from d2s_onnx_export.export import build_head, export_bundle
    from d2s_onnx_export.head import save_head
    from d2s_onnx_export.models import build_dense_encoder

    head = build_head(build_dense_encoder("tiny-clip"), None)
    head.config.trained = True
    head.config.notes = {"query_mask": "own_tokens"}
    bundle = export_bundle("tiny-clip", tmp_path / "b", head_path=save_head(head, tmp_path / "h.pt")).bundle
    encoder = Encoder(bundle, device="cpu")
    own_words = encoder.own_terms(encoder.encode_texts(["a dog in a car"]).token_ids[0])
    q = encode_text_query(encoder, "a dog in a car")
    assert q.full and set(q.full) <= own_words and q.own == q.full
    unmasked = encode_text_query(Encoder(Bundle.load(tmp_path / "b"), device="cpu"), "a dog in a car")
    assert unmasked.full == q.full  # the flag comes from the bundle, not from the caller
    assert len(encoder.to_terms(encoder.encode_texts(["a dog in a car"]).sparse[0])) > len(q.full)


def test_weak_queries_say_so(searchable, tmp_path, tiny_blip_bundle, image_folder, capsys):
    """No word the model knows: results still come back, flagged as guesses."""
    from d2s_search.search import SearchResult

    encoder, backend, _ = searchable
    for text in ("qwertyuiop", "собака в машине"):
        vec = encode_text_query(encoder, text)
        assert vec.weak and vec.recognised == []
        res = run_query(backend, vec, SearchOptions(k=3))
        out = res.to_json()
        assert out["weak_query"] is True and out["results"]
        assert out["unrecognised_words"] and "no word the model knows" in out["notice"]
    vec = encode_text_query(encoder, "a dog in a car")
    assert not vec.weak and vec.recognised == ["dog", "car"]
    out = run_query(backend, vec, SearchOptions(k=3)).to_json()
    assert out["weak_query"] is False and out["notice"] is None
    assert SearchResult(mode="sparse", hits=[], took_ms=0.0).to_json()["weak_query"] is False
    index = tmp_path / "idx"
    run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    code, out, err = run_cli(["query", "qwertyuiop", "--bundle", tiny_blip_bundle, "--index", index, "-k", "3"], capsys)
    assert code == 0 and "note: The query has no word the model knows" in err and "'qwertyuiop'" in err
    assert "guesses" in err and "1" in out  # the results are still shown
    code, result = run_cli_json(["query", "qwertyuiop", "--bundle", tiny_blip_bundle, "--index", index, "--json"], capsys)
    assert code == 0 and result["weak_query"] is True and result["unrecognised_words"] == ["qwertyuiop"]
    code, out, err = run_cli(["query", "a dog in a car", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and "no word the model knows" not in err


def test_query_terms_shown_are_the_strongest_by_weight_then_term():
    """``SearchResult.query_terms``: the 50 strongest terms, equal weights in term order."""
    import random

    from d2s_search.search import _top

    for seed in range(100):
        r = random.Random(seed)
        vector = {f"t{r.randrange(120)}": r.choice([0.5, 1.0, 2.0, r.random()]) for _ in range(r.randrange(0, 90))}
        want = sorted(vector.items(), key=lambda kv: (-kv[1], kv[0]))[:50]
        assert list(_top(vector, 50).items()) == want
    assert list(_top({"b": 1.0, "a": 1.0, "c": 3.0}, 2).items()) == [("c", 3.0), ("a", 1.0)]
