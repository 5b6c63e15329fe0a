"""The search page and its JSON API as an ASGI app to mount in one's own FastAPI or Starlette
app; `d2s-search serve` serves the same app."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import extras
from ..index_access import (
    bundle_for_index,
    index_location,
    make_backend,
    recorded_identity,
    require_index,
)
from .index import backend_for

if TYPE_CHECKING:
    from fastapi import FastAPI


def search_app(path: str | os.PathLike = "d2s-index", *, url: str | None = None, backend: str | None = None,
               index_name: str = "d2s", bundle: str | os.PathLike | None = None, device: str = "auto",
               search_threads: int = 0, thumbnail_dir: str | os.PathLike | None = None,
               allowed_hosts: Sequence[str] | None = None) -> FastAPI:
    """The search page (at the app's root), its JSON API (``api/``) and OpenAPI docs
    (``docs``) over the index that :meth:`Index.open <d2s_search.Index.open>` with the same
    arguments would open. Needs the ``serve`` extra.

    The index opens and the models load at the app's startup, or at its first request when
    it is mounted inside another app (Starlette runs no startup of mounted apps). Every page
    URL is relative, so it works under any prefix (``app.mount("/photos", search_app(...))``).
    ``allowed_hosts``: host names it answers to (others get 400), against DNS rebinding."""
    extras.require("serve", who="d2s_search.search_app")
    kind = backend_for(backend, url)
    return app_for(kind, os.fspath(path), url, index_name, os.fspath(bundle) if bundle else None, device=device,
                   search_threads=search_threads, thumbnail_dir=thumbnail_dir, allowed_hosts=allowed_hosts)


def app_for(backend: str | None, index: str, url: str | None, index_name: str, bundle: str | None, *, device: str,
            search_threads: int, thumbnail_dir=None, allowed_hosts: Sequence[str] | None = None) -> FastAPI:
    """The app over the index these settings name, with the bundle that filled it; the index is
    constructed, not opened (the app opens it on its worker thread). Shared with `serve`."""
    from ..serve import create_app

    store = make_backend(backend, index, url, index_name, search_threads)
    require_index(store)
    chosen = bundle_for_index(bundle, recorded_identity(backend, index, url, index_name), index_location(store))
    return create_app(chosen, store, device=device, thumbnail_dir=thumbnail_dir, allowed_hosts=allowed_hosts)
