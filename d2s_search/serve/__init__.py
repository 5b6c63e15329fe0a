"""Web serving: the search page with its JSON API (``app``) and the read-only image server.
Runtime only (FastAPI, ONNX Runtime, the backends): nothing here imports torch or the CLI.
"""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str):
    # FastAPI is an extra: ``serve.image_urls`` and ``serve.image_server`` must import without it.
    if name == "create_app":
        from d2s_search.serve.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
