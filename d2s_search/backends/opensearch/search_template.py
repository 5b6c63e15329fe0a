"""The stored search template ``d2s-sparse``: the sparse query for clusters without ml-commons.

Without a model inside the cluster, text must be encoded by d2s-search; the template keeps
the query shape (``rank_feature`` clauses on ``sparse.<term>``, summed = the dot product)
in the cluster, so any client -- Dashboards Dev Tools included -- only sends term weights:

    GET d2s/_search/template
    {"id": "d2s-sparse", "params": {"size": 10, "features": [
        {"name": "dog", "weight": 1.2}, {"name": "car", "weight": 0.7, "last": true}]}}

Feature names are the stored keys (``.`` written ``%2E``, ``%`` written ``%25``); every item
but the last has no ``last`` (mustache has no "separator" syntax). Optional params:
``from`` (omit for 0), ``path_prefix`` (only paths under it), ``explain`` (also return the
stored ``sparse`` vector). ``mappings/search_templates/d2s-sparse.json`` is
:func:`put_template_body` (a test keeps them equal), for ``PUT _scripts/d2s-sparse``.
"""

from __future__ import annotations

from typing import Any

from d2s_search.backends.base import SparseVector
from d2s_search.backends.opensearch import queries as q
from d2s_search.errors import QueryError

TEMPLATE_ID = "d2s-sparse"

# One line of mustache; not JSON until rendered (the loop leaves commas between clauses).
TEMPLATE_SOURCE = (
    '{"size": {{size}}{{^size}}10{{/size}}, "from": {{from}}{{^from}}0{{/from}}, '
    '"track_total_hits": false, '
    '"_source": ["path", "url", "terms"{{#explain}}, "sparse"{{/explain}}], '
    '"query": {"bool": {"should": ['
    '{{#features}}{"rank_feature": {"field": "sparse.{{name}}", "linear": {}, "boost": {{weight}}}}'
    "{{^last}}, {{/last}}{{/features}}], "
    '"minimum_should_match": 1'
    '{{#path_prefix}}, "filter": [{"prefix": {"path": {"value": "{{path_prefix}}"}}}]{{/path_prefix}}'
    "}}}"
)


def put_template_body() -> dict[str, Any]:
    """Body of ``PUT _scripts/d2s-sparse``."""
    return {"script": {"lang": "mustache", "source": TEMPLATE_SOURCE}}


def template_params(
    query: SparseVector,
    k: int = 10,
    *,
    offset: int = 0,
    path_prefix: str | None = None,
    explain: bool = False,
    max_clauses: int = q.DEFAULT_MAX_CLAUSES,
) -> dict[str, Any]:
    """Mustache params for ``query`` (escaped, float32, pruned like the client-side plan)."""
    q.check_page(k, offset)
    weights = q.query_weights(query, q.clause_budget(max_clauses, 1 if path_prefix else 0))
    if not weights:
        raise QueryError("the query has no terms with a positive weight")
    features: list[dict[str, Any]] = [{"name": key, "weight": w} for key, w in weights.items()]
    features[-1]["last"] = True
    params: dict[str, Any] = {"size": int(k), "features": features}
    if offset:
        params["from"] = int(offset)  # omitted when 0: mustache may treat 0 as false
    if path_prefix:
        params["path_prefix"] = path_prefix
    if explain:
        params["explain"] = True
    return params


def search_template_body(query: SparseVector, k: int = 10, **options: Any) -> dict[str, Any]:
    """Body of ``POST <index>/_search/template``."""
    return {"id": TEMPLATE_ID, "params": template_params(query, k, **options)}
