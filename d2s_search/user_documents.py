"""``ingest --documents FILE.jsonl``: pictures stored under the user's own ids in a cluster index.

Each line is a JSON object ``{"id": ..., "image": path-or-URL, ...}``. The id is the document:
one document per id, whatever its picture, so the same picture under two ids is two documents
and a line with a stored id replaces that document (docs/design-decisions.md, "Documents under
the user's ids"). Such an index is marked in its ``_meta`` (``document_ids``) and keeps only
documents of this kind: the content-hash ingest of folders, whose rule is one path one
document, is refused there, and this is refused in an index that holds content-hash documents.
A line whose id is stored with the same picture is not encoded again. The other keys of a
line are the document's own fields (typed as ``ingest --metadata`` types a JSON Lines file's
columns, searched with ``--where``) on a backend that keeps fields; elsewhere they are named in
the report as left out. A local index keys pictures by their content, so it takes no
``--documents``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .enrich import Pictures, read_picture
from .errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    D2SError,
    DocumentsRejectedError,
    ImageRejected,
    IndexStoreError,
    MetadataError,
)
from .redact import one_line

if TYPE_CHECKING:
    from .encoder import Encoder

# ``_meta.document_ids`` of an index filled by ``--documents``.
USER_IDS = "yours (ingest --documents)"
ID_MAX_BYTES = 512  # OpenSearch and Elasticsearch refuse a longer _id
IMAGE_KEY = "image"

# progress(lines done, lines found, stored so far); first called with done = 0.
Progress = Callable[[int, int, int], None]


@dataclass
class DocumentsReport:
    """What ``ingest --documents --json`` prints (less ``exit_code``)."""

    found: int = 0  # lines
    stored: int = 0  # encoded and written by this run
    already_stored: int = 0  # the id is stored with the same picture
    metadata_updated: int = 0  # of those, the fields changed (written without encoding)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (id, reason): not written
    left_out_keys: list[str] = field(default_factory=list)  # keys of the lines besides id and image
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.failed:
            return EXIT_FAILED if not self.stored and not self.already_stored else EXIT_PARTIAL
        return EXIT_OK

    def to_json(self) -> dict:
        return {"found": self.found, "stored": self.stored, "already_stored": self.already_stored,
                "metadata_updated": self.metadata_updated, "failed": [{"id": i, "reason": r} for i, r in self.failed],
                "left_out_keys": list(self.left_out_keys), "seconds": round(self.seconds, 3)}


@dataclass
class Line:
    id: str
    image: str
    number: int  # in the file, from 1
    extra: dict[str, Any] = field(default_factory=dict)  # the line's other keys, as given


def typed_fields(lines: list[Line]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """(field name -> type, id -> its typed fields) of the lines' other keys, as ``ingest
    --metadata`` reads a JSON Lines file; MetadataError naming the line otherwise."""
    from .metadata import _column_types, _typed, check_field_name

    rows = []
    for line in lines:
        label = f"line {line.number}"
        for name, value in line.extra.items():
            check_field_name(name, f"--documents, {label}")
            if not (value is None or isinstance(value, (str, bool, int, float))):
                raise MetadataError(f"--documents, {label}: {name!r} is not a string, number or boolean")
        rows.append((label, line.id, line.extra))
    types = _column_types(rows, {}, "documents")
    fields = {line_id: {name: _typed(value, types[name], "documents", label, name)
                        for name, value in values.items() if value not in (None, "")}
              for label, line_id, values in rows}
    return types, fields


def read_lines(source: str | os.PathLike | Iterable[Mapping[str, Any]]) -> tuple[list[Line], list[str]]:
    """The documents of a JSON Lines file (or of mappings given directly) and the other keys
    they carry; a line that is no object with a text ``id`` and ``image``, or an id given
    twice, refuses the whole file before any work (MetadataError naming the line)."""
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        try:
            text = Path(where).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise MetadataError(f"--documents {where}: cannot read it ({one_line(str(exc))})") from None
        rows: list[tuple[int, Any]] = []
        for number, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                rows.append((number, json.loads(raw)))
            except ValueError as exc:
                raise MetadataError(f"--documents {where}, line {number}: not JSON ({exc.msg})") from None
    else:
        where = "documents"
        rows = list(enumerate(source, 1))
    lines: list[Line] = []
    seen: dict[str, int] = {}
    others: dict[str, None] = {}
    for number, row in rows:
        if not isinstance(row, Mapping):
            raise MetadataError(f"{where}, line {number}: not an object")
        doc_id, image = row.get("id"), row.get(IMAGE_KEY)
        if isinstance(doc_id, int) and not isinstance(doc_id, bool):
            doc_id = str(doc_id)
        if not isinstance(doc_id, str) or not doc_id or len(doc_id.encode("utf-8")) > ID_MAX_BYTES \
                or doc_id.startswith("_"):
            raise MetadataError(f"{where}, line {number}: \"id\" must be a text or a number of at most "
                                f"{ID_MAX_BYTES} bytes, not starting with _")
        if not isinstance(image, str) or not image.strip():
            raise MetadataError(f"{where}, line {number}: \"image\" must be a picture's path or http(s) URL")
        if doc_id in seen:
            raise MetadataError(f"{where}, line {number}: id {doc_id!r} is on line {seen[doc_id]} already")
        seen[doc_id] = number
        extra = {k: v for k, v in row.items() if k not in ("id", IMAGE_KEY)}
        others.update(dict.fromkeys(extra))
        lines.append(Line(doc_id, image.strip(), number, extra))
    if not lines:
        raise MetadataError(f"{where}: no documents")
    return lines, list(others)


def claim_index(backend) -> None:
    """Mark the (opened) index as keyed by the user's ids, or refuse one that holds pictures
    keyed by their content."""
    _, meta = backend._stats()
    if meta.get("document_ids") == USER_IDS:
        return
    documents = backend.stats().get("documents") or 0
    if documents or meta.get("document_ids"):
        raise IndexStoreError(f"index {backend.index_name!r} holds pictures keyed by their content; --documents "
                              "stores them under your ids in an index of its own: give another --index-name")
    status, body = backend._call("PUT", f"/{backend.index_name}/_mapping",
                                 body={"_meta": {**meta, "document_ids": USER_IDS}})
    backend._check(status, body, "record the kind of ids in _meta")


def holds_user_ids(backend) -> bool:
    """Whether a cluster index was filled by ``--documents`` (folders are not ingested there)."""
    stats = getattr(backend, "_stats", None)
    return stats is not None and stats()[1].get("document_ids") == USER_IDS


def store_documents(backend, encoder: Encoder, lines: list[Line], pictures: Pictures, *, batch_size: int = 32,
                    workers: int = 2, top_k: int | None = None, max_pixels: int | None = None,
                    progress: Progress | None = None, left_out: Iterable[str] = ()) -> DocumentsReport:
    """Encode each line's picture and store it under the line's id (see the module doc)."""
    import numpy as np

    from .backends.base import Document, Narrowing
    from .images import DEFAULT_MAX_PIXELS, decode
    from .ingest import index_path
    from .metadata import read_metadata
    from .remote_image import is_url

    start = time.perf_counter()
    left_out = list(left_out)
    keeps_fields = isinstance(backend, Narrowing) and bool(left_out)
    types, fields = typed_fields(lines) if keeps_fields else ({}, {})  # a bad value fails before any write
    report = DocumentsReport(found=len(lines), left_out_keys=[] if keeps_fields else left_out)
    claim_index(backend)
    backend.claims_paths = False  # the id is the document: a path may be shown by several
    if types:
        backend.declare_fields(types)
    draft = int(encoder.bundle.image_settings["size"]) * 2
    max_pixels = max_pixels or DEFAULT_MAX_PIXELS

    def located(line: Line) -> str:
        where = pictures.locate(line.image)
        return where if "://" in where else index_path(Path(where))

    def prepare(line: Line, where: str):
        data = read_picture(where)
        image, width, height = decode(data, max_pixels=max_pixels, draft_size=draft)
        return encoder.preprocess(image), len(data), width, height, read_metadata(data, None)

    if progress is not None:
        progress(0, len(lines), 0)
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for begin in range(0, len(lines), max(1, batch_size)):
            batch = lines[begin : begin + batch_size]
            stored = backend.paths_of([line.id for line in batch])
            futures, known = [], []
            for line in batch:
                try:
                    where = located(line)
                except ImageRejected as exc:
                    report.failed.append((line.id, one_line(str(exc))))
                    continue
                if stored.get(line.id, [None])[0] == where:
                    report.already_stored += 1
                    known.append(line.id)
                    continue
                futures.append((line, where, pool.submit(prepare, line, where)))
            if known and keeps_fields:  # stored with the same picture: the fields as the file has them now
                changed = {doc.id: doc.metadata.with_fields(fields.get(doc.id, {})) for doc in backend.get(known)
                           if dict(doc.metadata.fields) != fields.get(doc.id, {})}
                report.metadata_updated += backend.set_metadata(changed) if changed else 0
            ready = []
            for line, where, future in futures:
                try:
                    ready.append((line, where, *future.result()))
                except (ImageRejected, D2SError) as exc:
                    report.failed.append((line.id, one_line(str(exc))))
                except MemoryError:
                    report.failed.append((line.id, "out of memory while decoding"))
            if ready:
                dense, sparse = encoder.encode_pixels(np.stack([r[2] for r in ready]))
                now = time.time()
                docs = [Document(id=line.id, path=where, url=where if is_url(where) else None, size_bytes=size,
                                 width=width, height=height, sparse=encoder.to_terms(sparse[row], top_k=top_k),
                                 dense=dense[row], ingested_at=now,
                                 metadata=metadata.with_fields(fields.get(line.id, {})))
                        for row, (line, where, _, size, width, height, metadata) in enumerate(ready)]
                try:
                    backend.upsert(docs)
                    report.stored += len(docs)
                except DocumentsRejectedError as exc:
                    report.failed.extend((i, f"refused by the index: {r}") for i, r in exc.failures.items())
                    report.stored += len(docs) - len(exc.failures)
            done += len(batch)
            if progress is not None:
                progress(done, len(lines), report.stored)
    backend.settle()
    report.seconds = time.perf_counter() - start
    return report
