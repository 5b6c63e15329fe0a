"""Vocabulary terms <-> OpenSearch ``rank_features`` keys, and the weights we may send.

Why escape: a ``rank_feature`` query names its feature as ``"<field>.<feature>"`` and
OpenSearch splits that string at the *last* dot, so a term containing ``.`` (``"."``,
``"..."``, ``"a.m."``) could be stored but never queried. We percent-escape exactly two
characters: ``%`` -> ``%25`` (so the scheme is reversible) and ``.`` -> ``%2E``. Everything else
(``##s``, punctuation, non-ASCII) is a valid Lucene term and stays as it is, so most keys read
as the words themselves in Dashboards.

Why filter weights: ``rank_features`` rejects values that are not positive *normal* float32
numbers (a whole document fails to index), and Lucene keeps only 9 significant bits anyway.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

import numpy as np

# Smallest positive normal float32; Lucene's FeatureField rejects anything below it.
FLOAT32_MIN_NORMAL = float(np.finfo(np.float32).tiny)
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Lucene's FeatureField.newLinearQuery (used by neural_sparse) accepts weights in (0, 64].
NEURAL_SPARSE_MAX_WEIGHT = 64.0

_UNESCAPE = re.compile("%(25|2E)")


def escape_term(term: str) -> str:
    """Vocabulary term -> rank_features key (no ``.`` inside, reversible)."""
    if not term:
        raise ValueError("empty vocabulary term")
    return term.replace("%", "%25").replace(".", "%2E")


def unescape_term(key: str) -> str:
    """rank_features key -> vocabulary term (inverse of :func:`escape_term`)."""
    if "%" not in key:  # nearly every key: no regex needed
        return key
    return _UNESCAPE.sub(lambda m: "%" if m.group(1) == "25" else ".", key)


def as_float32(weight: float) -> float:
    """The float32 value OpenSearch will parse, as a Python float whose repr round-trips exactly."""
    return float(np.float32(weight))


def sendable_weights(sparse: Mapping[str, float]) -> dict[str, float]:
    """Escaped keys -> float32 weights, dropping what OpenSearch would reject.

    Zero, negative, NaN and sub-normal weights are dropped (they carry no score); weights
    above float32 range are clipped to the largest float32.
    """
    if not sparse:
        return {}
    # the rules above on arrays: a picture's vector may hold thousands of terms
    values = np.fromiter(sparse.values(), dtype=np.float64, count=len(sparse))
    with np.errstate(invalid="ignore"):
        clipped = np.minimum(values, FLOAT32_MAX)  # inf clipped too; NaN stays NaN and is dropped below
    weights = clipped.astype(np.float32)
    keep = weights >= FLOAT32_MIN_NORMAL  # False for zero, negatives, NaN, -inf and sub-normals
    return dict(zip(map(escape_term, itertools.compress(sparse, keep.tolist())), weights[keep].tolist()))


def decode_features(stored: Mapping[str, float] | None) -> dict[str, float]:
    """A document's ``_source.sparse`` -> ``{term: weight}``."""
    return {unescape_term(k): float(v) for k, v in (stored or {}).items()}


def prune(weights: Mapping[str, float], max_terms: int) -> dict[str, float]:
    """Keep the ``max_terms`` largest weights (ties broken by key, so plans are deterministic)."""
    if max_terms <= 0:
        return {}
    if len(weights) <= max_terms:
        return dict(weights)
    ranked = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[:max_terms]
    return dict(ranked)


def lucene_feature_value(value: float) -> float:
    """The value Lucene's FeatureField scores with: float32 bits truncated to 9 significant bits.

    ``FeatureField`` indexes ``floatToIntBits(v) >>> 15`` as the term frequency and decodes it
    as ``intBitsToFloat(freq << 15)`` -- truncation, not rounding (relative error < 2^-8).
    """
    bits = np.array([value], dtype=np.float32).view(np.uint32)[0]
    return float(np.array([(bits >> np.uint32(15)) << np.uint32(15)], dtype=np.uint32).view(np.float32)[0])


def matched_terms(
    query: Mapping[str, float], doc: Mapping[str, float], n: int
) -> list[tuple[str, float]]:
    """(term, query_weight * doc_weight) for shared terms, largest first, at most ``n``."""
    if n <= 0:
        return []
    small, large = (query, doc) if len(query) <= len(doc) else (doc, query)
    pairs = [(t, float(query[t]) * float(doc[t])) for t in small if t in large]
    pairs = [(t, c) for t, c in pairs if c > 0]
    pairs.sort(key=lambda tc: (-tc[1], tc[0]))
    return pairs[:n]
