"""Vocabulary terms <-> Elasticsearch feature keys, checked against Elasticsearch's own rules.

What Elasticsearch does with a feature name (read from elastic/elasticsearch, 8.x/9.x line):

- ``rank_features`` (modules/mapper-extras/src/main/java/org/elasticsearch/index/mapper/extras/
  RankFeaturesFieldMapper.java, ``parse``): any JSON key is accepted and indexed as a Lucene
  ``FeatureField`` term, dots included -- but the ``rank_feature`` query
  (modules/mapper-extras/.../RankFeatureQueryBuilder.java, ``doToQuery``) resolves
  ``"<field>.<feature>"`` by splitting at the *last* dot, so a key containing ``.`` can be
  stored yet never queried.
- ``sparse_vector`` (server/src/main/java/org/elasticsearch/index/mapper/vectors/
  SparseVectorFieldMapper.java, ``parse``): a key containing ``.`` fails the whole document with
  ``[sparse_vector] fields do not support dots in feature names but found [...]``.
- Both store values through ``FeatureField``, which refuses anything but positive normal float32
  numbers and keeps 9 significant bits.

So the OpenSearch escaping (``%`` -> ``%25``, ``.`` -> ``%2E``) is exactly right here too, and
is reused rather than copied: keys never contain a dot, and decoding is the same.
"""

from __future__ import annotations

from d2s_search.backends.opensearch.features import (
    FLOAT32_MAX,
    FLOAT32_MIN_NORMAL,
    as_float32,
    decode_features,
    escape_term,
    lucene_feature_value,
    matched_terms,
    prune,
    sendable_weights,
    unescape_term,
)

__all__ = [
    "FLOAT32_MAX", "FLOAT32_MIN_NORMAL", "as_float32", "check_feature_key", "decode_features", "escape_term",
    "lucene_feature_value", "matched_terms", "prune", "sendable_weights", "unescape_term",
]


def check_feature_key(key: str, field_type: str = "rank_features") -> str:
    """Raise ValueError for a key Elasticsearch would refuse (sparse_vector) or never match (rank_features)."""
    if not key:
        raise ValueError("empty feature name")
    if "." in key:
        if field_type == "sparse_vector":
            raise ValueError(f"[sparse_vector] fields do not support dots in feature names but found [{key}]")
        raise ValueError(f"feature name {key!r} contains '.', so a rank_feature query could never reach it")
    return key
