"""Ingest: discover -> read and hash -> skip what is stored -> decode -> encode -> write.

Decoding of batch i overlaps with encoding of batch i-1 (PIL and ONNX Runtime both release
the GIL). Each batch is written in one transaction, so an interrupted run keeps every batch
it finished and a re-run does only the rest. Files that cannot be used are collected with
their reason; the others go on.

One path is one document (``backends.base``): new bytes at a path replace the document that
path showed (a file overwritten in place); bytes already stored found at a further path add
that path to their document (a copy), or replace the paths whose files are gone (a move).
A file stored and unchanged costs one lookup of its id's paths, as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .backends.base import Backend, Document, Narrowing, PathListing
from .encoder import Encoder
from .errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    DocumentsRejectedError,
    ImageRejected,
    NoInputError,
)
from .images import DEFAULT_MAX_PIXELS, DEFAULT_SKIP, Skip, content_id, decode
from .metadata import Metadata, Sidecar, read_metadata
from .pathtext import path_to_text
from .sources import Source, discover_sources, exists, is_uri, read


@dataclass
class IngestReport:
    found: int = 0
    stored: int = 0
    already_stored: int = 0
    duplicates: int = 0  # same bytes as another file in this run (its path joins that document)
    metadata_updated: int = 0  # already stored: its metadata (date, camera, place, fields) changed
    moved: int = 0  # already stored, but the stored file was gone: its path now points here
    copies: int = 0  # already stored, and its stored file is still there: this path added to it
    rejected: list[tuple[str, str]] = field(default_factory=list)
    # Folders and pictures discovery left out (images.Skip): hidden or system ones, --exclude.
    skipped_hidden: int = 0
    skipped_excluded: int = 0
    seconds: float = 0.0
    # Local index: building its search structures after storing (None: not built by this run).
    search_seconds: float | None = None
    # --engine ray: seconds until every worker had loaded the bundle (None: one process). They
    # are part of ``seconds`` but not of ``images_per_second``, the rate once the workers run.
    workers_start_seconds: float | None = None
    workers: int | None = None

    @property
    def exit_code(self) -> int:
        """What `d2s-search ingest` exits with: 1 when nothing could be stored (every input
        rejected), 3 when some inputs were rejected, else 0."""
        if self.nothing_stored:
            return EXIT_FAILED
        return EXIT_PARTIAL if self.rejected else EXIT_OK

    @property
    def nothing_stored(self) -> bool:
        return self.stored == 0 and self.already_stored == 0 and bool(self.rejected)

    @property
    def images_per_second(self) -> float:
        seconds = self.seconds - (self.workers_start_seconds or 0.0)
        return self.stored / seconds if seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {
            "found": self.found,
            "stored": self.stored,
            "already_stored": self.already_stored,
            "duplicates": self.duplicates,
            "metadata_updated": self.metadata_updated,
            "moved": self.moved,
            "copies": self.copies,
            "rejected": [{"path": p, "reason": r} for p, r in self.rejected],
            "skipped": {"hidden": self.skipped_hidden, "excluded": self.skipped_excluded},
            "seconds": round(self.seconds, 3),
            "images_per_second": round(self.images_per_second, 2),
            **({"search_structures_seconds": round(self.search_seconds, 3)} if self.search_seconds is not None else {}),
            **({"workers": {"engine": "ray", "count": self.workers, "start_seconds": round(self.workers_start_seconds, 3)}}
               if self.workers_start_seconds is not None else {}),
        }


@dataclass
class _Hashed:
    path: Source  # a local path, or a URI
    data: bytes
    id: str
    mtime: float | None = None  # the file's modification time (the date of a picture without EXIF)


@dataclass
class _Decoded:
    item: _Hashed
    pixels: np.ndarray
    width: int
    height: int
    metadata: Metadata


ProgressCallback = Callable[[int, int], None]  # (files done, images stored so far)


def ingest(
    paths: Sequence[str | Path],
    encoder: Encoder,
    backend: Backend,
    batch_size: int = 32,
    workers: int = 2,
    top_k: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    on_start: Callable[[int], None] | None = None,
    on_progress: ProgressCallback | None = None,
    url_for: Callable[[Path], str | None] | None = None,
    skip: Skip = DEFAULT_SKIP,
    sidecar: Sidecar | None = None,
) -> IngestReport:
    """Ingest the images under ``paths``; ``url_for`` gives each stored image its URL
    (e.g. for thumbnails in OpenSearch Dashboards); ``skip``: what folder walks leave out;
    ``sidecar``: the user's fields by path or file name (``ingest --metadata``). Every picture's
    metadata is read from its EXIF; pictures already stored get theirs updated when it changed
    (a new sidecar value, an index made before metadata was kept), without being encoded again."""
    start = time.perf_counter()
    report = IngestReport()
    url_for = local_urls(url_for)
    files = discovered(paths, skip, report)
    if not files:
        return report
    declare_sidecar(backend, sidecar)
    if on_start:
        on_start(len(files))
    settings = encoder.bundle.image_settings
    # Decode JPEGs at a reduced scale when the model's input is much smaller (2x margin).
    draft = int(settings["size"]) * 2
    seen: set[str] = set()
    # Paths whose bytes this run read but did not store as a document of their own: files with
    # the same bytes as another of this run, and files refused after hashing. Their paths are
    # given to the document of those bytes (when stored) and taken from any other.
    elsewhere: dict[str, str] = {}
    done = 0

    def reject(path: Path, reason: str) -> None:
        report.rejected.append((path_to_text(path), reason))

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:

        def decode_one(item: _Hashed) -> _Decoded:
            image, width, height = decode(item.data, max_pixels=max_pixels, draft_size=draft)
            return _Decoded(item, encoder.preprocess(image), width, height, metadata_of(item, sidecar))

        def store(batch: list[tuple[_Hashed, Future]]) -> None:
            nonlocal done
            ready: list[_Decoded] = []
            for item, future in batch:
                try:
                    ready.append(future.result())
                except ImageRejected as exc:
                    reject(item.path, str(exc))
                    elsewhere[index_path(item.path)] = item.id
                except MemoryError:
                    reject(item.path, "out of memory while decoding")
            if ready:
                dense, sparse = encoder.encode_pixels(np.stack([d.pixels for d in ready]))
                now = time.time()
                docs = [
                    Document(
                        id=d.item.id,
                        path=index_path(d.item.path),
                        url=url_for(d.item.path) if url_for else None,
                        size_bytes=len(d.item.data),
                        width=d.width,
                        height=d.height,
                        sparse=encoder.to_terms(sparse[row], top_k=top_k),
                        dense=dense[row],
                        ingested_at=now,
                        metadata=d.metadata,
                    )
                    for row, d in enumerate(ready)
                ]
                store_batch(backend, docs, report, elsewhere)
            done += len(batch)
            if on_progress:
                on_progress(done, report.stored)

        previous: list[tuple[_Hashed, Future]] | None = None
        for n_files, hashed in _hashed_batches(files, batch_size, pool, reject):
            new_items, known = _select_new(hashed, backend, seen, report, elsewhere)
            _link_known(known, backend, url_for, report)
            update_metadata(known, backend, sidecar, report)
            done += n_files - len(new_items)  # skipped and rejected files count as done
            current = [(item, pool.submit(decode_one, item)) for item in new_items]
            if previous:
                store(previous)  # encodes batch i-1 while batch i decodes
            elif on_progress:
                on_progress(done, report.stored)
            previous = current
        if previous:
            store(previous)
    if elsewhere and isinstance(backend, PathListing):
        backend.relink(elsewhere)
    report.seconds = time.perf_counter() - start
    return report


def discovered(paths: Sequence[str | Path], skip: Skip, report: IngestReport) -> list[Source]:
    """The pictures under ``paths``; what was skipped or cannot be used goes into ``report``.
    [] when every input was a problem (listed in the report); NoInputError when there was
    nothing at all."""
    files, problems, skipped = discover_sources(paths, skip)
    report.skipped_hidden, report.skipped_excluded = skipped.hidden, skipped.excluded
    # Paths are kept as lossless text: names that are not UTF-8 show as \xNN escapes.
    report.rejected.extend((path_to_text(p), reason) for p, reason in problems)
    report.found = len(files)
    if not files and not problems:
        where = ", ".join(path_to_text(p) for p in paths)
        left_out = (f"; {skipped.total} hidden or excluded folder(s) and file(s) skipped (--include-hidden, --exclude)"
                    if skipped.total else "")
        raise NoInputError(f"no images found under {where} (looked for .jpg .png .webp .gif .bmp .tif){left_out}")
    return files


def refused(docs: Sequence[Document], failures: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """(shown path, reason, id of a document of this batch or None) of what the index refused."""
    by_id = {d.id: d for d in docs}
    return [(by_id[doc_id].path if doc_id in by_id else doc_id, f"refused by the index: {reason}",
             doc_id if doc_id in by_id else None) for doc_id, reason in failures.items()]


def store_batch(backend: Backend, docs: list[Document], report: IngestReport, elsewhere: dict[str, str]) -> None:
    """Write one batch; what the index refuses is reported (its path kept for the document of
    its bytes, see ``elsewhere`` in :func:`ingest`), the rest are stored."""
    try:
        backend.upsert(docs)
        report.stored += len(docs)
    except DocumentsRejectedError as exc:
        for shown, reason, doc_id in refused(docs, exc.failures):
            report.rejected.append((shown, reason))
            if doc_id:
                elsewhere[shown] = doc_id
        report.stored += len(docs) - len(exc.failures)


def _read_and_hash(path: Source) -> _Hashed:
    data = read(path)
    mtime = None
    if not is_uri(path):
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            mtime = None
    return _Hashed(path=path, data=data, id=content_id(data), mtime=mtime)


def declare_sidecar(backend: Backend, sidecar: Sidecar | None) -> None:
    """The sidecar's fields made known to the index before anything is stored (a field the
    index knows with another type stops the run here, with nothing written)."""
    if sidecar is None or not sidecar.types:
        return
    if not isinstance(backend, Narrowing):
        from .errors import MetadataError

        raise MetadataError(f"--metadata: the {getattr(backend, 'name', 'chosen')} index keeps no fields of its own")
    backend.declare_fields(sidecar.types)


def metadata_of(item: _Hashed, sidecar: Sidecar | None) -> Metadata:
    """What the picture says (EXIF; the file's time when it has no date) and the sidecar's
    fields for its path."""
    return _with_row(item, sidecar)[0]


def _with_row(item: _Hashed, sidecar: Sidecar | None) -> tuple[Metadata, bool]:
    """:func:`metadata_of`, and whether the sidecar has a row for the picture."""
    found = read_metadata(item.data, item.mtime)
    fields = sidecar.fields_for(index_path(item.path)) if sidecar is not None else None
    return (found.with_fields(fields) if fields else found), fields is not None


def update_metadata(known: list[_Hashed], backend: Backend, sidecar: Sidecar | None, report: IngestReport) -> None:
    """Stored pictures found again: their metadata as it is now (the backend writes only what
    changed: no vector is sent again)."""
    if not known or not isinstance(backend, Narrowing):
        return
    fresh: dict[str, Metadata] = {}
    keep: set[str] = set()  # no sidecar row: the fields stored before stay (a plain re-ingest keeps them)
    for item in known:  # the same bytes at two paths: the first found speaks for them
        if item.id not in fresh:
            fresh[item.id], has_row = _with_row(item, sidecar)
            if not has_row:
                keep.add(item.id)
    report.metadata_updated += backend.set_metadata(fresh, keep_fields=keep)


def _hashed_batches(
    files: list[Path], batch_size: int, pool: ThreadPoolExecutor, reject
) -> Iterator[tuple[int, list[_Hashed]]]:
    """(files in the batch, those read and hashed), reading one batch ahead."""
    batches = [files[i : i + batch_size] for i in range(0, len(files), batch_size)]
    ahead: list[list[tuple[Path, Future]]] = []
    for index in range(len(batches)):
        while len(ahead) < 2 and index + len(ahead) < len(batches):
            ahead.append([(p, pool.submit(_read_and_hash, p)) for p in batches[index + len(ahead)]])
        batch = ahead.pop(0)
        items = []
        for path, future in batch:
            try:
                items.append(future.result())
            except ImageRejected as exc:
                reject(path, str(exc))
        yield len(batch), items


def local_urls(url_for: Callable[[Path], str | None] | None) -> Callable[[Source], str | None] | None:
    """``url_for`` for local files only: a picture read by URI keeps no URL of its own."""
    if url_for is None:
        return None
    return lambda path: None if is_uri(path) else url_for(path)


def index_path(path: Source) -> str:
    """The path an index stores: absolute, its folders resolved (no ``..``), the file's own
    name kept as found (a symlinked picture keeps the name it was found under), as text that
    keeps undecodable bytes (``pathtext``); a URI as it is."""
    if is_uri(path):
        return str(path)
    return path_to_text(path.parent.resolve() / path.name)


def _link_known(known: list[_Hashed], backend: Backend, url_for, report: IngestReport) -> None:
    """Give stored documents the paths their bytes were found at: a copy adds its path, a move
    (the document's stored file gone) replaces the gone path, and a path another document
    held (overwritten with bytes stored elsewhere) leaves that document."""
    if not known or not isinstance(backend, PathListing):
        return
    held = backend.paths_of([item.id for item in known])  # no vectors decoded
    found: dict[str, str] = {}
    gone: set[str] = set()
    moved: dict[str, Path] = {}
    for item in known:
        here, paths = index_path(item.path), held.get(item.id)
        if paths is None or here in paths or here in found:
            continue  # unchanged (most files), removed meanwhile, or listed twice
        found[here] = item.id
        lost = [p for p in paths if not exists(p)]
        if lost:
            gone.update(lost)
            moved.setdefault(item.id, item.path)
        else:
            report.copies += 1
    if not found:
        return
    backend.relink(found, gone)
    report.moved += len(moved)
    if url_for and moved:  # the URL follows the shown path, which is now the new place
        docs = backend.get(list(moved))
        for doc in docs:
            doc.url = url_for(moved[doc.id])
        try:
            backend.upsert(docs)
        except DocumentsRejectedError as exc:
            report.rejected.extend((d.path, f"refused by the index: {exc.failures[d.id]}")
                                   for d in docs if d.id in exc.failures)


def _select_new(
    items: list[_Hashed], backend: Backend, seen: set[str], report: IngestReport, elsewhere: dict[str, str]
) -> tuple[list[_Hashed], list[_Hashed]]:
    """(new files, files already stored); a file repeating bytes read earlier in this run is not
    encoded again: its path goes to ``elsewhere``, for the document of those bytes."""
    present = backend.ids_present([i.id for i in items]) if items else set()
    new, known = [], []
    for item in items:
        if item.id in present:
            report.already_stored += 1
            known.append(item)
        elif item.id in seen:
            report.duplicates += 1
            elsewhere[index_path(item.path)] = item.id
        else:
            seen.add(item.id)
            new.append(item)
    return new, known
