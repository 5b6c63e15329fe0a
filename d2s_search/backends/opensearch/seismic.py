"""The SEISMIC sparse index (OpenSearch 3.3+, neural-search): ``index create --sparse-index seismic``.

What it is (opensearch-project/neural-search 3.3.0.0, ``sparse/mapper/SparseVectorFieldMapper``,
``sparse/algorithm/seismic/Seismic``, ``sparse/query/SparseAnnQueryBuilder``): a
``sparse_vector`` field whose keys must be non-negative integers ("fields should be valid
integer"), in an index with ``index.sparse: true``. Per segment past
``approximate_threshold`` documents it prunes each term's posting list to its
``n_postings`` strongest documents, clusters them (``cluster_ratio``) and keeps a pruned
summary per cluster (``summary_prune_ratio``); a query keeps its ``top_n`` strongest tokens,
visits the clusters whose summaries score well (``heap_factor``) and returns ``k`` hits per
shard. Below the threshold a segment is scored exactly.

Trade-offs against the default ``rank_features`` plan (exact ``rank_feature`` sums):

* much faster and flatter latency for collections past a few million images, where exact
  sparse scoring touches every posting of every query term;
* approximate: recall below 1 (raise ``top_n``/``heap_factor`` to buy it back), and scores
  are computed on 8-bit quantized weights (document weights above
  ``quantization_ceiling_ingest``, 3.0 by default, are clipped), so ``Hit.score`` is not the
  exact dot product (matched terms still are, from the stored weights);
* keys are vocabulary ids, so the index needs the bundle's vocabulary: it is stored once in
  the side index ``<name>-vocabulary`` when the index is created and read back on open;
* no two-phase plan, no ``query --server-side`` with a registered model (the model emits
  words, the field wants ids), no ``index reindex`` yet;
* the segment-level structures live in memory (neural-search's sparse caches): size the heap.

Dense vectors live in a sibling index, ``<name>-dense``. A SEISMIC index needs
``index.sparse: true``, which makes neural-search supply the index's codec service factory
(neural-search 3.3.0.0 ``plugin/NeuralSearch.java``); a ``knn_vector`` with an HNSW method
needs ``index.knn: true``, which makes k-NN supply one too (k-NN 3.3.0.0
``plugin/KNNPlugin.java``), and core refuses a second factory for one index
(``index/engine/EngineConfigFactory.java``: "existing codec service factory already
overridden", OpenSearch#18466, neural-search#1335; the same in 3.8.0.0). Without ``index.knn``
k-NN refuses a method on the field ("Cannot set modelId or method parameters when index.knn
setting is false"). So the sibling holds the dense vector, path and URL of every document under
the same id: writes go to both, ``dense`` searches the sibling, and ``hybrid`` runs both searches
and fuses them here (min-max or RRF, the result names the fusion as ``client-minmax`` /
``client-rrf``), as for Elasticsearch without the RRF retriever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from d2s_search.backends.engine.documents import DENSE_FIELD
from d2s_search.backends.engine.narrowing import METADATA_KEYS
from d2s_search.backends.opensearch.features import FLOAT32_MAX, FLOAT32_MIN_NORMAL, as_float32
from d2s_search.errors import IndexStoreError

VOCABULARY_DOC = "vocabulary"


def vocabulary_index(index_name: str) -> str:
    return f"{index_name}-vocabulary"


def dense_index(index_name: str) -> str:
    """The sibling holding a SEISMIC index's dense vectors."""
    return f"{index_name}-dense"


def split_source(source: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A document's ``_source`` -> (the SEISMIC index's part, the dense sibling's part: the
    vector, what a hit shows, and the metadata a dense search is filtered by)."""
    main = {k: v for k, v in source.items() if k != DENSE_FIELD}
    sibling = {k: source[k] for k in (DENSE_FIELD, "path", "url", *METADATA_KEYS) if k in source}
    return main, sibling


def vocabulary_index_body(replicas: int = 0) -> dict[str, Any]:
    """One document holding the term list; nothing in it is indexed (``enabled: false``)."""
    return {"settings": {"index": {"number_of_shards": 1, "number_of_replicas": replicas}},
            "mappings": {"enabled": False}}


class Vocabulary:
    """Vocabulary terms <-> the integer keys of a ``sparse_vector`` field."""

    def __init__(self, terms: Sequence[str], fingerprint: str = "") -> None:
        self.terms = list(terms)
        self.fingerprint = fingerprint
        self.ids = {t: i for i, t in enumerate(self.terms)}
        if len(self.ids) != len(self.terms):
            raise IndexStoreError("the vocabulary has duplicate terms")

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "terms": self.terms}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Vocabulary:
        terms = doc.get("terms")
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
            raise IndexStoreError("the stored vocabulary is damaged (no list of terms)")
        return cls(terms, str(doc.get("fingerprint", "")))

    def to_ids(self, sparse: Mapping[str, float]) -> dict[str, float]:
        """``{term: weight}`` -> ``{"<id>": float32 weight}`` (positive normal float32 only)."""
        out: dict[str, float] = {}
        for term, weight in sparse.items():
            i = self.ids.get(term)
            w = float(weight)
            if i is None or not w > 0:  # also drops NaN
                continue
            w32 = as_float32(min(w, FLOAT32_MAX))
            if w32 >= FLOAT32_MIN_NORMAL:
                out[str(i)] = w32
        return out

    def from_ids(self, stored: Mapping[str, float] | None) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, weight in (stored or {}).items():
            if key.isdigit() and int(key) < len(self.terms):
                out[self.terms[int(key)]] = float(weight)
        return out
