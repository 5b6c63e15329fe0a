"""Request bodies for 2.11, 2.19 and 3.1 clusters, each validated (strict) against the spec as
that release has it (``x-version-added``/``-removed`` applied, plus the cited overlay in
spec.py for what the spec does not record)."""

from __future__ import annotations

import jsonschema
import numpy as np
import pytest
from d2s_os_spec import OVERLAY, OpenSearchSpec

from d2s_search.backends.base import IndexIdentity
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.cluster import Dialect

IDENT = IndexIdentity("ab" * 16, 8, "synthetic")
QUERY = {"dog": 1.5, "##s": 0.25, "日本": 0.75}
VEC = np.linspace(-1, 1, 8).astype(np.float32)
VERSIONS = ("2.11.1", "2.19.1", "3.1.0")


@pytest.fixture(scope="module", params=VERSIONS)
def versioned(request):
    try:
        return request.param, OpenSearchSpec.load(strict=True, version=request.param)
    except FileNotFoundError as exc:
        pytest.skip(f"OpenSearch API spec not available: {exc}")


def bodies(version: str) -> dict[str, tuple[str, str, dict]]:
    d = Dialect.of(version)
    out = {
        "index": ("PUT", "/{index}", q.index_body(IDENT)),
        "sparse": ("POST", "/{index}/_search", q.sparse_search_body(QUERY, 10, filters=q.Filters("a/"))),
        "two-phase": ("POST", "/{index}/_search", q.two_phase_body({"dog": 1.0}, QUERY, 10, 100, offset=10)),
        "knn": ("POST", "/{index}/_search", q.knn_search_body(VEC, 10, offset=5, filters=q.Filters("x/"))),
        "hybrid page 1": ("POST", "/{index}/_search", q.hybrid_search_body(QUERY, VEC, 10, window=100, dialect=d)),
        "hybrid page 3": ("POST", "/{index}/_search",
                          q.hybrid_search_body(QUERY, VEC, 10, offset=20, filters=q.Filters("x/"), dialect=d)),
        "pipeline min_max": ("PUT", "/_search/pipeline/{id}", q.minmax_pipeline_body((0.3, 0.7))),
    }
    if d.rrf:
        out["pipeline rrf"] = ("PUT", "/_search/pipeline/{id}", q.rrf_pipeline_body(20, d))
    return out


def test_bodies_for_each_version_match_its_spec(versioned):
    version, spec = versioned
    for name, (method, path, body) in bodies(version).items():
        try:
            spec.validate(method, path, body)
        except jsonschema.ValidationError as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{version} {name}: {exc.message}")


def test_a_body_for_the_wrong_version_is_refused():
    new = OpenSearchSpec.load(strict=True, version="3.1.0")
    old = OpenSearchSpec.load(strict=True, version="2.19.1")
    oldest = OpenSearchSpec.load(strict=True, version="2.11.1")
    body_31 = q.rrf_pipeline_body(20, Dialect.of("3.1.0"))
    body_219 = q.rrf_pipeline_body(20, Dialect.of("2.19.1"))
    new.validate("PUT", "/_search/pipeline/{id}", body_31)
    old.validate("PUT", "/_search/pipeline/{id}", body_219)
    with pytest.raises(jsonschema.ValidationError):  # 2.19 ignores a top-level rank_constant
        old.validate("PUT", "/_search/pipeline/{id}", body_31)
    with pytest.raises(jsonschema.ValidationError):  # 3.1 refuses parameters.rank_constant
        new.validate("PUT", "/_search/pipeline/{id}", body_219)
    with pytest.raises(jsonschema.ValidationError):  # no score-ranker-processor before 2.19
        oldest.validate("PUT", "/_search/pipeline/{id}", body_219)
    deep = q.hybrid_search_body(QUERY, VEC, 10, offset=10, dialect=Dialect.of("2.19.1"))
    with pytest.raises(jsonschema.ValidationError):  # 2.11's hybrid query has no pagination_depth
        oldest.validate("POST", "/{index}/_search", deep)


def test_spec_overlay_is_needed():
    """Each overlay entry adds what the bare spec lacks (else it should be dropped)."""
    bare = OpenSearchSpec.load(strict=True, overlay=False)
    body_219 = q.rrf_pipeline_body(20, Dialect.of("2.19.1"))
    with pytest.raises(jsonschema.ValidationError):
        bare.validate("PUT", "/_search/pipeline/{id}", body_219)
    assert len(OVERLAY) >= 5
