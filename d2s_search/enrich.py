"""Picture search added to an OpenSearch or Elasticsearch index the user already has
(``ingest --update-existing``).

Every document of the user's index whose image field holds a picture path or an http(s) URL
gets three fields, written as partial updates in ``_bulk`` (the user's own fields are never
sent): ``sparse`` (``rank_features``, keys escaped as our own index writes them), ``terms``
(its top words, ``keyword``) and ``dense`` (the bundle's dense vector). Before any document
is touched the mapping gets those three fields and ``_meta`` the bundle's identity (merged
with the user's own ``_meta``, which ``PUT _mapping`` would otherwise replace whole) and the
image field's name, in one request: the index then opens as one of ours, its hits showing the
image field's value as their path.

Which documents a run takes: those with an image value and no ``terms`` yet. ``sparse`` and
``terms`` are written in the same partial update, so one stands for the other; the query asks
for ``terms`` because a ``rank_features`` field answers no ``exists`` query (OpenSearch
``modules/mapper-extras`` RankFeaturesFieldMapper.RankFeaturesFieldType.existsQuery throws
"[rank_features] fields do not support [exists] queries"). A second run therefore updates
nothing, an interrupted one continues, and a picture that cannot be read is listed and left
as it was (the next run tries it again).

On OpenSearch the dense field depends on ``index.knn``, which is fixed when an index is created
(opensearch-project/k-NN 3.3.0.0, ``src/main/java/org/opensearch/knn/index/KNNSettings.java``:
``IS_KNN_INDEX_SETTING`` is ``IndexScope, Final``). With ``index.knn: true`` the field is our
own HNSW ``knn_vector`` and dense and hybrid search work. Without it k-NN refuses a
``knn_vector`` with a ``method`` (``mapper/KNNVectorFieldMapper.java``, ``validateFromFlat``:
"Cannot set modelId or method parameters when index.knn setting is false", the same in
2.19.0.0) and maps one without a method as a ``FlatVectorFieldMapper`` (vectors kept as doc
values, no graph), which a ``knn`` query refuses (``query/KNNQueryBuilder.java``,
``getQueryConfig``: "Field '%s' is not built for ANN search."). There the vectors are stored
flat: sparse search works, and a ``_reindex`` into an index created with ``index.knn: true``
and our ``knn_vector`` mapping makes them searchable without encoding anything again.
Elasticsearch needs no index setting for a ``dense_vector``: the field is our own (HNSW).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends.engine import bodies
from .backends.engine.bulk import ChunkLimits, item_reason, send_bulk
from .backends.engine.documents import DENSE_FIELD, SPARSE_FIELD
from .backends.engine.identity import IMAGE_FIELD_META, check_identity, meta_identity
from .errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    D2SError,
    ImageRejected,
    IndexStoreError,
    SettingsError,
)
from .redact import one_line, strip_url_credentials

if TYPE_CHECKING:
    import numpy as np

    from .backends.base import IndexIdentity
    from .encoder import Encoder

TERMS_FIELD = "terms"
OUR_FIELDS = (SPARSE_FIELD, DENSE_FIELD, TERMS_FIELD)
# Field types whose values can be a path or a URL.
TEXT_TYPES = frozenset({"keyword", "text", "match_only_text", "wildcard", "constant_keyword"})
SCROLL_KEEP = "10m"  # a page of pictures fetched from slow servers must not outlive its scroll
# ``_meta.dense_vectors`` of an index whose vectors are kept without a k-NN graph.
DENSE_FLAT = "stored flat: index.knn is false, reindex into a k-NN index to search them"

# progress(documents done, documents to do, updated so far); first called with done = 0.
Progress = Callable[[int, int, int], None]


@dataclass
class UpdateReport:
    """What ``ingest --update-existing --json`` prints (less ``exit_code``)."""

    index: str = ""
    image_field: str = ""
    found: int = 0  # documents with a value in the image field
    updated: int = 0  # given picture search by this run
    already_done: int = 0  # given it by an earlier run
    failed: list[tuple[str, str]] = field(default_factory=list)  # (document id, reason), left as they were
    dense: str = "knn"  # "knn": searchable; "flat": stored without a graph (index.knn is false)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 when every picture was used, 3 when some failed, 1 when all of them failed."""
        if self.failed:
            return EXIT_FAILED if not self.updated and not self.already_done else EXIT_PARTIAL
        return EXIT_OK

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "image_field": self.image_field,
            "found": self.found,
            "updated": self.updated,
            "already_done": self.already_done,
            "failed": [{"id": i, "reason": r} for i, r in self.failed],
            "dense": self.dense,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Pictures:
    """Where the image field's values point: ``url_base`` makes a URL of a value that is not
    one (``https://cdn.example.com`` + ``/img/1.jpg``); ``image_root`` is the folder of a
    relative path (which may not leave it); otherwise a relative path is taken from the
    current folder."""

    url_base: str | None = None
    image_root: Path | None = None

    def __post_init__(self) -> None:
        if self.url_base and self.image_root:
            raise SettingsError("give --url-base or --image-root, not both")
        if self.url_base is not None:
            from .remote_image import is_url

            if not is_url(self.url_base):
                raise SettingsError(f"--url-base must be an http(s) URL, not {strip_url_credentials(self.url_base)!r}")
        if self.image_root is not None:
            self.image_root = Path(self.image_root).resolve()
            if not self.image_root.is_dir():
                raise SettingsError(f"--image-root {self.image_root} is not a folder")

    def locate(self, value: str) -> str:
        """The URL or local path of a stored value; ImageRejected when it names none."""
        from .remote_image import is_url
        from .sources import is_uri

        if is_url(value) or is_uri(value):
            return value
        if self.url_base:
            return f"{self.url_base.rstrip('/')}/{value.lstrip('/')}"
        if self.image_root is not None and not os.path.isabs(value):
            where = (self.image_root / value).resolve()
            if not where.is_relative_to(self.image_root):
                raise ImageRejected(f"{value!r} leads out of --image-root")
            return str(where)
        return os.path.abspath(value)


def read_picture(where: str) -> bytes:
    """The bytes of a located picture: an http(s) URL fetched with the limits of a query
    picture (10 s timeout, an ``image/*`` answer), else a file or object-store URI as ingest
    reads it."""
    from .images import DEFAULT_MAX_BYTES
    from .remote_image import fetch_image, is_url
    from .sources import read

    if is_url(where):
        return fetch_image(where, max_bytes=DEFAULT_MAX_BYTES, as_what="a picture")
    return read(where if "://" in where else Path(where))


def image_value(source: Mapping[str, Any], name: str) -> str | None:
    """The image field's value in a document's ``_source`` (of a list, the first text); None
    when it holds no text."""
    value = source.get(name)
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, str) and v.strip()), None)
    return value.strip() if isinstance(value, str) and value.strip() else None


def mapped_type(properties: Mapping[str, Any], name: str) -> str | None:
    """The type a mapping gives the field ``name``; None when unmapped."""
    node = properties.get(name)
    return str(node.get("type", "object")) if isinstance(node, Mapping) else None


# -- the two engines: their transport and how each writes the three fields --------------------


class OpenSearchEngine:
    """Requests through the backend's connection (retries, credentials, TLS)."""

    label = "OpenSearch"
    dense_type = "knn_vector"

    def __init__(self, backend) -> None:
        self.http, self.url, self.retries = backend.http, backend.url, backend.http.retries

    def call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        reply = self.http.request(method, path, json_body=body, params=params)
        return reply.status, reply.body

    def bulk(self, lines: str) -> tuple[int, Any]:
        reply = self.http.request("POST", "/_bulk", ndjson=lines)
        return reply.status, reply.body

    def reason(self, status: int, body: Any) -> str:
        from .backends.opensearch.client import Reply

        return Reply(status, body).error_reason()

    def wait(self, attempt: int, why: str) -> None:
        self.http.policy.wait(attempt, None, why)

    def knn(self, index_name: str, concrete: Sequence[str]) -> dict[str, bool]:
        """index.knn of each concrete index (k-NN graphs only where it is true)."""
        status, body = self.call("GET", f"/{index_name}/_settings", params={"flat_settings": "true"})
        if not 200 <= status < 300 or not isinstance(body, dict):
            raise IndexStoreError(f"cannot read the settings of {index_name!r}: {self.reason(status, body)}")
        return {name: str(((body.get(name) or {}).get("settings") or {}).get("index.knn", "false")).lower() == "true"
                for name in concrete}

    def fields(self, identity: IndexIdentity, knn: bool) -> dict[str, Any]:
        from .backends.opensearch.queries import knn_vector

        dense = knn_vector(identity.dense_dim) if knn else {"type": "knn_vector", "dimension": identity.dense_dim}
        return {SPARSE_FIELD: {"type": "rank_features"}, DENSE_FIELD: dense, TERMS_FIELD: {"type": "keyword"}}

    def meta(self, identity: IndexIdentity) -> dict[str, Any]:
        return bodies.bundle_meta(identity, identity.dense_dim)

    def source(self, doc) -> dict[str, Any]:
        from .backends.opensearch import queries as q

        return q.doc_source(doc)

    def dims(self, mapping: Mapping[str, Any]) -> int:
        return int(mapping.get("dimension", 0) or 0)


class ElasticsearchEngine:
    """Requests through the backend's client; the fields as its default mapping has them
    (``rank_features``, ``dense_vector`` with HNSW: Elasticsearch needs no index setting)."""

    label = "Elasticsearch"
    dense_type = "dense_vector"

    def __init__(self, backend) -> None:
        self.backend, self.url, self.retries = backend, backend.url, backend.retries

    def call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        return self.backend._call(method, path, body=body, params=params)

    def bulk(self, lines: str) -> tuple[int, Any]:
        return self.backend._call("POST", "/_bulk", body=lines.encode("utf-8"), ndjson=True)

    def reason(self, status: int, body: Any) -> str:
        return self.backend._reason(body, status)

    def wait(self, attempt: int, why: str) -> None:
        self.backend._wait(attempt, why)

    def knn(self, index_name: str, concrete: Sequence[str]) -> dict[str, bool]:
        return dict.fromkeys(concrete, True)

    def fields(self, identity: IndexIdentity, knn: bool) -> dict[str, Any]:
        from .backends.elasticsearch import queries as q

        properties = q.index_body(identity, q.DEFAULT_MAPPING)["mappings"]["properties"]
        return {name: properties[name] for name in OUR_FIELDS}

    def meta(self, identity: IndexIdentity) -> dict[str, Any]:
        from .backends.elasticsearch import queries as q

        return q.put_meta_body(identity, q.DEFAULT_MAPPING)["_meta"]

    def source(self, doc) -> dict[str, Any]:
        from .backends.elasticsearch import queries as q

        return q.doc_source(doc, q.DEFAULT_MAPPING)

    def dims(self, mapping: Mapping[str, Any]) -> int:
        return int(mapping.get("dims", 0) or 0)


def engine_of(backend) -> OpenSearchEngine | ElasticsearchEngine:
    return ElasticsearchEngine(backend) if backend.name == "elasticsearch" else OpenSearchEngine(backend)


# -- the index as it is, and what adding picture search to it writes ------------------------


@dataclass
class Target:
    """The user's index, read before anything is written."""

    name: str
    mappings: dict[str, dict]  # concrete index -> its ``mappings``
    knn: dict[str, bool]  # concrete index -> index.knn

    def meta(self) -> dict:
        first = next(iter(self.mappings.values()), {})
        return dict(first.get("_meta") or {})

    def recorded(self) -> IndexIdentity | None:
        """The bundle an earlier run recorded (None on an index never given picture search)."""
        return meta_identity(self.meta())


def read_target(engine, index_name: str) -> Target:
    """GET the mapping (and on OpenSearch the settings) of ``index_name`` (an index or an alias)."""
    status, body = engine.call("GET", f"/{index_name}/_mapping")
    if status == 404:
        raise IndexStoreError(f"no index {index_name!r} at {strip_url_credentials(engine.url)}")
    if not 200 <= status < 300 or not isinstance(body, dict) or not body:
        raise IndexStoreError(f"cannot read the mapping of {index_name!r}: {engine.reason(status, body)}")
    mappings = {name: dict(entry.get("mappings") or {}) for name, entry in body.items() if isinstance(entry, dict)}
    return Target(index_name, mappings, engine.knn(index_name, list(mappings)))


def check_target(target: Target, image_field: str, identity: IndexIdentity, engine) -> None:
    """Refuse, before anything is written, what adding picture search would break."""
    name = target.name
    if not image_field or image_field in OUR_FIELDS:
        raise SettingsError(f"--image-field {image_field!r}: name the field that holds the pictures' paths or URLs "
                            f"(not {', '.join(OUR_FIELDS)}, which picture search adds)")
    if "." in image_field:
        raise SettingsError(f"--image-field {image_field!r}: a field inside an object is not supported; name a "
                            "top-level field (copy the value into one with an ingest pipeline or update_by_query)")
    meta = target.meta()
    enriched_from = meta.get(IMAGE_FIELD_META)
    if meta.get("fingerprint") and not enriched_from:
        raise IndexStoreError(f"index {name!r} was made by d2s-search: ingest pictures into it with "
                              "`d2s-search ingest PATHS`")
    if enriched_from and enriched_from != image_field:
        raise IndexStoreError(f"index {name!r} has picture search from the field {enriched_from!r}, "
                              f"not {image_field!r}: run again with --image-field {enriched_from}")
    if target.recorded() is not None:
        check_identity(name, "", identity, target.recorded(), "--update-existing")
    wanted = {SPARSE_FIELD: "rank_features", TERMS_FIELD: "keyword", DENSE_FIELD: engine.dense_type}
    for concrete, mappings in target.mappings.items():
        properties = mappings.get("properties") or {}
        kind = mapped_type(properties, image_field)
        if kind is None:
            raise IndexStoreError(f"index {concrete!r} has no field {image_field!r} (--image-field)")
        if kind not in TEXT_TYPES:
            raise IndexStoreError(f"field {image_field!r} of {concrete!r} is a {kind} field, not text: "
                                  "--image-field names the field that holds the pictures' paths or URLs")
        for ours, our_type in wanted.items():
            taken = properties.get(ours)
            if taken is None:
                continue
            taken_type = str(taken.get("type", "object"))
            if taken_type != our_type:
                raise IndexStoreError(f"field {ours!r} of {concrete!r} is already a {taken_type} field; picture "
                                      f"search needs it as {our_type}: nothing was changed")
            if not enriched_from:
                raise IndexStoreError(f"field {ours!r} of {concrete!r} already holds values of its own; picture "
                                      "search would overwrite them: nothing was changed")
            if ours == DENSE_FIELD and engine.dims(taken) != identity.dense_dim:
                raise IndexStoreError(f"field {ours!r} of {concrete!r} holds {engine.dims(taken)}-d vectors; "
                                      f"the bundle makes {identity.dense_dim}-d ones: nothing was changed")


def mapping_update(target: Target, concrete: str, image_field: str, identity: IndexIdentity,
                   engine) -> dict[str, Any]:
    """The ``PUT /<concrete>/_mapping`` body: the three fields, and ``_meta`` as the index has
    it with the bundle's entries and the image field's name added."""
    knn = target.knn[concrete]
    meta = {**(target.mappings[concrete].get("_meta") or {}), **engine.meta(identity), IMAGE_FIELD_META: image_field}
    if knn:
        meta.pop("dense_vectors", None)
    else:
        meta["dense_vectors"] = DENSE_FLAT
    return {"_meta": meta, "properties": engine.fields(identity, knn)}


def todo_body(image_field: str, page: int) -> dict[str, Any]:
    """The first page of a scroll over the documents with an image value and no picture search
    yet (``terms`` stands for ``sparse``, see the module doc); only the image field travels."""
    return {"size": int(page), "sort": ["_doc"], "_source": {"includes": [image_field]}, "track_total_hits": True,
            "query": {"bool": {"filter": [{"exists": {"field": image_field}}],
                               "must_not": [{"exists": {"field": TERMS_FIELD}}]}}}


def done_body(image_field: str) -> dict[str, Any]:
    """``_count`` of the documents that have picture search already."""
    return {"query": {"bool": {"filter": [{"exists": {"field": image_field}}, {"exists": {"field": TERMS_FIELD}}]}}}


def update_lines(updates: Sequence[tuple[str, str, Mapping[str, Any]]]) -> str:
    """``_bulk`` partial updates: (concrete index, id, the three fields)."""
    out = []
    for index, doc_id, fields in updates:
        out.append(bodies.dumps({"update": {"_index": index, "_id": doc_id}}))
        out.append(bodies.dumps({"doc": dict(fields)}))
    return "\n".join(out) + "\n"


def picture_fields(sparse: Mapping[str, float], dense: np.ndarray, engine) -> dict[str, Any]:
    """The three fields as our own index writes them (escaped keys, float32, top words);
    ValueError when the picture gave no word."""
    from .backends.base import Document

    source = engine.source(Document(id="", path="", size_bytes=0, width=0, height=0, sparse=dict(sparse),
                                    dense=dense))
    if not source[SPARSE_FIELD]:
        raise ValueError("the picture gave no word")
    return {name: source[name] for name in OUR_FIELDS}


# -- the run ---------------------------------------------------------------------------------


@dataclass
class _Page:
    hits: list[tuple[str, str, str | None]]  # (concrete index, id, image value)


class Enricher:
    """One run over an index through its engine's connection (retries, credentials, TLS)."""

    def __init__(self, engine, index_name: str, image_field: str, encoder: Encoder, pictures: Pictures, *,
                 batch_size: int = 32, workers: int = 2, top_k: int | None = None, max_pixels: int | None = None,
                 chunk_docs: int = 500, chunk_bytes: int = 8 * 1024 * 1024) -> None:
        self.engine, self.index_name, self.image_field = engine, index_name, image_field
        self.encoder, self.pictures = encoder, pictures
        self.batch_size, self.workers, self.top_k = max(1, batch_size), max(1, workers), top_k
        self.max_pixels = max_pixels
        self.limits = ChunkLimits(chunk_docs, chunk_bytes)

    # -- before anything is written ------------------------------------------------------

    def prepare(self, target: Target, identity: IndexIdentity, report: UpdateReport) -> None:
        """Check the index, then add the fields and ``_meta`` (idempotent: a second run puts
        the same mapping)."""
        check_target(target, self.image_field, identity, self.engine)
        for concrete in target.mappings:
            body = mapping_update(target, concrete, self.image_field, identity, self.engine)
            status, answer = self.engine.call("PUT", f"/{concrete}/_mapping", body)
            if not 200 <= status < 300:
                raise IndexStoreError(f"cannot add picture search to the mapping of {concrete!r}: "
                                      f"{self.engine.reason(status, answer)}")
        report.dense = "knn" if all(target.knn.values()) else "flat"

    # -- the documents -------------------------------------------------------------------

    def run(self, report: UpdateReport, progress: Progress | None = None) -> UpdateReport:
        start = time.perf_counter()
        self._refresh()  # documents the user wrote just now are in the scroll too
        report.already_done = self._count_done()
        done, started = 0, False
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for total, page in self._todo_pages():
                if progress is not None and not started:
                    progress(0, total, 0)
                started = True
                report.found = report.already_done + total
                self._update(page, pool, report)
                done += len(page.hits)
                if progress is not None:
                    progress(done, total, report.updated)
        if not started:
            report.found = report.already_done
            if progress is not None:
                progress(0, 0, 0)
        if report.updated:
            self._refresh()
        report.seconds = time.perf_counter() - start
        return report

    def _count_done(self) -> int:
        status, body = self.engine.call("POST", f"/{self.index_name}/_count", done_body(self.image_field))
        if not 200 <= status < 300:
            raise IndexStoreError(f"cannot count the documents of {self.index_name!r}: "
                                  f"{self.engine.reason(status, body)}")
        return int(body.get("count", 0))

    def _refresh(self) -> None:
        self.engine.call("POST", f"/{self.index_name}/_refresh")

    def _todo_pages(self) -> Iterator[tuple[int, _Page]]:
        def failed(status: int, body: Any) -> IndexStoreError:
            return IndexStoreError(f"cannot list the documents of {self.index_name!r}: "
                                   f"{self.engine.reason(status, body)}")

        status, body = self.engine.call("POST", f"/{self.index_name}/_search", todo_body(self.image_field,
                                                                                         self.batch_size),
                                        {"scroll": SCROLL_KEEP})
        if not 200 <= status < 300:
            raise failed(status, body)
        total = body.get("hits", {}).get("total", {})
        total = int(total.get("value", 0) if isinstance(total, dict) else total or 0)
        scroll_id = body.get("_scroll_id")
        try:
            while True:
                hits = body.get("hits", {}).get("hits", [])
                if not hits:
                    return
                yield total, _Page([(str(h.get("_index", self.index_name)), str(h["_id"]),
                                     image_value(h.get("_source") or {}, self.image_field)) for h in hits])
                status, body = self.engine.call("POST", "/_search/scroll",
                                                {"scroll": SCROLL_KEEP, "scroll_id": scroll_id})
                if not 200 <= status < 300:
                    raise failed(status, body)
                scroll_id = body.get("_scroll_id", scroll_id)
        finally:
            if scroll_id:
                self.engine.call("DELETE", "/_search/scroll", {"scroll_id": [scroll_id]})

    def _update(self, page: _Page, pool: ThreadPoolExecutor, report: UpdateReport) -> None:
        import numpy as np

        from .images import DEFAULT_MAX_PIXELS, decode

        draft = int(self.encoder.bundle.image_settings["size"]) * 2
        max_pixels = self.max_pixels or DEFAULT_MAX_PIXELS

        def prepare(value: str | None) -> np.ndarray:
            if value is None:
                raise ImageRejected(f"{self.image_field!r} holds no path or URL")
            data = read_picture(self.pictures.locate(value))
            image, _, _ = decode(data, max_pixels=max_pixels, draft_size=draft)
            return self.encoder.preprocess(image)

        futures = [(index, doc_id, pool.submit(prepare, value)) for index, doc_id, value in page.hits]
        ready: list[tuple[str, str, np.ndarray]] = []
        for index, doc_id, future in futures:
            try:
                ready.append((index, doc_id, future.result()))
            except (ImageRejected, D2SError) as exc:  # unreadable, undecodable, a URL refused: one line each
                report.failed.append((doc_id, one_line(str(exc))))
            except MemoryError:
                report.failed.append((doc_id, "out of memory while decoding"))
        if not ready:
            return
        dense, sparse = self.encoder.encode_pixels(np.stack([pixels for _, _, pixels in ready]))
        updates = []
        for row, (index, doc_id, _) in enumerate(ready):
            try:
                updates.append((index, doc_id, picture_fields(self.encoder.to_terms(sparse[row], top_k=self.top_k),
                                                              dense[row], self.engine)))
            except ValueError as exc:
                report.failed.append((doc_id, str(exc)))
        failures, _ = send_bulk(updates, self._send, self.limits, retries=self.engine.retries, wait=self.engine.wait,
                                reason=lambda result: item_reason(result, one_line))
        report.failed.extend((doc_id, f"refused by the index: {reason}") for doc_id, reason in failures.items())
        report.updated += len(updates) - len(failures)

    def _send(self, pending: list[tuple[str, str, Mapping[str, Any]]], limits: ChunkLimits):
        """One round of partial updates, in chunks of ``limits``: (item, accepted, its answer)."""
        chunk: list[tuple[str, str, Mapping[str, Any]]] = []
        size = 0
        for item in pending:
            lines = update_lines([item])
            if chunk and (len(chunk) >= limits.docs or size + len(lines) > limits.bytes):
                yield from self._send_chunk(chunk)
                chunk, size = [], 0
            chunk.append(item)
            size += len(lines)
        if chunk:
            yield from self._send_chunk(chunk)

    def _send_chunk(self, chunk: list[tuple[str, str, Mapping[str, Any]]]):
        status, body = self.engine.bulk(update_lines(chunk))
        items = body.get("items") if 200 <= status < 300 and isinstance(body, dict) else None
        if not isinstance(items, list) or len(items) != len(chunk):
            error = self.engine.reason(status, body) if not 200 <= status < 300 else "no item answers"
            for item in chunk:
                yield item, False, {"status": status, "error": error, "_id": item[1]}
            return
        for item, answer in zip(chunk, items, strict=True):
            ((_, result),) = answer.items()
            code = int(result.get("status", 0) or 0)
            yield item, 200 <= code < 300, {**result, "_id": item[1]}


def update_existing(backend, encoder: Encoder, image_field: str, pictures: Pictures, *, target: Target | None = None,
                    progress: Progress | None = None, **options: Any) -> UpdateReport:
    """Add picture search to the index ``backend`` names (an OpenSearch or Elasticsearch
    backend, not opened: the user's index is not ours yet; ``target``: the index as read
    already); see the module doc."""
    engine = engine_of(backend)
    identity = encoder.bundle.identity()
    target = target or read_target(engine, backend.index_name)
    report = UpdateReport(index=backend.index_name, image_field=image_field)
    enricher = Enricher(engine, backend.index_name, image_field, encoder, pictures, chunk_docs=backend.chunk_docs,
                        chunk_bytes=backend.chunk_bytes, **options)
    enricher.prepare(target, identity, report)
    return enricher.run(report, progress)
