"""The JSON shapes of the API (they also make the OpenAPI docs at /docs)."""

from __future__ import annotations

import os
import time
from typing import Literal

from pydantic import BaseModel, Field

from ..backends.base import Document, Hit
from ..filters import SearchFilter
from ..inflections import PictureWord as PictureWordEntry
from ..metadata import iso_time
from .service import Searched

Mode = Literal["sparse", "two-phase", "dense", "hybrid"]
AnswerMode = Literal["sparse", "two-phase", "dense", "hybrid", "library"]  # library: no query, newest first
Fusion = Literal["minmax", "rrf"]
FieldType = Literal["keyword", "number", "date", "boolean"]


class Problem(BaseModel):
    """Every 4xx/5xx answer: one line saying what is wrong and what to do."""

    detail: str = Field(examples=["the query is empty: type some words"])
    field: str | None = Field(None, description="The request parameter at fault, when there is one.")


class Term(BaseModel):
    term: str
    weight: float


class QueryTerm(Term):
    own: bool = Field(description="One of the words the query typed whole (not an expansion term, nor a "
                      "fragment of a word the vocabulary splits).")


class Match(BaseModel):
    term: str
    contribution: float = Field(description="query weight x document weight")


class WordMatch(BaseModel):
    word: str = Field(description="A word as shown: its strongest form in this match (dogs, dog).")
    contribution: float = Field(description="The sum of its forms' contributions: a result's words add up to its "
                                "sparse score.")
    terms: list[str] = Field(description="The vocabulary terms it stands for, strongest first.")


class QueryWord(BaseModel):
    word: str = Field(description="A word as shown: its strongest form in the query.")
    weight: float = Field(description="Its strongest form's weight.")
    own: bool = Field(description="One of its forms is a word the query typed whole.")
    terms: list[str] = Field(description="The vocabulary terms it stands for (among the 50 strongest), strongest first.")


class PictureWord(BaseModel):
    word: str = Field(description="A word as shown: its strongest form in the picture.")
    weight: float = Field(description="Its strongest form's weight.")
    idf: float | None = Field(description="log(N / df) of that form in this index; null where the index does not "
                              "count document frequencies (OpenSearch, Elasticsearch).")
    terms: list[str] = Field(description="The vocabulary terms it stands for, strongest first.")


class Result(BaseModel):
    rank: int
    id: str = Field(description="SHA-256 of the image file")
    score: float
    path: str
    name: str
    url: str | None = None
    matched: list[Match] = Field(description="The terms that contributed most, largest first.")
    words: list[WordMatch] = Field(default_factory=list, description="The same with inflections collapsed (dog, "
                                   "dogs: one word), largest first: what the page shows.")
    parts: dict[str, float] | None = Field(None, description="Per-run scores of a fused (hybrid) hit.")
    taken: str | None = Field(None, description="The library: when the picture was taken (EXIF, else the file's "
                              "time), ISO 8601 UTC; null when unknown, and in searches.")
    thumbnail: str
    preview: str


class QueryInfo(BaseModel):
    kind: Literal["text", "image", "document", "library"] = Field(
        description="library: no query, the pictures most recently taken first.")
    text: str | None = None
    filename: str | None = None
    id: str | None = Field(None, description="The document a 'more like this' query started from.")


class WeightedTerm(BaseModel):
    term: str
    factor: float


class QueryEdits(BaseModel):
    required: list[str] = Field(description="+word: only pictures carrying these words.")
    excluded: list[str] = Field(description="-word: removed from the query; pictures carrying them left out.")
    weighted: list[WeightedTerm] = Field(description="word^N: these words' weights multiplied by N.")


class Condition(BaseModel):
    field: str
    op: Literal["=", "!=", ">=", "<=", ">", "<"]
    value: bool | float | str = Field(description="Typed by the field; a date as seconds since 1970, UTC (as "
                                      "`query --json` says it).")


class Position(BaseModel):
    lat: float
    lon: float


class Place(Position):
    km: float


class Filters(BaseModel):
    """The filter applied, as the server read it (dates in UTC, folders as the index stores paths)."""

    after: str | None = Field(None, description="Taken at or after (ISO 8601 UTC).")
    before: str | None = Field(None, description="Taken before (ISO 8601 UTC).")
    folders: list[str] = Field(default_factory=list, description="Any path under one of these.")
    where: list[Condition] = Field(default_factory=list, description="All hold; several = of one field: any of them.")
    near: Place | None = None
    description: str = Field(description="The filter in a line, e.g. 'taken from 2019-06-01, before 2019-07-01, camera = X'.")


class SearchResponse(BaseModel):
    query: QueryInfo
    mode: AnswerMode
    k: int
    encode_ms: float = Field(description="Time to encode the query (0 for 'more like this').")
    search_ms: float = Field(description="Time in the backend, fusion included.")
    fusion: str | None = Field(None, description="Hybrid only: who fused the runs, e.g. client-minmax.")
    query_terms: list[QueryTerm] = Field(description="The query's 50 strongest words.")
    query_words: list[QueryWord] = Field(default_factory=list, description="The same with inflections collapsed, "
                                         "strongest first: what the page shows.")
    weak_query: bool = Field(False, description="True when the model recognises none of the typed words: the results are guesses.")
    unrecognised_words: list[str] = Field(default_factory=list, description="Typed words the model's vocabulary does not know.")
    notice: str | None = Field(None, description="A sentence for the user when the query is weak or has a word "
                                "the model does not know.")
    query_edits: QueryEdits | None = Field(None, description="What -word, +word and word^N in the text asked for.")
    filters: Filters | None = Field(None, description="The filter the results passed (null: none).")
    offset: int | None = Field(None, description="The library: how many pictures came before these.")
    results: list[Result]


class FacetValue(BaseModel):
    value: str
    count: int


class Facets(BaseModel):
    fields: dict[str, list[FacetValue]] = Field(description="Pictures passing the filter by folder (a picture's own "
                                                "folder), camera and each keyword or boolean field, most first.")
    types: dict[str, FieldType] = Field(description="Every field a where= filter may name, with its type.")
    located: bool = Field(description="Whether any picture of the index has a GPS position (near= can find it).")
    filters: Filters | None = Field(None, description="The filter counted under (null: none).")


class DocumentDetail(BaseModel):
    id: str
    path: str
    name: str
    url: str | None = None
    width: int
    height: int
    size_bytes: int
    ingested_at: str | None
    term_count: int
    terms: list[Term] = Field(description="The document's whole sparse vector, strongest first.")
    words: list[PictureWord] = Field(default_factory=list, description="Its words with inflections collapsed, "
                                     "ordered by what they say about this picture: weight x IDF (by weight where "
                                     "idf is null).")
    taken: str | None = Field(None, description="When the picture was taken (EXIF, else the file's time), ISO 8601 UTC.")
    camera: str | None = None
    location: Position | None = Field(None, description="Where it was taken (EXIF GPS).")
    fields: dict[str, bool | float | str] = Field(default_factory=dict, description="The user's own fields "
                                                  "(ingest --metadata); dates as seconds since 1970, UTC.")
    thumbnail: str
    preview: str


class BundleInfo(BaseModel):
    model: str
    fingerprint: str
    path: str
    dense_dim: int
    vocab_size: int
    head_trained: bool | None = None


class Status(BaseModel):
    documents: int | None
    distinct_terms: int | None = None
    mean_terms_per_document: float | None = None
    backend: str
    location: str
    bundle: BundleInfo
    created_at: str | None = None
    last_ingest_at: str | None = None
    disk_bytes: int | None = None
    modes: list[str]
    k_max: int
    upload_max_bytes: int
    filters: bool = Field(description="Whether the index keeps dates, cameras, places and fields: filters, "
                          "/api/library and /api/facets.")


# --- builders ----------------------------------------------------------------------------


def picture_urls(doc_id: str, root: str = "") -> dict[str, str]:
    """``root``: the path the app is mounted at ("" at the server's root)."""
    return {"thumbnail": f"{root}/api/documents/{doc_id}/thumbnail", "preview": f"{root}/api/documents/{doc_id}/preview"}


def result(rank: int, hit: Hit, root: str = "", taken: float | None = None) -> Result:
    return Result(
        rank=rank, id=hit.id, score=hit.score, path=hit.path, name=os.path.basename(hit.path) or hit.id[:12],
        url=hit.url, matched=[Match(term=t, contribution=c) for t, c in hit.matched],
        words=[WordMatch(word=w, contribution=c, terms=list(terms)) for w, c, terms in hit.words], parts=hit.parts or None,
        taken=iso_time(taken) if taken is not None else None, **picture_urls(hit.id, root),
    )


def search_response(searched: Searched, query: QueryInfo, k: int, root: str = "",
                    taken: dict[str, float] | None = None, offset: int | None = None) -> SearchResponse:
    """``taken``: id -> when the picture was taken, for the hits that have a date."""
    res = searched.result
    taken = taken or {}
    return SearchResponse(
        query=query, mode=res.mode, k=k, encode_ms=round(searched.encode_ms, 3), search_ms=round(res.took_ms, 3), fusion=res.fusion,
        query_terms=[QueryTerm(term=t, weight=w, own=t in searched.own_terms) for t, w in res.query_terms],
        query_words=[QueryWord(word=w, weight=v, own=not searched.own_terms.isdisjoint(terms), terms=list(terms))
                     for w, v, terms in res.query_words],
        weak_query=res.weak_query, unrecognised_words=res.unrecognised_words, notice=res.notice,
        query_edits=QueryEdits(**res.edits.to_json()) if getattr(res, "edits", None) else None,
        filters=filters(res.filters), offset=offset,
        results=[result(i, hit, root, taken.get(hit.id)) for i, hit in enumerate(res.hits, start=1 + (offset or 0))],
    )


def filters(applied: SearchFilter | None) -> Filters | None:
    if not applied:
        return None
    return Filters(**applied.to_json(), description=applied.describe())


def facets(counted: dict, applied: SearchFilter | None) -> Facets:
    return Facets(fields={name: [FacetValue(value=v, count=c) for v, c in values]
                          for name, values in counted["fields"].items()},
                  types=counted["types"], located=counted["located"], filters=filters(applied))


def document_detail(doc: Document, root: str = "", words: list[PictureWordEntry] | None = None) -> DocumentDetail:
    """``words``: the picture's words as :func:`d2s_search.inflections.picture_words` orders them."""
    terms = sorted(doc.sparse.items(), key=lambda kv: (-kv[1], kv[0]))
    meta = doc.metadata
    return DocumentDetail(
        id=doc.id, path=doc.path, name=os.path.basename(doc.path) or doc.id[:12], url=doc.url, width=doc.width,
        height=doc.height, size_bytes=doc.size_bytes, ingested_at=_iso(doc.ingested_at), term_count=len(terms),
        terms=[Term(term=t, weight=w) for t, w in terms],
        words=[PictureWord(word=w.word, weight=w.weight, idf=w.idf, terms=list(w.terms)) for w in words or ()],
        taken=iso_time(meta.taken_at) if meta.taken_at is not None else None, camera=meta.camera,
        location=Position(lat=meta.location[0], lon=meta.location[1]) if meta.location else None,
        fields=dict(meta.fields), **picture_urls(doc.id, root),
    )


def _iso(epoch: float) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)) if epoch else None

