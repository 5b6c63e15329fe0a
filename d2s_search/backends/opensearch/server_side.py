"""Search with the encoder inside the cluster (``d2s-search query --server-side``).

* :func:`server_side_query`: ``neural_sparse`` with ``query_text`` + ``model_id``; OpenSearch
  runs the model registered by ``register-model`` and scores the ``rank_features`` field.
* :func:`template_query`: for clusters without ml-commons, the stored template ``d2s-sparse``
  with term weights encoded by d2s-search.
* :func:`run_server_side`: the first when the bundle's model is deployed, else the second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from d2s_search.backends.base import Hit, SparseVector
from d2s_search.backends.engine.documents import shown_path
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.client import OpenSearchHTTP
from d2s_search.backends.opensearch.features import decode_features, matched_terms
from d2s_search.backends.opensearch.ml_commons import DEPLOYED, MLCommons, MLCommonsUnavailable
from d2s_search.backends.opensearch.search_template import TEMPLATE_ID, search_template_body
from d2s_search.errors import QueryError
from d2s_search.search import SearchResult, collapse_matches, explain_depth

log = logging.getLogger("d2s_search.server_side")


# -- request bodies -----------------------------------------------------------------------


def neural_sparse_query(text: str, model_id: str, filters: q.Filters = q.NO_FILTERS) -> dict[str, Any]:
    if not text.strip():
        raise QueryError("the query text is empty")
    scoring = {"neural_sparse": {q.SPARSE_FIELD: {"query_text": text, "model_id": model_id}}}
    clauses = filters.clauses()
    return {"bool": {"must": [scoring], "filter": clauses}} if clauses else scoring


def server_side_body(text: str, model_id: str, k: int = 10, *, offset: int = 0,
                     path_prefix: str | None = None) -> dict[str, Any]:
    return q.search_body(neural_sparse_query(text, model_id, q.Filters(path_prefix)), k, offset)


# -- searching ------------------------------------------------------------------------------


def resolve_model_id(http: OpenSearchHTTP, bundle: Any) -> str | None:
    """The deployed model registered for ``bundle`` (by name), if any; None without ml-commons,
    or when this user may not search the model index (403: the search template still works)."""
    from d2s_search.backends.opensearch.ml_package import model_name

    try:
        found = MLCommons(http).find_model(model_name(bundle))
    except MLCommonsUnavailable as exc:
        log.info("no model lookup: %s", exc)
        return None
    return found[0] if found and found[1] in DEPLOYED else None


def server_side_query(
    backend: Any,
    text: str,
    model_id: str,
    k: int = 10,
    explain: int = 5,
    *,
    offset: int = 0,
    path_prefix: str | None = None,
) -> list[Hit]:
    """Search ``backend`` (an OpenSearchBackend) with ``neural_sparse``: the cluster encodes ``text``.

    Matched terms (``explain``) need the query's tokens: one extra ``_predict`` call asks the
    same model for them, so they are exactly what the cluster scored with.
    """
    return _server_side(backend, text, model_id, k, explain, offset, path_prefix)[0]


def _server_side(backend: Any, text: str, model_id: str, k: int, explain: int, offset: int = 0,
                 path_prefix: str | None = None) -> tuple[list[Hit], dict[str, float]]:
    body = server_side_body(text, model_id, k, offset=offset, path_prefix=path_prefix)
    backend.settle()
    reply = backend.http.request("POST", f"/{backend.index_name}/_search", json_body=body)
    if not reply.ok:
        reason = reply.error_reason()
        if "neural_sparse" in reason and ("unknown" in reason or "no [query]" in reason):
            raise MLCommonsUnavailable(f"{backend.url} has no neural-search plugin: {reason}")
        raise QueryError(f"server-side search failed: {reason}{_model_hint(reason, model_id)}")
    query_terms = MLCommons(backend.http).predict(model_id, [text])[0] if explain > 0 else {}
    hits = _hits(reply.body.get("hits", {}).get("hits", []), query_terms, explain_depth(query_terms, explain))
    collapse_matches(hits, explain, query_terms)
    return hits, query_terms


def template_query(
    backend: Any,
    query: SparseVector,
    k: int = 10,
    explain: int = 5,
    *,
    offset: int = 0,
    path_prefix: str | None = None,
) -> list[Hit]:
    """Search with the stored template ``d2s-sparse`` and weights encoded by the client."""
    backend.settle()
    body = search_template_body(query, k, offset=offset, path_prefix=path_prefix, explain=explain > 0,
                                max_clauses=backend.max_clauses())
    reply = backend.http.request("POST", f"/{backend.index_name}/_search/template", json_body=body)
    if not reply.ok:
        reason = reply.error_reason()
        hint = " (store it with `d2s-search register-model --template-only`)" if TEMPLATE_ID in reason else ""
        raise QueryError(f"template search failed: {reason}{hint}")
    return _hits(reply.body.get("hits", {}).get("hits", []), query, explain)


def run_server_side(
    backend: Any,
    text: str,
    *,
    k: int = 10,
    explain: int = 5,
    model_id: str | None = None,
    bundle: Any = None,
    encoder_factory: Callable[[], Any] | None = None,
    max_terms: int | None = None,
) -> SearchResult:
    """``query --server-side``: neural_sparse with the bundle's model, else the stored template.

    The model is ``model_id`` or the deployed one registered for ``bundle``. Without one, the
    text is encoded here (``encoder_factory`` is only called then) and sent as template params,
    keeping its ``max_terms`` strongest terms (all by default; the cluster's clause limit applies).
    """
    from d2s_search.search import encode_text_query

    start = time.perf_counter()
    if model_id is None and bundle is not None:
        model_id = resolve_model_id(backend.http, bundle)
    if model_id:
        hits, query_terms = _server_side(backend, text, model_id, k, explain)
        took = (time.perf_counter() - start) * 1000
        top = sorted(query_terms.items(), key=lambda tw: (-tw[1], tw[0]))[:50]
        return SearchResult(mode="server-side (neural_sparse)", hits=hits, took_ms=took, query_terms=top)
    if encoder_factory is None:
        raise QueryError("no deployed model for this bundle: run `d2s-search register-model` or pass --model-id")
    log.warning("no deployed model for this bundle; using the search template %s", TEMPLATE_ID)
    vectors = encode_text_query(encoder_factory(), text, top_k=max_terms)
    start = time.perf_counter()
    hits = template_query(backend, vectors.full, k, explain_depth(vectors.full, explain))
    collapse_matches(hits, explain, vectors.full)
    took = (time.perf_counter() - start) * 1000
    top = sorted(vectors.full.items(), key=lambda tw: (-tw[1], tw[0]))[:50]
    return SearchResult(mode="server-side (search template)", hits=hits, took_ms=took, query_terms=top)


def _model_hint(reason: str, model_id: str) -> str:
    if "not deployed" in reason.lower() or "model not ready" in reason.lower():
        return f" (model {model_id} is not deployed: run `d2s-search register-model`)"
    return ""


def _hits(raw: list[Mapping[str, Any]], query: Mapping[str, float], explain: int) -> list[Hit]:
    hits = []
    for h in raw:
        src = h.get("_source", {})
        hits.append(Hit(
            id=str(h["_id"]),
            score=float(np.float32(h.get("_score") or 0.0)),  # _score is a float32
            path=shown_path(src.get("path")),
            url=src.get("url"),
            matched=matched_terms(query, decode_features(src.get(q.SPARSE_FIELD)), explain) if explain else [],
        ))
    return hits
