"""The JSON API under /api/: search by text, by picture, by a stored document; documents,
their pictures, and the index status. Handlers only translate HTTP <-> service calls."""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import APIRouter, Depends, File, Path, Query, Request, Response, UploadFile
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from ..images import QUERY_MAX_BYTES, QUERY_MAX_PIXELS, decode
from ..search import SearchOptions
from . import discovery, schemas
from .problems import BadRequest
from .service import DocumentNotFound, FilterParams, SearchService
from .thumbnails import DOC_ID, PictureCache

K_MAX = 200  # results per page: a grid of pictures, not a bulk export (the CLI has no limit)
FILTER_VALUES_MAX = 50  # folder= and where= values per request
FACET_SIZE_MAX = 200
OFFSET_MAX = 10_000_000
QUERY_MAX_CHARS = 1000
UPLOAD_MAX_BYTES = QUERY_MAX_BYTES  # the caps of query --image URL too
UPLOAD_MAX_PIXELS = QUERY_MAX_PIXELS  # a query picture is shrunk to the model's input anyway
MULTIPART_OVERHEAD = 64 * 1024  # form boundaries and part headers around the picture
DECODE_SLOTS = 2  # query pictures decoded at the same time (each may need one full-size copy)
PICTURE_CACHE_HEADERS = {"Cache-Control": "public, max-age=31536000, immutable"}  # ids are content hashes

ERRORS = {
    400: {"model": schemas.Problem, "description": "Bad parameter (the message names it)"},
    404: {"model": schemas.Problem, "description": "Unknown document id"},
    503: {"model": schemas.Problem, "description": "The index or cluster cannot be reached"},
}

router = APIRouter(prefix="/api", responses={400: ERRORS[400], 503: ERRORS[503]})


def service(request: Request) -> SearchService:
    return request.app.state.service


def pictures(request: Request) -> PictureCache:
    return request.app.state.pictures


def search_options(
    mode: Annotated[schemas.Mode, Query(description="sparse: all query words; two-phase: own words, then "
                                        "rescored with expansion words; dense: kNN; hybrid: both fused")] = "sparse",
    k: Annotated[int, Query(ge=1, le=K_MAX, description="Number of results")] = 10,
    fusion: Annotated[schemas.Fusion, Query(description="Hybrid fusion: weighted min-max or RRF")] = "minmax",
    alpha: Annotated[float, Query(ge=0, le=1, description="Weight of the dense run in min-max fusion")] = 0.5,
    window: Annotated[int | None, Query(ge=1, le=10_000, description="Candidates rescored (two-phase) or "
                                        "fused (hybrid); default two-phase max(100, 10k), hybrid max(100, min(10k, k + max(k, 1000)))")] = None,
    explain: Annotated[int, Query(ge=0, le=50, description="Matched words shown per result")] = 8,
) -> SearchOptions:
    return SearchOptions(mode=mode, k=k, fusion=fusion, alpha=alpha, window=window, explain=explain)


def filter_params(
    after: Annotated[str | None, Query(max_length=64, description="Taken at or after this date: YYYY-MM-DD (its "
                                       "midnight, UTC) or YYYY-MM-DDTHH:MM[:SS][zone]")] = None,
    before: Annotated[str | None, Query(max_length=64, description="Taken before this date (same forms): "
                                        "after=2019-06-01&before=2019-07-01 is June")] = None,
    folder: Annotated[list[str], Query(description="Only pictures with a path under this folder, absolute as the "
                                       "index stores it (repeat for any of several)")] = [],  # noqa: B006
    where: Annotated[list[str], Query(description="A field condition: field=value, field!=value, or field>=, >, "
                                      "<=, < a number or date (repeat: all hold; the = of one field are any of "
                                      "them). Fields: /api/facets 'types'")] = [],  # noqa: B006
    near: Annotated[str | None, Query(max_length=100, description="LAT,LON,KM: within KM kilometres of the "
                                      "point (pictures with a GPS position)")] = None,
) -> FilterParams:
    for name, values in (("folder", folder), ("where", where)):
        if len(values) > FILTER_VALUES_MAX:
            raise BadRequest(f"{name}: at most {FILTER_VALUES_MAX} values", field=name)
        if any(len(v) > 4096 for v in values):
            raise BadRequest(f"{name}: a value is over 4096 characters", field=name)
    return FilterParams(after=after or None, before=before or None, folders=tuple(f for f in folder if f),
                        where=tuple(w for w in where if w), near=near or None)


def document_id(doc_id: Annotated[str, Path(description="The document id: SHA-256 of the image file, 64 hex digits")]) -> str:
    doc_id = doc_id.strip().lower()
    if not DOC_ID.match(doc_id):
        raise BadRequest("not a document id: ids are the 64 hex digits of the image file's SHA-256", field="doc_id")
    return doc_id


def mounted_at(request: Request) -> str:
    """The path the app is mounted at inside another app ("" when it is the server's root):
    the picture URLs in answers start with it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


Service = Annotated[SearchService, Depends(service)]
Options = Annotated[SearchOptions, Depends(search_options)]
Narrowed = Annotated[FilterParams, Depends(filter_params)]
DocId = Annotated[str, Depends(document_id)]


@router.get("/search", response_model=schemas.SearchResponse, summary="Search by text")
async def search_text(
    request: Request,
    svc: Service,
    options: Options,
    q: Annotated[str, Query(max_length=QUERY_MAX_CHARS, description="What to look for, in words")],
    narrowed: Narrowed,
) -> schemas.SearchResponse | Response:
    options.filters = await svc.run(svc.narrowing, narrowed)
    searched = await svc.run(svc.search_text, q, options)
    answer = schemas.search_response(searched, schemas.QueryInfo(kind="text", text=q), options.k, mounted_at(request))
    return _proven(request, answer) or answer


def _proven(request: Request, answer: schemas.SearchResponse) -> Response | None:
    """The answer with the proof `d2s-search query` asks for (see serve/discovery.py), or None
    when none was asked for or this serve is not announced. The body is serialised here so
    that the proof covers exactly the bytes sent."""
    nonce = request.headers.get(discovery.CHALLENGE_HEADER)
    token = getattr(request.app.state, "serve_token", None)
    index_id = getattr(request.app.state, "serve_index_id", None)
    if nonce is None or not token or not index_id or not discovery.valid_nonce(nonce):
        return None
    body = answer.model_dump_json().encode("utf-8")
    proof = discovery.answer_proof(token, nonce, index_id, _request_target(request), body)
    return Response(body, media_type="application/json",
                    headers={discovery.INDEX_HEADER: index_id, discovery.PROOF_HEADER: proof})


def _request_target(request: Request) -> bytes:
    """The path and query string as the client sent them (what its proof covers)."""
    path = request.scope.get("raw_path") or request.scope["path"].encode("utf-8")
    query = request.scope.get("query_string") or b""
    return path + b"?" + query if query else path


@router.post("/search/image", response_model=schemas.SearchResponse, summary="Search by an uploaded picture",
             responses={413: {"model": schemas.Problem}, 415: {"model": schemas.Problem}})
async def search_image(
    request: Request,
    svc: Service,
    options: Options,
    image: Annotated[UploadFile, File(description="A JPEG, PNG, WebP, GIF, BMP or TIFF picture")],
    narrowed: Narrowed,
) -> schemas.SearchResponse:
    options.filters = await svc.run(svc.narrowing, narrowed)  # a bad filter is refused before the upload is read
    data = await image.read(UPLOAD_MAX_BYTES + 1)
    if len(data) > UPLOAD_MAX_BYTES:
        raise BadRequest(f"the picture is over {UPLOAD_MAX_BYTES // 2**20} MiB; send a smaller one", 413, "image")
    if not data:
        raise BadRequest("the uploaded file is empty", field="image")
    # Decode at about twice the model's input: JPEG by draft, others shrunk right after decoding.
    budget = int(svc.bundle.image_settings["size"]) * 2
    async with request.app.state.decode_slots:
        picture, _, _ = await run_in_threadpool(decode, data, UPLOAD_MAX_PIXELS, budget, budget)  # ImageRejected -> 415
    searched = await svc.run(svc.search_image, picture, options)
    return schemas.search_response(searched, schemas.QueryInfo(kind="image", filename=image.filename), options.k,
                                   mounted_at(request))


@router.get("/documents/{doc_id}/similar", response_model=schemas.SearchResponse, summary="More like this",
            responses={404: ERRORS[404]})
async def similar(request: Request, svc: Service, options: Options, doc_id: DocId,
                  narrowed: Narrowed) -> schemas.SearchResponse:
    """Search with a stored document's own sparse and dense vectors; the document itself is left out."""
    options.filters = await svc.run(svc.narrowing, narrowed)
    doc, searched = await svc.run(svc.similar, doc_id, options)
    info = schemas.QueryInfo(kind="document", id=doc.id, filename=os.path.basename(doc.path) or None)
    return schemas.search_response(searched, info, options.k, mounted_at(request))


@router.get("/library", response_model=schemas.SearchResponse, summary="The pictures, most recently taken first")
async def library(
    request: Request,
    svc: Service,
    narrowed: Narrowed,
    k: Annotated[int, Query(ge=1, le=K_MAX, description="Number of pictures")] = 50,
    offset: Annotated[int, Query(ge=0, le=OFFSET_MAX, description="Pictures skipped (the next page)")] = 0,
) -> schemas.SearchResponse:
    """No query: the pictures passing the filters by the date they were taken, newest first
    (those without a date last). The answer has the shape of a search's, with
    ``query.kind = "library"``, ``mode = "library"`` and score 0."""
    searched = await svc.run(svc.library, k, offset, await svc.run(svc.narrowing, narrowed))
    return schemas.search_response(searched, schemas.QueryInfo(kind="library"), k, mounted_at(request),
                                   await svc.run(svc.taken, searched.result.hits), offset)


@router.get("/facets", response_model=schemas.Facets, summary="Counts by folder, camera and field")
async def facets(
    svc: Service,
    narrowed: Narrowed,
    size: Annotated[int, Query(ge=1, le=FACET_SIZE_MAX, description="Values listed per field, commonest first")] = 20,
) -> schemas.Facets:
    """How many pictures passing the filters are in each folder, by each camera and for each
    value of the keyword and boolean fields, with every field's type."""
    applied = await svc.run(svc.narrowing, narrowed)
    return schemas.facets(await svc.run(svc.facets, applied, size), applied)


@router.get("/documents/{doc_id}", response_model=schemas.DocumentDetail, summary="A document and its words",
            responses={404: ERRORS[404]})
async def document(request: Request, svc: Service, doc_id: DocId) -> schemas.DocumentDetail:
    doc = await svc.run(svc.document, doc_id)
    return schemas.document_detail(doc, mounted_at(request), await svc.run(svc.document_words, doc))


@router.get("/documents/{doc_id}/thumbnail", response_class=FileResponse, summary="Thumbnail (320 px JPEG)",
            responses={200: {"content": {"image/jpeg": {}}}, 404: ERRORS[404]})
async def thumbnail(svc: Service, cache: Annotated[PictureCache, Depends(pictures)], doc_id: DocId) -> FileResponse:
    return await _picture(svc, cache, doc_id, "thumbnail")


@router.get("/documents/{doc_id}/preview", response_class=FileResponse, summary="Larger picture (1024 px JPEG)",
            responses={200: {"content": {"image/jpeg": {}}}, 404: ERRORS[404]})
async def preview(svc: Service, cache: Annotated[PictureCache, Depends(pictures)], doc_id: DocId) -> FileResponse:
    return await _picture(svc, cache, doc_id, "preview")


@router.get("/documents/{doc_id}/original", response_class=FileResponse,
            summary="The whole picture at its full size (JPEG, re-encoded from the stored file)",
            responses={200: {"content": {"image/jpeg": {}}}, 404: ERRORS[404]})
async def original(svc: Service, cache: Annotated[PictureCache, Depends(pictures)], doc_id: DocId) -> FileResponse:
    return await _picture(svc, cache, doc_id, "original")


@router.get("/status", response_model=schemas.Status, summary="Index size, bundle, backend, last ingest")
async def status(svc: Service) -> schemas.Status:
    stats = await svc.run(svc.status)
    bundle = svc.bundle.summary()
    return schemas.Status(
        documents=stats.get("documents"), distinct_terms=stats.get("distinct_terms"),
        mean_terms_per_document=stats.get("mean_terms_per_document"),
        backend=str(stats.get("backend", svc.backend.name)), location=str(stats.get("location", "")),
        bundle=schemas.BundleInfo(**{k: bundle[k] for k in schemas.BundleInfo.model_fields if k in bundle}),
        created_at=stats.get("created_at"), last_ingest_at=stats.get("last_ingest_at"),
        disk_bytes=stats.get("disk_bytes"), modes=["sparse", "two-phase", "dense", "hybrid"],
        k_max=K_MAX, upload_max_bytes=UPLOAD_MAX_BYTES, filters=svc.can_filter,
    )


async def _picture(svc: SearchService, cache: PictureCache, doc_id: str, kind: str) -> FileResponse:
    path = cache.cached(doc_id, kind)
    if path is not None:
        # Cached pictures are still served only while their document is in the index.
        if not await svc.run(svc.backend.ids_present, [doc_id]):
            raise DocumentNotFound(f"no document with id {doc_id} in this index")
    else:  # first request: only a stored document gets a picture made
        doc = await svc.run(svc.document, doc_id)
        path = await run_in_threadpool(cache.make, doc, kind)
    return FileResponse(path, media_type="image/jpeg", headers=PICTURE_CACHE_HEADERS)

