"""The public index: open a local index or a cluster index with the bundle that filled it,
search it by words or a picture, ingest pictures into it. `d2s-search query` and `ingest`
run through the same methods."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends import BACKENDS
from ..errors import D2SError, DiskFullError, IndexStoreError, QueryError, SettingsError
from ..index_access import OpenedIndex, describe_index, index_location, open_index

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..encoder import Encoder as RuntimeEncoder
    from ..enrich import UpdateReport
    from ..filters import SearchFilter
    from ..ingest import IngestReport
    from ..metadata import Metadata
    from ..search import SearchResult
    from ..user_documents import DocumentsReport
    from ..watch import WatchBatch, Watching
    from .encoding import Encoder, ImageInput

# progress(files done, files found, images stored so far); first called with done = 0.
Progress = Callable[[int, int, int], None]


class Index:
    """An open index and the bundle that filled it. Make one with :meth:`open`; use it in a
    ``with`` block or :meth:`close` it. The models load at the first search or ingest. A local
    index is used from the thread that opened it (open one per thread)."""

    def __init__(self, opened: OpenedIndex, *, device: str = "auto", quick_start: bool = False) -> None:
        # Internal: Index.open builds it. quick_start: a one-query process (see encoder.make_session).
        self._bundle, self._backend, self._created = opened
        self._device, self._quick_start = device, quick_start
        self._runtime: RuntimeEncoder | None = None
        self._closed = False
        self._watching: list[Watching] = []
        self._shares_backend = False  # a watcher's view of a cluster index: the owner closes it
        # A local index's SQLite connection belongs to the thread that opened it.
        self._thread = threading.get_ident() if self._backend.name == "local" else None

    @classmethod
    def open(cls, path: str | os.PathLike = "d2s-index", *, url: str | None = None, backend: str | None = None,
             index_name: str = "d2s", bundle: str | os.PathLike | None = None, create: bool = False,
             device: str = "auto", search_threads: int = 0) -> Index:
        """Open the local index in the folder ``path``, or with ``url`` the OpenSearch index
        ``index_name`` (``backend="elasticsearch"`` for Elasticsearch; credentials come from
        the same ``D2S_OPENSEARCH_*`` / ``D2S_ELASTICSEARCH_*`` variables as the commands).

        ``bundle``: the model bundle; None uses the one that filled the index (else the one
        exported last); another bundle than the one that filled it is refused
        (BundleMismatchError). ``create=True`` makes the index when it does not exist (to
        ingest into). ``search_threads``: shards of a large local index searched at once (0:
        one per CPU)."""
        kind = backend_for(backend, url)
        if device not in ("auto", "cpu", "cuda"):
            raise SettingsError(f"unknown device {device!r}: use auto, cpu or cuda")
        opened = open_index(kind, os.fspath(path), url, index_name, os.fspath(bundle) if bundle else None,
                            create=create, verify=create, threads=search_threads,
                            remember=False)
        return cls(opened, device=device)

    @classmethod
    def update_existing(cls, index_name: str, image_field: str, *, url: str | None = None, backend: str | None = None,
                        bundle: str | os.PathLike | None = None, url_base: str | None = None,
                        image_root: str | os.PathLike | None = None, progress: Progress | None = None,
                        batch_size: int = 32, workers: int = 2, top_k: int | None = None,
                        max_pixels: int | None = None, device: str = "auto") -> UpdateReport:
        """Add picture search to the OpenSearch index ``index_name`` at ``url`` (Elasticsearch
        with ``backend="elasticsearch"``), which the caller made and fills: each document whose ``image_field`` holds a picture path or an
        http(s) URL gets its words (``sparse``, ``terms``) and dense vector as a partial update;
        its other fields are never sent. ``url_base`` makes a URL of a value that is not one,
        ``image_root`` is the folder of relative paths. Documents done by an earlier call are
        skipped, so calling it again continues an interrupted run and then updates nothing.
        Returns what ``ingest --update-existing --json`` prints (``report.failed``: documents
        whose picture could not be used, left as they were). Afterwards
        ``Index.open(url=url, index_name=index_name)`` searches it.

        ``bundle``: None uses the one an earlier call recorded, else the one exported last.
        ``progress(done, to_do, updated)`` is called before the first page and after each."""
        from ..encoder import Encoder as RuntimeEncoder
        from ..enrich import Pictures, check_target, engine_of, read_target, update_existing
        from ..index_access import bundle_for_index, make_backend

        kind = backend_for(backend, url)
        if kind == "local":
            raise SettingsError("picture search is added to an OpenSearch or Elasticsearch index (url=...), not to "
                                "a local one")
        if device not in ("auto", "cpu", "cuda"):
            raise SettingsError(f"unknown device {device!r}: use auto, cpu or cuda")
        _require_int("batch_size", batch_size, 1)
        _require_int("workers", workers, 1)
        pictures = Pictures(url_base, Path(image_root) if image_root is not None else None)
        store = make_backend(kind, "", url, index_name)
        try:
            target = read_target(engine_of(store), store.index_name)
            chosen = bundle_for_index(os.fspath(bundle) if bundle else None, target.recorded(),
                                      index_location(store), verify=True)
            check_target(target, image_field, chosen.identity(), engine_of(store))  # before the models load
            encoder = RuntimeEncoder(chosen, device=device)
            return update_existing(store, encoder, image_field, pictures, target=target, progress=progress,
                                   batch_size=batch_size, workers=workers, top_k=top_k, max_pixels=max_pixels)
        finally:
            store.close()

    # -- what it is --------------------------------------------------------------------

    @property
    def backend_name(self) -> str:
        """"local", "opensearch" or "elasticsearch"."""
        return self._backend.name

    @property
    def location(self) -> str:
        """The local index's folder (absolute), or the cluster's URL and index name (no credentials)."""
        return index_location(self._backend)

    @property
    def bundle_path(self) -> Path:
        return self._bundle.path

    @property
    def encoder(self) -> Encoder:
        """The index's bundle as an :class:`~d2s_search.Encoder` (the same loaded graphs its
        searches use)."""
        from .encoding import Encoder

        return Encoder(self._encoder())

    def stats(self) -> dict:
        """What ``d2s-search index stats --json`` prints: documents, terms, bundle, size,
        location, stored files now missing."""
        return describe_index(self._open_backend())

    # -- searching ---------------------------------------------------------------------

    def filter(self, *, after: str | None = None, before: str | None = None,
               folders: str | os.PathLike | Iterable[str | os.PathLike] = (), where: str | Iterable[str] = (),
               near: str | None = None) -> SearchFilter:
        """A filter for :meth:`search`, :meth:`browse` and :meth:`facets`, from what
        ``d2s-search query`` takes: ``after``/``before`` dates (``"2019-06-01"``; after is
        inclusive, before exclusive), ``folders`` (any path under one of them), ``where``
        conditions (``"camera=Pixel 7"``, ``"rating>=4"``; the ``=`` of one field are
        alternatives) and ``near`` (``"LAT,LON,KM"``). Field values are read as the index's
        field types (:meth:`field_types`)."""
        from ..filters import build_filter

        folders = [folders] if isinstance(folders, (str, os.PathLike)) else list(folders)
        where = [where] if isinstance(where, str) else list(where)
        return build_filter(after=after, before=before, folders=[os.fspath(f) for f in folders], where=where,
                            near=near, types=self.field_types())

    def metadata(self, ids: Iterable[str]) -> dict[str, Metadata]:
        """The stored metadata (date taken, camera, place, the user's fields) of the given
        document ids (``hit.id``); ids not stored are left out."""
        ids = [ids] if isinstance(ids, str) else list(ids)
        return {doc.id: doc.metadata for doc in self._open_backend().get(ids)}

    def field_types(self) -> dict[str, str]:
        """The fields a filter may name (name -> keyword, number, date or boolean)."""
        from ..backends.base import Narrowing
        from ..filters import BUILT_IN_FIELDS

        backend = self._open_backend()
        return backend.field_types() if isinstance(backend, Narrowing) else dict(BUILT_IN_FIELDS)

    def browse(self, k: int = 50, *, filters: SearchFilter | None = None, offset: int = 0) -> SearchResult:
        """The library without a query: the most recently taken pictures first (undated ones
        last), narrowed by ``filters``; ``offset`` pages on."""
        from ..search import SearchOptions, browse_library

        _require_int("k", k, 1)
        _require_int("offset", offset, 0)
        return browse_library(self._open_backend(), SearchOptions(k=k, filters=filters), offset)

    def facets(self, *, filters: SearchFilter | None = None, size: int = 20) -> dict[str, list[tuple[str, int]]]:
        """How many pictures (passing ``filters``) are in each folder, by each camera and for
        each value of the user's keyword and boolean fields: the ``size`` commonest, most first."""
        from ..backends.base import Narrowing

        _require_int("size", size, 1)
        backend = self._open_backend()
        if not isinstance(backend, Narrowing):
            raise QueryError(f"the {self.backend_name} index keeps no metadata to count")
        return backend.facets(filters or None, size)

    def search(self, text: str | None = None, *, image: ImageInput | None = None, mode: str = "sparse", k: int = 10,
               window: int | None = None, fusion: str = "minmax", alpha: float = 0.5, explain: int = 5,
               filters: SearchFilter | None = None) -> SearchResult:
        """Search by ``text``, by a picture (``image``: a file path, an http(s) URL or a PIL
        image), or by both (the sum of the two queries). ``text`` may edit its words:
        ``-word`` leaves out pictures that carry the word, ``+word`` keeps only those that do,
        ``word^2`` weighs it double (``result.edits`` says what was applied).

        ``mode``: "sparse" (exact, every term), "dense" (kNN), "hybrid" (both, fused by
        ``fusion`` "minmax" with ``alpha`` the dense weight, or "rrf"), or "two-phase" (the
        query's own words, then rescored; ``window`` candidates). ``explain``: matched
        words kept per hit. ``filters`` (made by :meth:`filter`) narrows every plan before
        the top ``k`` are taken. Returns a :class:`~d2s_search.SearchResult`: ``.hits`` best
        first, each with ``id``, ``score``, ``path``, ``url`` and ``matched``."""
        from ..search import (
            SearchOptions,
            combine_queries,
            encode_image_query,
            encode_text_query,
            run_query,
        )

        if text is None and image is None:
            raise QueryError("give text, image=, or both")
        if text is not None and not isinstance(text, str):
            raise QueryError(f"text must be a str, not {type(text).__name__}")
        _require_int("k", k, 1)
        _require_int("explain", explain, 0)
        if window is not None:
            _require_int("window", window, 1)
        options = SearchOptions(mode=mode, k=k, window=window, fusion=fusion, alpha=alpha, explain=explain,
                                filters=filters or None)
        options.validate()
        query_picture = None
        if image is not None:  # checked before the models load; a text query never imports PIL
            from .encoding import picture

            query_picture = picture(image, as_query=True)
        backend = self._open_backend()
        encoder = self._encoder()
        if query_picture is not None and text is not None:  # words and a picture: the sum of both queries
            vectors = combine_queries(encode_text_query(encoder, text), encode_image_query(encoder, query_picture))
        elif query_picture is not None:
            vectors = encode_image_query(encoder, query_picture)
        else:
            vectors = encode_text_query(encoder, text)
        return run_query(backend, vectors, options)

    # -- ingesting ---------------------------------------------------------------------

    def ingest(self, paths: str | os.PathLike | Iterable[str | os.PathLike], *, batch_size: int = 32,
               workers: int = 2, top_k: int | None = None, max_pixels: int | None = None, url_base: str | None = None,
               include_hidden: bool = False, exclude: Iterable[str] = (), progress: Progress | None = None,
               prepare_search: bool = True, engine: str = "process", ray_address: str | None = None,
               cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0,
               metadata: str | os.PathLike | None = None,
               url_roots: Iterable[str | os.PathLike] | None = None) -> IngestReport:
        """Encode the pictures under ``paths`` (files or folders, walked as ``d2s-search
        ingest`` walks them) and store the new ones. Returns the report ``ingest --json``
        prints (``report.to_json()``; ``report.exit_code`` is the command's exit code).

        ``progress(done, found, stored)`` is called once files are found (done = 0) and
        after every batch. ``prepare_search``: build a local index's search structures now,
        so the first search does not wait. A new index (``create=True``) that ends up empty
        is removed again, as the command does.

        ``engine="ray"``: the workers of a Ray cluster encode (``workers`` of them, each
        reserving ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs) and write to a cluster
        index themselves; ``ray_address`` names the cluster (None: ``RAY_ADDRESS``, else a Ray
        instance on this machine for the call). See docs/ray.md.

        ``metadata``: a CSV or JSON Lines file of the user's own fields by path or file name
        (docs/filters.md); pictures already stored get the new values without being encoded
        again. ``url_roots``: the folders ``url_base`` URLs are relative to (default: ``paths``;
        a watcher gives its watched folders, since it ingests single files found under them)."""
        from ..images import DEFAULT_MAX_PIXELS, Skip
        from ..ingest import ingest as run_ingest
        from ..serve.image_urls import url_builder

        given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        if not given:
            raise QueryError("ingest needs at least one path")
        given = [os.fspath(p) for p in given]
        _require_int("batch_size", batch_size, 1)
        _require_int("workers", workers, 1)
        if engine not in ("process", "ray"):
            raise SettingsError(f"unknown engine {engine!r}: use process or ray")
        url_for = url_builder(url_base, [os.fspath(p) for p in url_roots] if url_roots is not None else given) \
            if url_base else None  # a bad base fails before any work
        sidecar = None
        if metadata is not None:
            from ..metadata import read_sidecar

            sidecar = read_sidecar(metadata)  # a bad file fails before any work
        backend = self._open_backend()
        if self.backend_name != "local":
            from ..user_documents import holds_user_ids

            if holds_user_ids(backend):
                raise IndexStoreError(f"{self.location} holds documents under your ids (ingest --documents): "
                                      "folders go into another index")
        counted = {"found": 0, "stored": 0}

        def on_start(found: int) -> None:
            counted["found"] = found
            if progress is not None:
                progress(0, found, 0)

        def on_progress(done: int, stored: int) -> None:
            counted["stored"] = stored
            if progress is not None:
                progress(done, counted["found"], stored)

        report = None
        skip = Skip(hidden=not include_hidden, exclude=tuple(exclude))
        try:
            if engine == "ray":
                from ..ray_ingest import RayOptions, index_target, ray_ingest

                options = RayOptions(address=ray_address, workers=workers, cpus_per_worker=cpus_per_worker,
                                     gpus_per_worker=gpus_per_worker)
                report = ray_ingest(
                    given, self._bundle, backend, index_target(backend), options, batch_size=batch_size,
                    device=self._device, top_k=top_k, max_pixels=max_pixels or DEFAULT_MAX_PIXELS, on_start=on_start,
                    on_progress=on_progress, url_for=url_for, skip=skip, sidecar=sidecar,
                )
            else:
                report = run_ingest(
                    given, self._encoder(), backend, batch_size=batch_size, workers=workers, top_k=top_k,
                    max_pixels=max_pixels or DEFAULT_MAX_PIXELS, on_start=on_start, on_progress=on_progress,
                    url_for=url_for, skip=skip, sidecar=sidecar,
                )
            if prepare_search and (report.stored or report.moved):
                report.search_seconds = self.prepare_search()
        except DiskFullError as exc:  # say how much of this run is kept
            raise DiskFullError(exc.where, exc.free, stored=counted["stored"]) from None
        finally:
            if self._created and (report is None or report.stored == 0):
                self._discard_new_index()
        self._created = False
        return report

    def ingest_documents(self, documents: str | os.PathLike | Iterable[Mapping[str, Any]], *,
                         url_base: str | None = None, image_root: str | os.PathLike | None = None,
                         progress: Progress | None = None, batch_size: int = 32, workers: int = 2,
                         top_k: int | None = None, max_pixels: int | None = None) -> DocumentsReport:
        """Store pictures under your own ids (``ingest --documents``): ``documents`` is a JSON
        Lines file, or mappings, each ``{"id": ..., "image": path-or-URL}``; ``url_base`` and
        ``image_root`` place a relative value as :meth:`update_existing` does. One document per
        id: the same picture under two ids is two documents, a stored id with the same picture
        is not encoded again, with another it is replaced. Such an index keeps only documents
        of this kind (``ingest`` of folders is refused there). Cluster indexes only: a local
        index keys pictures by their content. Returns what ``ingest --documents --json``
        prints; ``progress(done, found, stored)`` as :meth:`ingest`."""
        from ..enrich import Pictures
        from ..user_documents import read_lines, store_documents

        if self.backend_name == "local":
            raise SettingsError("documents under your own ids go into an OpenSearch or Elasticsearch index (url=); "
                                "a local index keys pictures by their content: ingest the folder instead")
        _require_int("batch_size", batch_size, 1)
        _require_int("workers", workers, 1)
        pictures = Pictures(url_base, Path(image_root) if image_root is not None else None)
        lines, others = read_lines(documents)  # a bad file fails before any work
        report = None
        try:
            report = store_documents(self._open_backend(), self._encoder(), lines, pictures, batch_size=batch_size,
                                     workers=workers, top_k=top_k, max_pixels=max_pixels, progress=progress,
                                     left_out=others)
        finally:
            if self._created and (report is None or report.stored == 0):
                self._discard_new_index()
        self._created = False
        return report

    def prepare_search(self) -> float | None:
        """Build a local index's search structures now (ingest does it); seconds taken, None
        when the backend has nothing to build or it failed (a warning says so; the first
        search builds them then)."""
        prepare = getattr(self._open_backend(), "prepare_search", None)
        if prepare is None:
            return None
        start = time.perf_counter()
        try:
            prepare()
        except D2SError as exc:
            warnings.warn(f"the search structures were not prepared ({exc}); the first search builds them",
                          stacklevel=2)
            return None
        return time.perf_counter() - start

    # -- watching ----------------------------------------------------------------------

    def watch(self, paths: str | os.PathLike | Iterable[str | os.PathLike], *, delay: float = 1.0,
              include_hidden: bool = False, exclude: Iterable[str] = (), batch_size: int = 32, workers: int = 2,
              top_k: int | None = None, max_pixels: int | None = None, url_base: str | None = None,
              metadata: str | os.PathLike | None = None, on_batch: Callable[[WatchBatch], None] | None = None,
              on_error: Callable[[str], None] | None = None) -> Watching:
        """Keep this index in sync with the folders (or files) ``paths`` as their files change,
        from a thread of its own, until the returned handle's ``stop()`` (or :meth:`close`).
        What is there already is not ingested: call :meth:`ingest` first. Needs the ``watch``
        extra.

        A file is ingested once it has been quiet for ``delay`` seconds (a picture still being
        copied is not read); a moved file keeps its document (not encoded again), a deleted
        one gives up its path (a document left without one is removed). ``on_batch(batch)``
        gets each applied batch (:class:`~d2s_search.watch.WatchBatch`: ``added``, ``moved``,
        ``removed``, ``rejected``, ...), from the watching thread; ``on_error(message)`` a
        batch that could not be written (without it, such an error ends the watch and
        ``stop()`` raises it). The other arguments are :meth:`ingest`'s."""
        from .. import extras
        from ..watch import Watching, WatchOptions

        extras.require("watch", who="Index.watch")
        given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        _require_int("batch_size", batch_size, 1)
        _require_int("workers", workers, 1)
        options = WatchOptions(delay=delay, include_hidden=include_hidden, exclude=tuple(exclude),
                               batch_size=batch_size, workers=workers, top_k=top_k, max_pixels=max_pixels,
                               url_base=url_base, metadata=os.fspath(metadata) if metadata is not None else None)
        if metadata is not None:
            from ..metadata import read_sidecar

            read_sidecar(metadata)  # a bad file fails here, not in the first batch
        self._open_backend()  # a closed index is refused here
        watching = Watching(self._for_another_thread, given, options, on_batch=on_batch, on_error=on_error,
                            on_notice=lambda line: warnings.warn(line, stacklevel=1))
        self._watching.append(watching)
        return watching

    def _for_another_thread(self) -> Index:
        """This index for the calling thread: a local index opened again (its connection belongs
        to a thread), a cluster index shared (its client is thread-safe; closed by this one).
        The loaded models are shared (ONNX Runtime runs a loaded model from several threads)."""
        from ..index_access import OpenedIndex, make_backend

        if self._backend.name == "local":
            store = make_backend("local", self._backend.path, None, "")
            store.open(self._bundle.identity(), create=False)
        else:
            store = self._backend
        twin = Index(OpenedIndex(self._bundle, store, False), device=self._device)
        twin._runtime = self._runtime
        if store is self._backend:
            twin._shares_backend = True
        return twin

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the index (stopping its watchers first)."""
        if self._closed:
            return
        failure = None
        while self._watching:
            try:
                self._watching.pop().stop()
            except BaseException as exc:  # raised once the index is closed
                failure = failure or exc
        self._closed = True
        if not self._shares_backend:
            self._backend.close()
        if failure is not None:
            raise failure

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Index({self.location!r}, backend={self.backend_name!r}, bundle={str(self.bundle_path)!r})"

    # -- internal ----------------------------------------------------------------------

    def _open_backend(self) -> Backend:
        if self._closed:
            raise IndexStoreError(f"the index at {self.location} is closed")
        if self._thread is not None and threading.get_ident() != self._thread:
            raise IndexStoreError(f"the local index at {self.location} was opened in another thread: open one Index "
                                  "per thread (each searches the same files)")
        return self._backend

    def _encoder(self) -> RuntimeEncoder:
        if self._runtime is None:
            from ..encoder import Encoder as RuntimeEncoder

            self._runtime = RuntimeEncoder(self._bundle, device=self._device, quick_start=self._quick_start)
        return self._runtime

    def _discard_new_index(self) -> None:
        """Remove an index this object created and left empty (only the index's own files, and
        its folder only when the index made it), and close it then. Best effort: runs while
        another error may be on its way out, which must not be hidden."""
        try:
            if self._backend.stats().get("documents") != 0:
                return  # something was stored (by this run before it stopped, or by another)
            if self._backend.name == "local":
                self._backend.remove_created()  # only its own files, even beside the user's
            else:
                self._backend.drop()
        except (D2SError, OSError):
            return
        self.close()


def backend_for(backend: str | None, url: str | None) -> str:
    """The backend Python arguments name (explicitly: no D2S_* variable picks it): ``backend``,
    else opensearch with a ``url``, else local. A cluster without its address is refused."""
    kind = backend or ("opensearch" if url else "local")
    if kind not in BACKENDS:
        raise SettingsError(f"unknown backend {kind!r}: use one of {', '.join(BACKENDS)}")
    if kind == "opensearch" and not url:
        raise SettingsError("the opensearch backend needs url= (the cluster's address)")
    if kind == "elasticsearch" and not (url or os.environ.get("D2S_ELASTICSEARCH_URL")
                                        or os.environ.get("D2S_ELASTICSEARCH_CLOUD_ID")):
        raise SettingsError("the elasticsearch backend needs url= (or D2S_ELASTICSEARCH_CLOUD_ID)")
    return kind


def _require_int(name: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise QueryError(f"{name} must be a whole number of at least {least}, not {value!r}")
