"""Errors as JSON: every failure becomes ``{"detail": "<one line>", "field": ...}`` with a
status a client can act on, instead of FastAPI's nested validation dumps or a bare 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import redact
from ..errors import (
    BackendUnavailableError,
    BundleMismatchError,
    D2SError,
    ImageRejected,
    IndexStoreError,
    QueryError,
)
from .service import DocumentNotFound, FilterRefused
from .thumbnails import PictureUnavailable

log = logging.getLogger("d2s_search.serve")


class BadRequest(Exception):
    """A request the API refuses, with its status (400 unless said otherwise)."""

    def __init__(self, detail: str, status: int = 400, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.field = status, field


def problem(status: int, detail: str, field: str | None = None) -> JSONResponse:
    # Details can quote a cluster's error text: never let a credential through.
    return JSONResponse({"detail": redact.scrub(detail), "field": field}, status_code=status)


def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    """'k: input should be less than or equal to 200' rather than a list of dicts."""
    messages, fields = [], []
    for err in exc.errors():
        name = str(err["loc"][-1]) if err.get("loc") else "request"
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "missing":
            msg = "missing: this parameter is required"
        messages.append(f"{name}: {msg[:1].lower()}{msg[1:]}")
        fields.append(name)
    return problem(400, "; ".join(messages) or "bad request", fields[0] if len(set(fields)) == 1 else None)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and detail == "Not Found":
            detail = "no such page or API endpoint (see /docs)"
        return problem(exc.status_code, detail)

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return problem(exc.status, str(exc), exc.field)

    @app.exception_handler(FilterRefused)
    async def filter_refused(_: Request, exc: FilterRefused) -> JSONResponse:
        return problem(400, str(exc), exc.field)

    @app.exception_handler(QueryError)
    async def query_error(_: Request, exc: QueryError) -> JSONResponse:
        return problem(400, str(exc))

    @app.exception_handler(ImageRejected)
    async def image_rejected(_: Request, exc: ImageRejected) -> JSONResponse:
        return problem(415, f"cannot search by this file: {exc}", "image")

    @app.exception_handler(DocumentNotFound)
    async def not_found(_: Request, exc: DocumentNotFound) -> JSONResponse:
        return problem(404, str(exc), "doc_id")

    @app.exception_handler(PictureUnavailable)
    async def no_picture(_: Request, exc: PictureUnavailable) -> JSONResponse:
        return problem(404, str(exc))

    @app.exception_handler(D2SError)
    async def d2s_error(_: Request, exc: D2SError) -> JSONResponse:
        # The index or cluster went away under a running server: say so, don't crash.
        unavailable = (BackendUnavailableError, IndexStoreError, BundleMismatchError)
        return problem(503 if isinstance(exc, unavailable) else 500, str(exc))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return problem(500, f"internal error ({exc.__class__.__name__}); the server log has the details")
