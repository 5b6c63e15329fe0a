"""What the cluster is, and which request shapes its version accepts.

``GET /`` gives the version and distribution; the request bodies that differ between releases
are chosen here, each from the plugin source at the release tags named below (read from
GitHub, not guessed):

* hybrid ``pagination_depth`` -- opensearch-project/neural-search 2.19.0.0+,
  ``query/HybridQueryBuilder.java`` (``PAGINATION_DEPTH_FIELD``) and
  ``search/query/HybridCollectorManager.java`` (``getSubqueryResultsRetrievalSize``): without
  it each sub-query keeps only ``size`` hits per shard, and ``from > 0`` is refused
  ("pagination_depth param is missing"). 2.11.x's ``HybridQueryBuilder`` refuses the key
  ("[hybrid] query does not support [pagination_depth]"), so older clusters get ``from: 0,
  size: depth`` and the page is cut out here.
* RRF (``score-ranker-processor``) exists from 2.19.0.0. Its ``rank_constant`` is read from
  ``combination.parameters`` up to 3.0.0.0 (``processor/factory/RRFProcessorFactory.java``
  passes ``parameters`` to ``RRFNormalizationTechnique``; a top-level key is ignored and 60 is
  used, neural-search#1370) and from ``combination.rank_constant`` from 3.1.0.0 on,
  where ``parameters`` goes to ``RRFScoreCombinationTechnique``, whose only parameter is
  ``weights`` (``rank_constant`` there is refused).
* ``sparse_vector`` with the SEISMIC index: neural-search 3.3.0.0. Its codec service factory
  (``NeuralSearch.java``, when ``index.sparse``) and k-NN's (``KNNPlugin.java``, when
  ``index.knn``) cannot serve one index: core's ``EngineConfigFactory`` refuses the second
  ("existing codec service factory already overridden", OpenSearch#18466; still so in
  3.8.0.0), so a SEISMIC index holds no ``knn_vector`` (see ``seismic.py``).
* Lucene HNSW with ``innerproduct`` (``--engine lucene``): k-NN 2.13.0.0
  ``index/util/Lucene.java`` adds ``SpaceType.INNER_PRODUCT`` (2.11/2.12 offer L2 and cosine
  only, and refuse the mapping).
* ``neural_sparse`` with ``query_tokens``: neural-search 2.14.0.0
  ``query/NeuralSparseQueryBuilder.java`` (``QUERY_TOKENS_FIELD``); 2.11-2.13 refuse it
  ("[neural_sparse] unknown token [START_OBJECT] after [query_tokens]").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

Version = tuple[int, int, int]
NEWEST: Version = (99, 0, 0)  # assumed when the version cannot be read (e.g. Serverless)

HYBRID_PAGINATION_DEPTH: Version = (2, 19, 0)
RRF: Version = (2, 19, 0)
RRF_TOP_LEVEL_RANK_CONSTANT: Version = (3, 1, 0)
SPARSE_VECTOR_SEISMIC: Version = (3, 3, 0)
HYBRID_QUERY: Version = (2, 10, 0)
LUCENE_INNER_PRODUCT: Version = (2, 13, 0)
NEURAL_SPARSE_QUERY_TOKENS: Version = (2, 14, 0)

DISTRIBUTION_OPENSEARCH = "OpenSearch"
DISTRIBUTION_AWS = "Amazon OpenSearch Service"
DISTRIBUTION_SERVERLESS = "Amazon OpenSearch Serverless"
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> Version | None:
    m = _VERSION.match(str(text or "").strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def version_text(version: Version | None) -> str:
    if version is None or version == NEWEST:
        return "unknown"
    return ".".join(str(p) for p in version)


@dataclass(frozen=True)
class Dialect:
    """Request shapes for one cluster version (``NEWEST`` when unknown)."""

    version: Version = NEWEST

    @classmethod
    def of(cls, version: str | Version | None) -> Dialect:
        parsed = parse_version(version) if isinstance(version, str) or version is None else version
        return cls(parsed or NEWEST)

    @property
    def hybrid(self) -> bool:
        return self.version >= HYBRID_QUERY

    @property
    def pagination_depth(self) -> bool:
        return self.version >= HYBRID_PAGINATION_DEPTH

    @property
    def rrf(self) -> bool:
        return self.version >= RRF

    @property
    def rrf_rank_constant_top_level(self) -> bool:
        return self.version >= RRF_TOP_LEVEL_RANK_CONSTANT

    @property
    def sparse_vector(self) -> bool:
        return self.version >= SPARSE_VECTOR_SEISMIC

    @property
    def lucene_inner_product(self) -> bool:
        return self.version >= LUCENE_INNER_PRODUCT

    @property
    def neural_sparse_tokens(self) -> bool:
        return self.version >= NEURAL_SPARSE_QUERY_TOKENS


@dataclass
class ClusterInfo:
    """``GET /`` of the cluster plus what the URL says about where it runs."""

    version: Version | None = None
    distribution: str = DISTRIBUTION_OPENSEARCH
    cluster_name: str = ""
    raw_distribution: str = ""
    build_type: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dialect(self) -> Dialect:
        return Dialect(self.version or NEWEST)

    def to_json(self) -> dict[str, Any]:
        return {"version": version_text(self.version), "distribution": self.distribution,
                "cluster_name": self.cluster_name}


def distribution_for(url: str, service: str | None = None) -> str:
    """Amazon's endpoints are told apart by host name (``*.es.amazonaws.com``, ``*.aoss...``)."""
    host = (urlsplit(url).hostname or "").lower()
    if service == "aoss" or host.endswith(".aoss.amazonaws.com"):
        return DISTRIBUTION_SERVERLESS
    if service == "es" or host.endswith((".es.amazonaws.com", ".es.amazonaws.com.cn")):
        return DISTRIBUTION_AWS
    return DISTRIBUTION_OPENSEARCH


def cluster_info(root: Any, url: str, service: str | None = None) -> ClusterInfo:
    """Parse the body of ``GET /`` (or {} when it could not be read: Serverless has no ``GET /``)."""
    info = ClusterInfo(distribution=distribution_for(url, service))
    if not isinstance(root, dict):
        return info
    version = root.get("version") or {}
    info.cluster_name = str(root.get("cluster_name", ""))
    info.raw_distribution = str(version.get("distribution", ""))
    info.build_type = str(version.get("build_type", ""))
    number = parse_version(version.get("number"))
    # A domain in Elasticsearch-compatibility mode (override_main_response_version) reports
    # 7.10.2; OpenSearch itself is numbered 1.x-3.x, so a 7 says nothing about the release.
    if number and number[0] >= 7:
        info.extra["compatibility_mode"] = True
        number = None
    info.version = number
    return info
