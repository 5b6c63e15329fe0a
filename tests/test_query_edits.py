"""Editable queries (-word, +word, word^N) on the local index: the parser, the vectors, and
every plan's ranking against brute force over the documents that pass."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.base import CARRIES_WORD_FROM, Document, WordFilter
from d2s_search.backends.local import LocalBackend
from d2s_search.backends.opensearch.features import lucene_feature_value
from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder
from d2s_search.errors import QueryError
from d2s_search.ingest import ingest
from d2s_search.query_edits import parse_query
from d2s_search.search import SearchOptions, encode_text_query, fuse_minmax, fuse_rrf, run_query
from tests.helpers import (
    brute_force_dense,
    brute_force_words,
    edit_docs,
    run_cli,
    run_cli_json,
    write_image,
)

# --- the typed syntax --------------------------------------------------------------------


@pytest.mark.parametrize(("typed", "text", "required", "excluded", "weights"), [
    ("dogs in a car -car", "dogs in a car", [], ["car"], {}),
    ("dog +beach", "dog beach", ["beach"], [], {}),
    ("dog^2 beach", "dog beach", [], [], {"dog": 2.0}),
    ("+dog^0.5 -cat sofa", "dog sofa", ["dog"], ["cat"], {"dog": 0.5}),
    ("t-shirt black-and-white 3-4 - + ^2", "t-shirt black-and-white 3-4 - + ^2", [], [], {}),
])
def test_the_syntax_is_parsed(typed, text, required, excluded, weights):
    edits = parse_query(typed)
    assert (edits.text, edits.required, edits.excluded, edits.weights) == (text, required, excluded, weights)


@pytest.mark.parametrize("typed", ["dog^x", "dog^0", "dog^-1", "dog^inf", "dog^1000", "-car", "-car -dog"])
def test_bad_edits_are_one_line_usage_errors(typed):
    with pytest.raises(QueryError) as caught:
        parse_query(typed)
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2


# --- a hand-checkable collection (edit_docs) -----------------------------------------------


@pytest.fixture
def hand_index(tmp_path):
    backend = LocalBackend(tmp_path / "idx")
    backend.open(synthetic_identity(), create=True)
    backend.upsert(edit_docs())
    yield backend
    backend.close()


def synthetic_identity():
    from d2s_search.backends.base import IndexIdentity

    return IndexIdentity(fingerprint="c" * 32, dense_dim=8, model="synthetic")


def names(hits) -> list[str]:
    return [h.path.removeprefix("photos/").removesuffix(".jpg") for h in hits]


def test_minus_car_removes_the_car_pictures_by_hand(hand_index):
    assert names(hand_index.sparse_search({"dog": 1.0, "car": 1.0}, 10)) == [
        "dog-in-car", "car-alone", "dog-faint-car", "dog-park", "dog-beach"]
    # "dogs in a car -car": car leaves the query, and pictures carrying car (>= 1.0) leave the
    # results; a faint car (0.25) is not a car picture.
    hits = hand_index.sparse_search({"dog": 1.0}, 10, words=WordFilter(excluded=("car",)))
    assert names(hits) == ["dog-faint-car", "dog-park", "dog-beach"]
    assert [h.score for h in hits] == [1.75, 1.5, 1.25]


def test_plus_word_is_a_filter_not_a_boost(hand_index):
    hits = hand_index.sparse_search({"dog": 1.0}, 10, words=WordFilter(required=("beach",)))
    assert names(hits) == ["dog-beach"] and hits[0].score == 1.25  # the score is the query's, unboosted
    assert hand_index.sparse_search({"dog": 1.0}, 10, words=WordFilter(required=("grass",))) and names(
        hand_index.sparse_search({"dog": 1.0}, 10, words=WordFilter(required=("grass",)))) == ["dog-faint-car",
                                                                                               "dog-park"]
    assert hand_index.sparse_search({"dog": 1.0}, 10, words=WordFilter(required=("zebra",))) == []
    # +car and -car split the matches between them
    plus = names(hand_index.sparse_search({"dog": 1.0}, 10, words=WordFilter(required=("car",))))
    minus = names(hand_index.sparse_search({"dog": 1.0}, 10, words=WordFilter(excluded=("car",))))
    assert sorted(plus + minus) == sorted(names(hand_index.sparse_search({"dog": 1.0}, 10)))


def test_dense_and_two_phase_apply_the_words_too(hand_index):
    vector = np.ones(8, dtype=np.float32) / np.sqrt(8)
    dense = hand_index.dense_search(vector, 10, words=WordFilter(excluded=("car",)))
    assert names(dense) == ["dog-faint-car", "dog-park", "dog-beach", "cat-sofa"]
    two = hand_index.two_phase_search({"dog": 1.0}, {"dog": 1.0, "grass": 1.0}, 10, 100,
                                      words=WordFilter(excluded=("car",)))
    assert names(two) == ["dog-park", "dog-faint-car", "dog-beach"]


def test_k_hits_come_back_when_k_pass(tmp_path):
    """Twenty car pictures outscore ten without a car: -car still returns ten, not what is
    left of the top ten after filtering."""
    backend = LocalBackend(tmp_path / "idx")
    backend.open(synthetic_identity(), create=True)
    docs = [Document(id=f"{i:064x}", path=f"p/{i}.jpg", size_bytes=1, width=1, height=1,
                     sparse={"dog": 2.0 + i / 64, "car": 1.5} if i < 20 else {"dog": 0.5 + i / 64},
                     dense=np.eye(8, dtype=np.float32)[i % 8]) for i in range(30)]
    backend.upsert(docs)
    hits = backend.sparse_search({"dog": 1.0}, 10, words=WordFilter(excluded=("car",)))
    assert [h.path for h in hits] == [f"p/{i}.jpg" for i in range(29, 19, -1)]
    dense = backend.dense_search(np.eye(8, dtype=np.float32)[0], 10, words=WordFilter(excluded=("car",)))
    assert len(dense) == 10 and all(int(h.path[2:-4]) >= 20 for h in dense)
    backend.close()


# --- a real bundle: edits in the vectors, rankings against brute force ---------------------


@pytest.fixture(scope="module")
def searchable(tmp_path_factory, tiny_blip_bundle, image_folder):
    bundle = Bundle.load(tiny_blip_bundle)
    encoder = Encoder(bundle, device="cpu")
    backend = LocalBackend(tmp_path_factory.mktemp("edits") / "idx")
    backend.open(bundle.identity())
    extra = tmp_path_factory.mktemp("edits-extra")
    for i in range(40):
        write_image(extra / f"x{i:03d}.jpg", seed=900 + i)
    assert ingest([image_folder, extra], encoder, backend, batch_size=16, top_k=64).stored == 80
    ids = [r[0] for r in backend._connect(False).execute("SELECT id FROM docs ORDER BY seq")]
    return encoder, backend, backend.get(ids)


def test_minus_word_leaves_the_vector_and_plus_word_stays(searchable):
    encoder, _, _ = searchable
    plain = encode_text_query(encoder, "a dog in a car on the beach")
    word = next(w for w in ("car", "dog", "beach") if w in plain.full)  # random weights: one has a weight
    edited = encode_text_query(encoder, f"a dog in a car on the beach -{word}")
    assert word not in edited.full and word not in edited.own
    assert edited.edits.excluded == [word] and edited.words == WordFilter(excluded=(word,))
    required = encode_text_query(encoder, "a dog in a car on the beach".replace(word, f"+{word}"))
    assert required.full == plain.full  # a filter, not a boost
    assert required.words == WordFilter(required=(word,))


def test_a_weight_multiplies_exactly_that_term(searchable):
    encoder, _, _ = searchable
    plain = encode_text_query(encoder, "dog car beach")
    word = next(w for w in ("car", "dog", "beach") if w in plain.full)
    weighed = encode_text_query(encoder, "dog car beach".replace(word, f"{word}^2"))
    assert weighed.full[word] == 2 * plain.full[word]
    assert {t: w for t, w in weighed.full.items() if t != word} == {t: w for t, w in plain.full.items() if t != word}
    assert weighed.edits.weights == {word: 2.0}


def test_an_edited_word_the_model_does_not_know_is_named(searchable):
    encoder, backend, _ = searchable
    vectors = encode_text_query(encoder, "a dog -giraffe")
    assert "giraffe" in vectors.unrecognised and not vectors.words
    result = run_query(backend, vectors, SearchOptions(k=3))
    assert "does not know the word 'giraffe'" in result.notice


def _threshold_splitting(docs, term: str) -> float:
    """A threshold that about half the documents carrying ``term`` reach (random weights)."""
    values = sorted(lucene_feature_value(d.sparse[term]) for d in docs if term in d.sparse)
    assert len(values) > 10, term
    return values[len(values) // 2]


@pytest.mark.parametrize("k", [1, 10, 80])
@pytest.mark.parametrize("side", ["required", "excluded", "both"])
def test_sparse_two_phase_dense_and_hybrid_equal_brute_force(searchable, k, side):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, "a dog running on the beach")
    first, second = sorted(q.full, key=lambda t: -sum(t in d.sparse for d in docs))[:2]
    threshold = _threshold_splitting(docs, first)
    words = WordFilter(required=(first,) if side != "excluded" else (),
                       excluded=(first,) if side == "excluded" else (second,) if side == "both" else (),
                       threshold=threshold)
    reference = brute_force_words(docs, q.full, words)
    assert 0 < len(reference) < len([d for d in docs if set(d.sparse) & set(q.full)])
    hits = backend.sparse_search(q.full, k, words=words)
    assert [h.id for h in hits] == [i for i, _ in reference[:k]]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in reference[:k]], rtol=1e-5)

    passing = [d for d in docs if words.allows({t: lucene_feature_value(w) for t, w in d.sparse.items()})]
    dense = backend.dense_search(q.dense, k, words=words)
    assert [h.id for h in dense] == [i for i, _ in brute_force_dense(passing, q.dense)[:k]]

    window = 20
    first_pass = [i for i, _ in brute_force_words(docs, q.own, words)[:window]]
    full_scores = dict(reference)
    expected = sorted(first_pass, key=lambda i: (-full_scores.get(i, 0.0), first_pass.index(i)))[:k]
    assert [h.id for h in backend.two_phase_search(q.own, q.full, k, window, words=words)] == expected

    for fusion in ("minmax", "rrf"):
        options = SearchOptions(mode="hybrid", k=k, window=40, fusion=fusion)
        n = options.candidates
        runs = {"sparse": backend.sparse_search(q.full, n, words=words),
                "dense": backend.dense_search(q.dense, n, words=words)}
        fused = (fuse_rrf(runs, k) if fusion == "rrf" else
                 fuse_minmax(runs, {"sparse": 0.5, "dense": 0.5}, k))
        got = backend.hybrid_search(q.full, q.dense, options, words=words)
        assert [h.id for h in got] == [h.id for h in fused]
        assert {h.id for h in got} <= {d.id for d in passing}


def test_run_query_applies_the_typed_edits(searchable):
    encoder, backend, docs = searchable
    q = encode_text_query(encoder, "a dog running on the beach -dog")
    assert q.words == WordFilter(excluded=("dog",))
    result = run_query(backend, q, SearchOptions(k=80))
    assert [h.id for h in result.hits] == [i for i, _ in brute_force_words(docs, q.full, q.words)]
    assert all(t != "dog" for h in result.hits for t, _ in h.matched)
    # The tiny random head's weights stay below CARRIES_WORD_FROM, so here only the vector edit
    # shows; the thresholds are checked against brute force above, and by hand on every backend.
    assert all(w < CARRIES_WORD_FROM for d in docs for w in d.sparse.values())
    assert result.to_json()["query_edits"] == {"required": [], "excluded": ["dog"], "weighted": []}


def test_the_cli_shows_the_edits(tmp_path, capsys, tiny_blip_bundle, image_folder):
    index = str(tmp_path / "idx")
    assert run_cli(["ingest", str(image_folder), "--bundle", str(tiny_blip_bundle), "--index", index], capsys)[0] == 0
    code, out = run_cli_json(["query", "a dog^2 in a car -car +beach", "--index", index, "--no-serve", "--json"],
                             capsys)
    assert code == 0
    assert out["query_edits"] == {"required": ["beach"], "excluded": ["car"], "weighted": [{"term": "dog", "factor": 2.0}]}
    assert "car" not in {t["term"] for t in out["query_terms"]}
    code, text, _ = run_cli(["query", "a dog in a car -car", "--index", index, "--no-serve"], capsys)
    assert code == 0 and "query edits: -car" in text
    code, _, err = run_cli(["query", "dog^x", "--index", index, "--no-serve"], capsys)
    assert code == 2 and "bad weight in 'dog^x'" in err and len(err.strip().splitlines()) == 1
