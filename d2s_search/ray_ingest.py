"""Ingest on a Ray cluster: many machines (or processes) encode, the index stays the one truth.

The driver (the process that runs ``d2s-search ingest --engine ray``) keeps every decision the
single-process ingest makes (:mod:`d2s_search.ingest`): which files are new, which are copies
or moves of stored pictures, which paths go to which document. Only the expensive steps go to
the cluster:

* read and hash: Ray tasks, a batch of files each, a few batches ahead of the driver;
* decode and encode: a pool of actors, each holding one ONNX Runtime session of the bundle
  (on a GPU with ``gpus_per_worker``); a batch is the new files of one hashed batch, as in
  the single-process ingest, so the vectors are the same;
* write: on OpenSearch and Elasticsearch the actors send their documents to ``_bulk``
  themselves (content-hash ids: a batch written twice is stored once); a local index has one
  writer, the driver, which stores what the actors return.

A worker that dies is restarted by Ray and its batch sent again (``max_task_retries``); a
picture that cannot be used is reported with its reason and the rest go on; a run killed and
started again stores the rest with no duplicates, as a single-process run does.

Every node must see the bundle at the same path, and the pictures at the same paths or in an
object store by URI (:mod:`d2s_search.sources`), and reach the cluster index. Connection
settings (``D2S_OPENSEARCH_*``, ``D2S_ELASTICSEARCH_*``, ``AWS_*``, ``GOOGLE_*``) are passed to
the workers in the job's runtime environment.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import redact
from .backends.base import Backend, Document, PathListing
from .errors import D2SError, DocumentsRejectedError, ImageRejected, WorkersError
from .images import DEFAULT_MAX_PIXELS, DEFAULT_SKIP, Skip, content_id, decode
from .ingest import (
    IngestReport,
    ProgressCallback,
    _Hashed,
    _link_known,
    _read_and_hash,
    _select_new,
    declare_sidecar,
    discovered,
    index_path,
    local_urls,
    metadata_of,
    refused,
    store_batch,
)
from .pathtext import path_to_text
from .sources import Source, read

# Variables a worker needs to reach the index the driver reaches (secrets included: the
# runtime environment carries them to the job's workers only).
FORWARDED_PREFIXES = ("D2S_OPENSEARCH_", "D2S_ELASTICSEARCH_", "AWS_", "GOOGLE_")
HASH_BATCHES_AHEAD = 4  # read-and-hash tasks in flight before the driver waits for the oldest
BATCHES_PER_WORKER = 2  # encode batches queued at each actor: one running, one waiting
START_TIMEOUT_S = 600.0  # workers that have not loaded the bundle by then will not


@dataclass(frozen=True)
class IndexTarget:
    """Where the workers write: ``kind`` "local" (the driver writes), "opensearch" or
    "elasticsearch" (each worker opens its own connection with these settings)."""

    kind: str
    url: str | tuple[str, ...] | None = None
    index_name: str = "d2s"

    def open(self, identity) -> Backend:
        if self.kind == "opensearch":
            from .backends.opensearch.backend import OpenSearchBackend

            backend: Backend = OpenSearchBackend.from_env(url=self.url, index_name=self.index_name)
        elif self.kind == "elasticsearch":
            from .backends.elasticsearch.backend import ElasticsearchBackend

            backend = ElasticsearchBackend.from_env(url=self.url, index_name=self.index_name)
        else:
            raise ValueError(f"workers do not write to a {self.kind} index")
        backend.open(identity, create=False)
        return backend


def index_target(backend: Backend) -> IndexTarget:
    """How workers reach the index ``backend`` is connected to (credentials: the environment)."""
    if backend.name == "local":
        return IndexTarget("local")
    hosts = getattr(getattr(backend, "http", None), "hosts", None)  # OpenSearch: every host given
    url = tuple(hosts) if hosts else getattr(backend, "url", None)
    if isinstance(url, str) and url.startswith("cloud:"):
        url = None  # an Elasticsearch Cloud id: the workers read D2S_ELASTICSEARCH_CLOUD_ID too
    return IndexTarget(backend.name, url, getattr(backend, "index_name", "d2s"))


@dataclass
class RayOptions:
    address: str | None = None  # None: a Ray instance on this machine, started and stopped here
    workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_task_retries: int = 3


@dataclass
class EncodedBatch:
    """What a worker gives back for one batch."""

    docs: list[Document] = field(default_factory=list)  # local index: for the driver to store
    stored: int = 0  # cluster index: written by the worker
    rejected: list[tuple[str, str, str | None]] = field(default_factory=list)  # (path, reason, id)
    worker_pid: int = 0


@dataclass
class _Job:
    """One batch for the workers: (file, the path it is stored under, its id, its URL)."""

    items: list[tuple[Source, str, str, str | None]]


class EncodeWorker:
    """A Ray actor: one ONNX Runtime session of the bundle, and a connection to a cluster index
    when it writes there."""

    def __init__(self, bundle_path: str, device: str, threads: int, target: IndexTarget,
                 top_k: int | None, max_pixels: int, sidecar=None) -> None:
        from .bundle import Bundle
        from .encoder import Encoder

        bundle = Bundle.load(bundle_path)  # the driver verified it; the same files on every node
        self.encoder = Encoder(bundle, device=device, threads=max(1, threads))
        self.draft = int(bundle.image_settings["size"]) * 2
        self.top_k, self.max_pixels = top_k, max_pixels
        self.sidecar = sidecar  # the user's fields (ingest --metadata), or None
        self.backend = target.open(bundle.identity()) if target.kind != "local" else None

    def pid(self) -> int:
        return os.getpid()

    def encode(self, job: _Job) -> EncodedBatch:
        import numpy as np

        out = EncodedBatch(worker_pid=os.getpid())
        ready: list[tuple[tuple[Source, str, str, str | None], Any, int, int, int, Any]] = []
        for item in job.items:
            path, stored, doc_id, _ = item
            try:
                hashed = _read_and_hash(path)
                if hashed.id != doc_id:  # changed since it was hashed: next run takes it
                    raise ImageRejected("the file changed while it was being ingested")
                image, width, height = decode(hashed.data, max_pixels=self.max_pixels, draft_size=self.draft)
                ready.append((item, self.encoder.preprocess(image), width, height, len(hashed.data),
                              metadata_of(hashed, self.sidecar)))
            except ImageRejected as exc:
                out.rejected.append((stored, str(exc), doc_id))
            except MemoryError:
                out.rejected.append((stored, "out of memory while decoding", doc_id))
        if not ready:
            return out
        dense, sparse = self.encoder.encode_pixels(np.stack([r[1] for r in ready]))
        now = time.time()
        docs = [
            Document(id=doc_id, path=stored, url=url, size_bytes=size, width=width, height=height,
                     sparse=self.encoder.to_terms(sparse[row], top_k=self.top_k), dense=dense[row],
                     ingested_at=now, metadata=metadata)
            for row, ((_, stored, doc_id, url), _, width, height, size, metadata) in enumerate(ready)
        ]
        if self.backend is None:
            out.docs = docs
            return out
        try:
            self.backend.upsert(docs)
            out.stored = len(docs)
        except DocumentsRejectedError as exc:
            out.rejected += refused(docs, exc.failures)
            out.stored = len(docs) - len(exc.failures)
        return out

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def connect(ray, options: RayOptions) -> bool:
    """Join the cluster ``options`` names, or start a Ray instance on this machine; False when
    this process is already connected (then it is left so)."""
    if ray.is_initialized():
        return False
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
    # A Ray instance of its own (no address, none in RAY_ADDRESS as `ray job submit` sets):
    # room for every worker asked for (more workers than cores share them) rather than
    # actors that wait for CPUs that never come. A cluster's resources are its own.
    joins = bool(options.address or os.environ.get("RAY_ADDRESS"))
    if options.address:
        _check_reachable(options.address)
    own = {} if joins else {"num_cpus": max(os.cpu_count() or 1, options.workers * options.cpus_per_worker),
                            "include_dashboard": False, "configure_logging": False}
    try:
        ray.init(address=options.address, log_to_driver=False, runtime_env={"env_vars": env} if env else None, **own)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = options.address or os.environ.get("RAY_ADDRESS") or "this machine"
        raise WorkersError(f"cannot start or reach Ray at {where}: {redact.one_line(str(exc))}") from None
    return True


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """One line at once for a ``host:port`` (or ``ray://host:port``) nobody answers at; Ray
    itself keeps retrying for minutes."""
    import socket
    from urllib.parse import urlsplit

    if address == "auto" or address.startswith("local"):
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise WorkersError(f"--address {address}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise WorkersError(f"no Ray cluster answers at {address} ({exc.strerror or type(exc).__name__}); nothing "
                           "was ingested") from None


def started(ray, workers: list, options: RayOptions) -> None:
    """Wait until every worker has loaded the bundle; one line if one cannot, or the cluster
    has no room for them."""
    calls = [w.pid.remote() for w in workers]
    ready, waiting = ray.wait(calls, num_returns=len(calls), timeout=START_TIMEOUT_S)
    if waiting:
        raise WorkersError(
            f"{len(waiting)} of {len(workers)} worker(s) did not start within {START_TIMEOUT_S:.0f} s: the "
            f"cluster has no room for workers of {options.cpus_per_worker:g} CPU and "
            f"{options.gpus_per_worker:g} GPU each (fewer --workers, or check `ray status`)")
    try:
        ray.get(ready)
    except ray.exceptions.RayError as exc:  # its own error: a bundle it cannot load, an index it cannot reach
        raise WorkersError(f"a worker could not start: {_last_error(exc)}") from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAISED = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Rejected)): (.+)$")


def _last_error(exc: BaseException) -> str:
    """The error a worker raised, as one line: Ray gives a dead actor's traceback only as text
    (its last line is the exception, ``module.Type: message``)."""
    cause = getattr(exc, "cause", None)
    if cause is not None:
        return redact.one_line(str(cause))[:400]
    lines = [line.strip() for line in _ANSI.sub("", getattr(exc, "error_msg", "") or str(exc)).splitlines()]
    lines = [line for line in lines if line]
    raised = next((m for m in map(_RAISED.match, reversed(lines)) if m), None)
    text = raised.group(2) if raised else (lines[-1] if lines else type(exc).__name__)
    return redact.one_line(text)[:400]


def result_of(ray, ref):
    """A worker call's result; a worker's own error as itself (one line), a worker that kept dying as
    one line (everything stored so far is kept: run the same command again)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, D2SError):
            raise cause from None
        raise WorkersError(f"a worker failed: {_last_error(exc)}") from None
    except ray.exceptions.RayActorError as exc:
        raise WorkersError("a worker died and could not be restarted; everything stored so far is kept: run the "
                           f"same command again ({_last_error(exc)})") from None


def _hash_files(paths: list[Source]) -> list[tuple[Source, str | None, str]]:
    """(file, id, "") or (file, None, why it cannot be read): a Ray task."""
    out: list[tuple[Source, str | None, str]] = []
    for path in paths:
        try:
            out.append((path, content_id(read(path)), ""))
        except ImageRejected as exc:
            out.append((path, None, str(exc)))
    return out


def ray_ingest(
    paths: Sequence[str | Path],
    bundle,
    backend: Backend,
    target: IndexTarget,
    options: RayOptions,
    batch_size: int = 32,
    device: str = "auto",
    top_k: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    on_start: Callable[[int], None] | None = None,
    on_progress: ProgressCallback | None = None,
    on_ray_ready: Callable[[float], None] | None = None,
    url_for: Callable[[Path], str | None] | None = None,
    skip: Skip = DEFAULT_SKIP,
    sidecar=None,
) -> IngestReport:
    """Ingest the images under ``paths`` with Ray workers; ``backend`` is the driver's own
    connection to the index (opened), ``target`` tells the workers how to reach it.
    ``on_ray_ready`` gets the seconds Ray and the workers took to start (reported apart).
    ``sidecar``: the user's fields, read by the workers with each new picture's EXIF (pictures
    already stored keep their metadata: the driver does not read their bytes)."""
    from .extras import require

    require("ray", who="--engine ray")
    import ray

    start = time.perf_counter()
    report = IngestReport()
    url_for = local_urls(url_for)
    files = discovered(paths, skip, report)
    if not files:
        return report
    declare_sidecar(backend, sidecar)
    ray_start = time.perf_counter()
    started_here = connect(ray, options)
    try:
        actor = ray.remote(EncodeWorker).options(
            num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker,
            max_restarts=options.max_task_retries, max_task_retries=options.max_task_retries)
        worker_device = "cuda" if options.gpus_per_worker > 0 else device
        threads = max(1, int(options.cpus_per_worker))
        workers = [actor.remote(str(bundle.path), worker_device, threads, target, top_k, max_pixels, sidecar)
                   for _ in range(options.workers)]
        started(ray, workers, options)
        report.workers = len(workers)
        report.workers_start_seconds = time.perf_counter() - ray_start
        if on_ray_ready:
            on_ray_ready(report.workers_start_seconds)
        if on_start:
            on_start(len(files))
        _run(ray, files, workers, backend, target, report, batch_size, on_progress, url_for)
        report.seconds = time.perf_counter() - start  # the last batch stored; stopping Ray is not ingest
        ray.get([w.close.remote() for w in workers])
    finally:
        if started_here:
            ray.shutdown()
    return report


def _run(ray, files: list[Source], workers: list, backend: Backend, target: IndexTarget, report: IngestReport,
         batch_size: int, on_progress: ProgressCallback | None, url_for) -> None:
    # No CPU reserved: reading and hashing is light, and the workers may hold every CPU.
    hash_task = ray.remote(_hash_files).options(num_cpus=0)
    batches = [files[i : i + batch_size] for i in range(0, len(files), batch_size)]
    hashing: deque = deque()
    seen: set[str] = set()
    elsewhere: dict[str, str] = {}
    pending: dict[Any, int] = {}  # ObjectRef -> files in its batch
    load = dict.fromkeys(range(len(workers)), 0)
    owner: dict[Any, int] = {}
    done = 0

    def collect(block: bool) -> None:
        nonlocal done
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=None if block else 0)
            if not ready:
                return
            ref = ready[0]
            n = pending.pop(ref)
            load[owner.pop(ref)] -= 1
            result = result_of(ray, ref)
            for stored, reason, doc_id in result.rejected:
                report.rejected.append((stored, reason))
                if doc_id:
                    elsewhere[stored] = doc_id
            if result.docs:
                store_batch(backend, result.docs, report, elsewhere)
            report.stored += result.stored
            done += n
            if on_progress:
                on_progress(done, report.stored)
            block = False  # one result waited for; take the others that are ready

    for index in range(len(batches)):
        while len(hashing) < HASH_BATCHES_AHEAD and index + len(hashing) < len(batches):
            hashing.append(hash_task.remote(batches[index + len(hashing)]))
        hashed: list[_Hashed] = []
        for path, doc_id, reason in ray.get(hashing.popleft()):
            if doc_id is None:
                report.rejected.append((path_to_text(path), reason))
            else:
                hashed.append(_Hashed(path=path, data=b"", id=doc_id))
        n_files = len(batches[index])
        new_items, known = _select_new(hashed, backend, seen, report, elsewhere)
        _link_known(known, backend, url_for, report)
        done += n_files - len(new_items)
        if new_items:
            job = _Job([(i.path, index_path(i.path), i.id, url_for(i.path) if url_for else None) for i in new_items])
            while min(load.values()) >= BATCHES_PER_WORKER:
                collect(block=True)
            slot = min(load, key=load.__getitem__)
            ref = workers[slot].encode.remote(job)
            load[slot] += 1
            owner[ref] = slot
            pending[ref] = len(new_items)
        elif on_progress:
            on_progress(done, report.stored)
        collect(block=False)
    while pending:  # the batches still with the workers
        collect(block=True)
    if elsewhere and isinstance(backend, PathListing):
        backend.relink(elsewhere)
