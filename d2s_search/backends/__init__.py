"""Index backends behind one protocol (``base.Backend``): ``local`` (embedded), ``opensearch/`` and
``elasticsearch/``; ``engine/`` holds what the two search engines share (bodies, bulk, saved objects).
Runtime code: imports d2s_search's core modules (errors, base types), never torch or the CLI.
"""

from __future__ import annotations

from .base import Backend, Document, Hit, IndexIdentity, SparseVector

__all__ = ["Backend", "Document", "Hit", "IndexIdentity", "SparseVector", "open_backend", "BACKENDS"]

BACKENDS = ("local", "opensearch", "elasticsearch")


def open_backend(kind: str = "local", **options) -> Backend:
    """Construct (not yet open) a backend by name.

    local:      index=PATH (folder of the embedded index), threads=N
    opensearch: url=URL, index_name=NAME, user/password/api_key/ca_file/verify
    elasticsearch: url=URL or cloud_id=ID, index_name=NAME, user/password/api_key/ca_file/verify
    """
    if kind == "local":
        from .local import LocalBackend

        return LocalBackend(options["index"], threads=options.get("threads", 1))
    if kind in ("opensearch", "elasticsearch"):
        from d2s_search.extras import require

        require(kind, who=f"the {kind} backend")  # the client is an extra of the same name
    if kind == "opensearch":
        from d2s_search.backends.opensearch.backend import OpenSearchBackend

        return OpenSearchBackend(**{k: v for k, v in options.items() if k not in ("index", "threads")})
    if kind == "elasticsearch":
        from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend

        return ElasticsearchBackend(**{k: v for k, v in options.items() if k not in ("index", "threads")})
    from ..errors import QueryError

    raise QueryError(f"unknown backend {kind!r}: use one of {', '.join(BACKENDS)}")
