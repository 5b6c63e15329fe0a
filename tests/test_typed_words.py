"""A query's own words are the words it typed whole: "giraffe", which the vocabulary splits into
``gi ##raf ##fe``, types none of its fragments. The text graph boosts whole-word tokens only
(wherever it runs, from the input ids alone); a bundle exported before that has the boost taken
back off its fragments at run time; evaluation and training boost what the graph boosts; and a
word the vocabulary lacks gets a note on the command line and the search page's API."""

from __future__ import annotations

import json

import numpy as np
import pytest

from d2s_search.bundle import Bundle, compute_fingerprint
from d2s_search.encoder import Encoder, tokenize_batch
from tests.helpers import run_cli

BOOST = 2.0
QUERY = "giraffe zebra"  # bert-base-uncased: [CLS] gi ##raf ##fe zebra [SEP]


@pytest.fixture(scope="module")
def boosted_bundle(tmp_path_factory) -> Bundle:
    from d2s_onnx_export.export import export_bundle

    return export_bundle(
        "tiny-blip", tmp_path_factory.mktemp("typed") / "boosted", query_word_boost=BOOST
    ).bundle


@pytest.fixture(scope="module")
def old_graph_bundle(tmp_path_factory) -> Bundle:
    """The same bundle as a version that boosted every input token made it: its text graph adds
    the boost at fragments too, and its manifest does not say which tokens it boosts."""
    import d2s_onnx_export.export as export

    class EveryToken(export.TextGraph):
        def __init__(self, tower, head, tokenizer=None) -> None:
            super().__init__(tower, head, None)

    mp = pytest.MonkeyPatch()
    mp.setattr(export, "TextGraph", EveryToken)
    try:
        bundle = export.export_bundle(
            "tiny-blip", tmp_path_factory.mktemp("typed") / "old", query_word_boost=BOOST
        )
    finally:
        mp.undo()
    path = bundle.bundle.path
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["text"]["own_words"]
    manifest["fingerprint"] = compute_fingerprint(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return Bundle.load(path)


def _ids(bundle: Bundle, *tokens: str) -> list[int]:
    return [bundle.terms.index(t) for t in tokens]


def _plain(bundle: Bundle, dense: np.ndarray) -> np.ndarray:
    """The head's own output for a query's dense vector, no boost (the image side's head with
    no document shift: tiny-blip's untrained head has none)."""
    import torch
    from d2s_onnx_export.export import build_head
    from d2s_onnx_export.models import build_dense_encoder

    head = build_head(build_dense_encoder("tiny-blip"), None)
    with torch.no_grad():
        return head(torch.from_numpy(dense)).numpy()


def test_the_text_graph_boosts_whole_words_not_the_fragments_of_a_split_word(boosted_bundle):
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(boosted_bundle.path / "text.onnx"), providers=["CPUExecutionProvider"]
    )
    tokenizer = Encoder(boosted_bundle).tokenizer
    texts = [QUERY, "gi giraffe", "a giraffe"]
    ids, mask = tokenize_batch(tokenizer, texts, boosted_bundle.max_text_length)
    dense, sparse = session.run(["dense", "sparse"], {"input_ids": ids, "attention_mask": mask})
    plain = _plain(boosted_bundle, dense)
    gi, raf, fe, zebra = _ids(boosted_bundle, "gi", "##raf", "##fe", "zebra")
    boost = sparse - plain
    assert boost[0, zebra] == pytest.approx(BOOST, abs=1e-4)  # typed whole
    assert np.abs(boost[0, [gi, raf, fe]]).max() < 1e-4  # fragments of "giraffe": nothing added
    assert boost[1, gi] == pytest.approx(
        BOOST, abs=1e-4
    )  # typed whole once, a fragment once: one boost
    assert np.abs(boost[2, [gi, raf, fe]]).max() < 1e-4
    assert boosted_bundle.manifest["text"]["own_words"] == "whole words"


def test_a_graph_exported_before_has_the_fragments_boost_taken_off(
    boosted_bundle, old_graph_bundle
):
    new, old = Encoder(boosted_bundle), Encoder(old_graph_bundle)
    texts = [QUERY, "gi giraffe", "two dogs skateboarding"]
    fixed, corrected = new.encode_texts(texts), old.encode_texts(texts)
    np.testing.assert_allclose(corrected.sparse, fixed.sparse, atol=1e-5)
    # without the correction the old graph does boost them: the test is not vacuous
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(old_graph_bundle.path / "text.onnx"), providers=["CPUExecutionProvider"]
    )
    ids, mask = tokenize_batch(old.tokenizer, texts, old_graph_bundle.max_text_length)
    raw = session.run(["sparse"], {"input_ids": ids, "attention_mask": mask})[0]
    (gi,) = _ids(old_graph_bundle, "gi")
    assert raw[0, gi] - fixed.sparse[0, gi] == pytest.approx(BOOST, abs=1e-4)


def test_typed_words_are_whole_words_and_an_unknown_word_gets_a_note(
    boosted_bundle, image_folder, tmp_path, capsys
):
    from d2s_search.search import SearchResult, encode_text_query

    vectors = encode_text_query(Encoder(boosted_bundle), QUERY)
    assert vectors.typed == {"zebra"} and "gi" not in vectors.own and "zebra" in vectors.own
    assert vectors.unrecognised == ["giraffe"] and not vectors.weak
    result = SearchResult(
        mode="sparse", hits=[], took_ms=0.0, unrecognised_words=vectors.unrecognised
    )
    assert result.notice == (
        "The model does not know the word 'giraffe': the results match the query's other "
        "words, not it. Try another word for it."
    )
    index = tmp_path / "idx"
    code, _, err = run_cli(
        ["ingest", image_folder / "b", "--bundle", boosted_bundle.path, "--index", index, "--json"],
        capsys,
    )
    assert code == 0, err
    code, out, err = run_cli(["query", QUERY, "--index", index, "--no-serve"], capsys)
    assert code == 0 and out
    assert err.splitlines()[0] == f"note: {result.notice}"
    code, out, err = run_cli(["query", "zebra", "--index", index, "--no-serve"], capsys)
    assert code == 0 and "note:" not in err


def test_evaluation_boosts_what_the_graph_boosts(boosted_bundle):
    """``evaluate --data`` and training's validation add the boost at the typed words the
    graph adds it at: the graph's output and their model of it agree."""
    import scipy.sparse as sp

    from d2s_search.evaluate import boost_own_words
    from d2s_search.train.vocab import load_tokenizer, tokenize_captions

    captions = [QUERY, "a giraffe eating leaves", "skateboarding dogs on a ramp", "gi giraffe"]
    encoder = Encoder(boosted_bundle)
    graph = encoder.encode_texts(captions)
    tokens = tokenize_captions(captions, load_tokenizer(boosted_bundle.path))
    typed = tokens.boosted()
    assert tokens.typed is not None and typed.row(1).size < tokens.row(1).size
    modelled = boost_own_words(
        sp.csr_matrix(_plain(boosted_bundle, graph.dense)),
        [typed.row(i) for i in range(len(typed))],
        encoder.bundle.allowed_mask,
        BOOST,
    )
    np.testing.assert_allclose(modelled.toarray(), graph.sparse, atol=1e-4)
    assert tokens.subset([1, 3]).typed.row(0).tolist() == typed.row(1).tolist()
