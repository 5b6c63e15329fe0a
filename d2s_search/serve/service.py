"""What the search page does, independent of HTTP: encode, search, look up, describe.

Every call that touches the backend or the encoder runs on one worker thread. Why: the
local backend's SQLite connection belongs to the thread that opened it, and neither its
cached search state nor the tokenizer are made for concurrent use. A search takes
milliseconds, so queueing them costs less than locking every piece.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np
from PIL import Image

from ..backends.base import Backend, Document, Hit, Narrowing
from ..bundle import Bundle
from ..encoder import Encoder
from ..errors import QueryError
from ..filters import BUILT_IN_FIELDS, SearchFilter, build_filter, parse_where
from ..inflections import PictureWord, picture_words
from ..search import (
    QueryVectors,
    SearchOptions,
    SearchResult,
    browse_library,
    encode_image_query,
    encode_text_query,
    run_query,
)
from ..sources import is_uri

T = TypeVar("T")
OWN_TERMS_OF_A_DOCUMENT = 8  # a document has no "own words": its strongest play that part (two-phase)
WHOLE_EARTH_KM = 20_016.0  # over half the Earth's circumference: every position is this near any point


class DocumentNotFound(LookupError):
    """No stored document has this id."""


class FilterRefused(QueryError):
    """A filter parameter that cannot be applied; ``field`` names the request parameter."""

    def __init__(self, detail: str, field: str | None) -> None:
        super().__init__(detail)
        self.field = field


@dataclass(frozen=True)
class FilterParams:
    """The filter as a request gives it, still text: ``after``, ``before`` (dates), ``folder``
    and ``where`` (repeatable) and ``near`` (``LAT,LON,KM``)."""

    after: str | None = None
    before: str | None = None
    folders: tuple[str, ...] = ()
    where: tuple[str, ...] = ()
    near: str | None = None

    def __bool__(self) -> bool:
        return bool(self.after or self.before or self.folders or self.where or self.near)

    def pieces(self) -> list[tuple[str, dict]]:
        """(request parameter, build_filter keywords) of each value given, one at a time."""
        out: list[tuple[str, dict]] = []
        if self.after:
            out.append(("after", {"after": self.after}))
        if self.before:
            out.append(("before", {"before": self.before}))
        out += [("folder", {"folders": [f]}) for f in self.folders]
        out += [("where", {"where": [w]}) for w in self.where]
        if self.near:
            out.append(("near", {"near": self.near}))
        return out

    def first(self) -> str | None:
        pieces = self.pieces()
        return pieces[0][0] if pieces else None


_OPTION = re.compile(r"--(after|before|where|near|folder) ")


def as_parameters(message: str) -> str:
    """A filter error in the request's words: ``--after 'June': ...`` -> ``after='June': ...``."""
    return _OPTION.sub(lambda m: f"{m.group(1)}=", message)


@dataclass
class Searched:
    """A search result with what the page shows around it."""

    result: SearchResult
    vectors: QueryVectors
    encode_ms: float
    own_terms: set[str]  # the words the user typed (empty for pictures)


class SearchService:
    def __init__(self, bundle: Bundle, backend: Backend, encoder: Encoder | None = None, device: str = "auto") -> None:
        self.bundle = bundle
        self.backend = backend
        self.encoder = encoder
        self.device = device
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="d2s-search")
        self._started = False
        self._types: dict[str, str] | None = None  # the index's field types, read when first needed

    # -- lifecycle (blocking; call from plain code, not from the event loop) --------------

    def start(self, warm_up: bool = True) -> None:
        """Open the index (refusing an index filled by another bundle) and load the models."""
        if not self._started:
            self._worker.submit(self._open, warm_up).result()
            self._started = True

    def _open(self, warm_up: bool) -> None:
        self.backend.open(self.bundle.identity(), create=False)
        if self.encoder is None:
            self.encoder = Encoder(self.bundle, device=self.device)
        if warm_up:  # the first user query should not pay for session loading and cache building
            try:
                vectors = encode_text_query(self.encoder, "a photo")
            except QueryError:
                return  # a head that gives these words nothing: nothing to warm
            for mode in ("sparse", "dense"):
                run_query(self.backend, vectors, SearchOptions(mode=mode, k=1, explain=0))

    def index_id(self) -> str:
        """The local index's random id (its SQLite ``meta``), read on the worker that owns the
        connection; "" for another backend, or when it cannot be read (then no `query` asks
        this serve: searching in its own process, it reports what is wrong)."""
        generation = getattr(self.backend, "generation", None)
        if generation is None:
            return ""
        try:
            return str(self._worker.submit(generation).result()[0])
        except (sqlite3.Error, ValueError):
            return ""

    def stop(self) -> None:
        if self._started:
            self._worker.submit(self.backend.close).result()
            self._started = False
        self._worker.shutdown(wait=True)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the worker thread without blocking the event loop."""
        if not self._started:
            await asyncio.get_running_loop().run_in_executor(None, self.start)
        return await asyncio.get_running_loop().run_in_executor(self._worker, partial(fn, *args, **kwargs))

    # -- operations (run on the worker) ---------------------------------------------------

    def search_text(self, text: str, options: SearchOptions) -> Searched:
        options.validate()
        start = time.perf_counter()
        vectors = encode_text_query(self.encoder, text)
        encode_ms = (time.perf_counter() - start) * 1000
        # The words typed whole (not vectors.own, which falls back to the strongest terms).
        return Searched(run_query(self.backend, vectors, options), vectors, encode_ms, vectors.typed)

    def search_image(self, image: Image.Image, options: SearchOptions) -> Searched:
        options.validate()
        start = time.perf_counter()
        vectors = encode_image_query(self.encoder, image)
        encode_ms = (time.perf_counter() - start) * 1000
        return Searched(run_query(self.backend, vectors, options), vectors, encode_ms, set())

    def similar(self, doc_id: str, options: SearchOptions) -> tuple[Document, Searched]:
        """More like this: the stored document's own sparse and dense vectors as the query,
        the document itself left out of the results."""
        options.validate()
        doc = self.document(doc_id)
        strongest = sorted(doc.sparse.items(), key=lambda kv: (-kv[1], kv[0]))[:OWN_TERMS_OF_A_DOCUMENT]
        vectors = QueryVectors(full=doc.sparse, own=dict(strongest), dense=doc.dense)
        result = run_query(self.backend, vectors, dataclasses.replace(options, k=options.k + 1))
        result.hits = [h for h in result.hits if h.id != doc_id][: options.k]
        return doc, Searched(result, vectors, 0.0, set())

    def document(self, doc_id: str) -> Document:
        docs = self.backend.get([doc_id])
        if not docs:
            raise DocumentNotFound(f"no document with id {doc_id} in this index")
        return docs[0]

    def document_words(self, doc: Document) -> list[PictureWord]:
        """The picture's words by weight x IDF where the index counts document frequencies
        (local), else by weight (docs/design-decisions.md, "Words shown")."""
        counts = getattr(self.backend, "document_frequencies", None)
        return picture_words(doc.sparse, counts(doc.sparse) if counts is not None else None)

    def status(self) -> dict:
        self.field_types(fresh=True)
        return self.backend.stats()

    # -- filters, the library, facets (run on the worker) ------------------------------------

    @property
    def can_filter(self) -> bool:
        """Whether the backend keeps metadata: filters, the library and facets."""
        return isinstance(self.backend, Narrowing)

    def field_types(self, fresh: bool = False) -> dict[str, str]:
        """The fields a filter may name (name -> type), kept between requests. A field keeps
        its type for the life of an index and fields are only ever added, so the kept types
        are read again when a filter names a field they lack (an ingest with ``--metadata``
        since), with every facets answer and every status."""
        if fresh or self._types is None:
            self._types = self.backend.field_types() if isinstance(self.backend, Narrowing) else dict(BUILT_IN_FIELDS)
        return self._types

    def narrowing(self, given: FilterParams) -> SearchFilter | None:
        """The filter the request's parameters stand for (None when none is given), read with
        the index's field types; FilterRefused names the parameter at fault."""
        if not given:
            return None
        if not self.can_filter:
            raise FilterRefused(f"the {self.backend.name} index keeps no dates, cameras, places or fields: "
                                "search without filters", given.first())
        types = self.field_types()
        named = [_field_named(w) for w in given.where]
        if any(name is not None and name not in types for name in named):
            types = self.field_types(fresh=True)
        for parameter, piece in given.pieces():  # each alone first, so the error names its parameter
            if parameter == "folder" and not (os.path.isabs(piece["folders"][0]) or is_uri(piece["folders"][0])):
                raise FilterRefused(f"folder={piece['folders'][0]!r}: give the folder as the index stores its "
                                    "paths, absolute (the folder facet lists them)", "folder")
            try:
                build_filter(**piece, types=types)
            except QueryError as exc:
                raise FilterRefused(as_parameters(str(exc)), parameter) from None
        try:
            return build_filter(after=given.after, before=given.before, folders=given.folders, where=given.where,
                                near=given.near, types=types)
        except QueryError as exc:  # the pieces together: after not before before
            raise FilterRefused(as_parameters(str(exc)), "before") from None

    def library(self, k: int, offset: int, applied: SearchFilter | None) -> Searched:
        """The pictures passing the filter, most recently taken first (undated last)."""
        options = SearchOptions(k=k, filters=applied)
        options.validate()
        if not self.can_filter:
            raise FilterRefused(f"the {self.backend.name} index cannot list pictures without a query: "
                                "search by words or a picture", None)
        result = browse_library(self.backend, options, offset)
        return Searched(result, QueryVectors(full={}, own={}, dense=np.zeros(0, dtype=np.float32)), 0.0, set())

    def facets(self, applied: SearchFilter | None, size: int) -> dict[str, Any]:
        """Counts of the pictures passing the filter by folder, camera and each keyword or
        boolean field; the field types; whether any picture of the index has a position."""
        if not self.can_filter:
            raise FilterRefused(f"the {self.backend.name} index keeps no metadata to count", None)
        types = self.field_types(fresh=True)
        counts = self.backend.facets(applied, size)
        located = self.backend.facets(SearchFilter(near=(0.0, 0.0, WHOLE_EARTH_KM)), 1).get("folder", [])
        return {"fields": counts, "types": types, "located": bool(located)}

    def taken(self, hits: list[Hit]) -> dict[str, float]:
        """id -> when the picture was taken, for these hits (those with a date). It reads the
        whole documents (about 50 us a hit at 250 words and 768 dimensions: 10 ms for 200, several
        searches' time), so only the library's answers carry it."""
        if not hits or not self.can_filter:
            return {}
        return {d.id: d.metadata.taken_at for d in self.backend.get([h.id for h in hits])
                if d.metadata.taken_at is not None}


def _field_named(where: str) -> str | None:
    try:
        return parse_where(where)[0]
    except QueryError:
        return None  # reported with its parameter by narrowing()
