"""The web app: ``create_app(bundle, backend)`` gives a FastAPI application serving the JSON
API under /api/, its OpenAPI docs at /docs, and the search page (static files) at /."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from ..backends.base import Backend
from ..bundle import Bundle
from ..encoder import Encoder
from . import api, problems
from .hosts import AllowedHosts
from .limits import BodyLimit
from .service import SearchService
from .thumbnails import PictureCache, default_cache_dir

STATIC = Path(__file__).parent / "static"


def create_app(
    bundle: Bundle,
    backend: Backend,
    *,
    encoder: Encoder | None = None,
    device: str = "auto",
    thumbnail_dir: str | Path | None = None,
    allowed_hosts: Sequence[str] | None = None,
    warm_up: bool = True,
) -> FastAPI:
    """Build the app. ``backend`` is constructed but not opened: the app opens it on its own
    worker thread (see :mod:`.service`), at startup or by ``app.state.service.start()``.

    ``allowed_hosts`` (e.g. ``["127.0.0.1", "localhost"]``) refuses requests for other
    host names, so a web page elsewhere cannot reach a server on localhost by DNS rebinding.
    """
    service = SearchService(bundle, backend, encoder=encoder, device=device)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start, warm_up)
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    app = FastAPI(
        title="d2s-search",
        summary="Text-to-image search on learned sparse vectors; every hit says which words matched.",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.pictures = PictureCache(Path(thumbnail_dir) if thumbnail_dir else default_cache_dir())
    # Decoding a query picture can take one full-size copy of it: a few at a time, not all at once.
    app.state.decode_slots = asyncio.Semaphore(api.DECODE_SLOTS)
    app.add_middleware(BodyLimit, max_bytes=api.UPLOAD_MAX_BYTES + api.MULTIPART_OVERHEAD)
    if allowed_hosts:
        app.add_middleware(AllowedHosts, allowed=list(allowed_hosts))
    problems.install(app)
    app.include_router(api.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("d2s-search")
    except PackageNotFoundError:
        return "0"
