"""What the search page does, independent of HTTP: encode, search, look up, describe.

Every call that touches the backend or the encoder runs on one worker thread. Why: the
local backend's SQLite connection belongs to the thread that opened it, and neither its
cached search state nor the tokenizer are made for concurrent use. A search takes
milliseconds, so queueing them costs less than locking every piece.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from PIL import Image

from ..backends.base import Backend, Document
from ..bundle import Bundle
from ..encoder import Encoder
from ..errors import QueryError
from ..search import (
    QueryVectors,
    SearchOptions,
    SearchResult,
    encode_image_query,
    encode_text_query,
    run_query,
)

T = TypeVar("T")
OWN_TERMS_OF_A_DOCUMENT = 8  # a document has no "own words": its strongest play that part (two-phase)


class DocumentNotFound(LookupError):
    """No stored document has this id."""


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

    def status(self) -> dict:
        return self.backend.stats()
