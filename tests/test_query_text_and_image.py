"""Words and a picture searched together: the sparse query is exactly the sum of the two, the
dense one the normalised sum of the normalised two; the CLI shows what the sum came to."""

from __future__ import annotations

import json

import numpy as np
import pytest

from d2s_search.backends.local import LocalBackend
from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder
from d2s_search.images import load_image
from d2s_search.ingest import ingest
from d2s_search.search import (
    SearchOptions,
    combine_queries,
    encode_image_query,
    encode_text_query,
    run_query,
)
from d2s_search.terms import is_content_word
from tests.helpers import brute_force_dense, brute_force_sparse, run_cli, run_cli_json, write_image


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_blip_bundle, image_folder):
    bundle = Bundle.load(tiny_blip_bundle)
    encoder = Encoder(bundle, device="cpu")
    backend = LocalBackend(tmp_path_factory.mktemp("combined") / "idx")
    backend.open(bundle.identity())
    assert ingest([image_folder], encoder, backend, batch_size=16, top_k=64).stored == 40
    ids = [r[0] for r in backend._connect(False).execute("SELECT id FROM docs ORDER BY seq")]
    picture = write_image(tmp_path_factory.mktemp("query") / "q.jpg", seed=77)
    return encoder, backend, backend.get(ids), picture


def test_the_combined_sparse_vector_is_exactly_the_sum(setup):
    encoder, _, _, picture = setup
    text = encode_text_query(encoder, "at the beach")
    image = encode_image_query(encoder, load_image(picture).image)
    both = combine_queries(encode_text_query(encoder, "at the beach"), image)
    terms = set(text.full) | set(image.full)
    assert set(both.full) == terms and len(terms) > len(text.full)
    for term in terms:
        assert both.full[term] == text.full.get(term, 0.0) + image.full.get(term, 0.0)
    assert both.own == {t: both.full[t] for t in (*text.own, *image.own)}
    expected = text.dense / np.linalg.norm(text.dense) + image.dense / np.linalg.norm(image.dense)
    np.testing.assert_allclose(both.dense, expected / np.linalg.norm(expected), rtol=1e-6)
    assert np.linalg.norm(both.dense) == pytest.approx(1.0, abs=1e-6)
    assert both.recognised == text.recognised


def test_the_texts_edits_apply_to_the_pictures_part(setup):
    encoder, _, _, picture = setup
    image = encode_image_query(encoder, load_image(picture).image)
    words = [t for t in sorted(image.full, key=image.full.get) if is_content_word(t)]
    gone, weighed = words[-2:]  # two whole words the picture has
    text = encode_text_query(encoder, f"at the beach -{gone} {weighed}^3")
    both = combine_queries(text, image)
    assert gone not in both.full and both.words.excluded == (gone,)
    assert both.full[weighed] == text.full.get(weighed, 0.0) + image.full[weighed] * 3


@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_a_combined_search_equals_brute_force_over_the_sum(setup, mode):
    encoder, backend, docs, picture = setup
    both = combine_queries(encode_text_query(encoder, "a dog on the grass"),
                           encode_image_query(encoder, load_image(picture).image))
    hits = run_query(backend, both, SearchOptions(mode=mode, k=10)).hits
    reference = brute_force_sparse(docs, both.full) if mode == "sparse" else brute_force_dense(docs, both.dense)
    assert [h.id for h in hits] == [i for i, _ in reference[:10]]


def test_the_cli_searches_both_and_shows_the_words(tmp_path, capsys, setup, tiny_blip_bundle, image_folder):
    encoder, _, _, picture = setup
    index = str(tmp_path / "idx")
    assert run_cli(["ingest", str(image_folder), "--bundle", str(tiny_blip_bundle), "--index", index], capsys)[0] == 0
    code, out = run_cli_json(["query", "at the beach", "--image", str(picture), "--index", index, "--json"], capsys)
    assert code == 0
    both = combine_queries(encode_text_query(encoder, "at the beach"),
                           encode_image_query(encoder, load_image(picture).image))
    strongest = sorted(both.full.items(), key=lambda kv: (-kv[1], kv[0]))[:50]
    # the CLI's optimised text graph agrees with this process's to float32 rounding
    assert [t["term"] for t in out["query_terms"]] == [t for t, _ in strongest]
    assert [t["weight"] for t in out["query_terms"]] == pytest.approx([w for _, w in strongest], rel=1e-5)
    code, text, _ = run_cli(["query", "at the beach", "--image", str(picture), "--index", index], capsys)
    assert code == 0
    shown = ", ".join(f"{t['term']} {t['weight']:.2f}" for t in out["query_terms"][:8])
    assert f"query words (text + picture): {shown}" in text
    code, out, _ = run_cli(["query", "--index", index, "--json"], capsys)  # neither: the library
    assert code == 0 and json.loads(out)["mode"] == "library"
