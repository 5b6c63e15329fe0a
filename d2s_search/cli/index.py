"""``d2s-search index``: create, inspect, reindex or delete an index (local or OpenSearch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from d2s_search.backends.base import Document
from d2s_search.cli.options import (
    backend_options,
    connection_options,
    json_option,
    load_bundle,
    make_backend,
    opensearch_backend,
)
from d2s_search.cli.output import emit as _emit
from d2s_search.cli.output import emit_json as _emit_json
from d2s_search.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, D2SError, ImageRejected


@click.group()
def index() -> None:
    """Create, inspect, reindex or delete an index."""


@index.command("stats")
@backend_options
@json_option
def index_stats(backend, index, url, index_name, as_json) -> int:
    """Documents, terms, bundle and size of the index."""
    store = make_backend(backend, index, url, index_name)
    try:
        store.open(None, create=False)
        stats = store.stats()
    finally:
        store.close()
    if as_json:
        _emit_json(stats)
    else:
        for key, value in stats.items():
            click.echo(f"{key:26s} {value}")
    return EXIT_OK


@index.command("delete")
@backend_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def index_delete(backend, index, url, index_name, yes, as_json) -> int:
    """Delete the whole index (the images themselves are not touched)."""
    store = make_backend(backend, index, url, index_name)
    if not store.exists():
        raise D2SError(f"no index to delete at {url or index}")
    where = f"{url}/{index_name}" if url and (backend or "opensearch") == "opensearch" else index
    refusal = getattr(store, "why_not_droppable", lambda: None)()  # local: refuse before asking
    if refusal:
        raise D2SError(refusal)
    if not yes and not click.confirm(f"delete the index at {where}?", err=True):
        return EXIT_FAILED
    store.drop()
    if as_json:
        _emit_json({"deleted": where})
    else:
        click.echo(f"deleted {where}")
    return EXIT_OK


def mapping_options(f):
    for option in reversed([
        click.option("--engine", type=click.Choice(["faiss", "lucene"]), default="faiss", show_default=True,
                     help="k-NN engine of the dense HNSW field."),
        click.option("--shards", type=click.IntRange(1), default=1, show_default=True),
        click.option("--replicas", type=click.IntRange(0), default=0, show_default=True,
                     help="0 suits a single node; use 1 or more on a cluster."),
    ]):
        f = option(f)
    return f


@index.command("create")
@click.option("--bundle", envvar="D2S_BUNDLE", type=click.Path(file_okay=False),
              help="Model bundle whose fingerprint and dense size the index records (default: the last exported).")
@connection_options
@mapping_options
@click.option("--pipelines/--no-pipelines", default=True, show_default=True,
              help="Also install the hybrid search pipelines (needs the neural-search plugin).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def index_create(bundle, url, index_name, insecure, engine, shards, replicas, pipelines, as_json) -> int:
    """Create the OpenSearch index (mappings/index.json) and its hybrid search pipelines."""
    identity = load_bundle(bundle).identity()
    store = opensearch_backend(url, index_name, insecure)
    try:
        existed = store.exists()
        store.open(identity, create=True, engine=engine, shards=shards, replicas=replicas)
        installed, warnings = [], []
        if pipelines:
            for method in ("min_max", "rrf"):
                try:
                    installed.append(store.ensure_pipeline(method))
                except Exception as exc:  # the index is usable without them
                    warnings.append(str(exc))
        stats = store.stats()
    finally:
        store.close()
    payload = {"index": index_name, "created": not existed, "indices": stats["indices"],
               "bundle_fingerprint": identity.fingerprint, "dense_dim": identity.dense_dim,
               "pipelines": installed, "warnings": warnings}
    verb = "exists already for this bundle" if existed else "created"
    _emit(payload, as_json, [f"index {index_name} {verb} at {store.url} ({', '.join(stats['indices'])})"]
          + [f"search pipeline {p} ready" for p in installed] + [f"warning: {w}" for w in warnings])
    return EXIT_OK


@index.command("reindex")
@click.option("--bundle", envvar="D2S_BUNDLE", type=click.Path(file_okay=False),
              help="Move to this bundle: every image is read again from its stored path and re-encoded.")
@connection_options
@mapping_options
@click.option("--keep-old", is_flag=True, help="Keep the previous index (the alias moves either way).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def index_reindex(bundle, url, index_name, insecure, engine, shards, replicas, keep_old, device, as_json) -> int:
    """Copy the index into a new one (new mapping and/or bundle), then swap the alias.

    Nothing changes unless every document made it: the new index is removed otherwise.
    Stop ingests while this runs.
    """
    store = opensearch_backend(url, index_name, insecure)
    try:
        store.open(None, create=False)
        identity, reencode = None, None
        if bundle:
            loaded = load_bundle(bundle)
            identity = loaded.identity()
            if store.identity and identity.fingerprint != store.identity.fingerprint:
                reencode = make_reencoder(loaded, device)
        out = store.reindex(identity, reencode, engine=engine, shards=shards, replicas=replicas, keep_old=keep_old)
    finally:
        store.close()
    _emit(out, as_json, [f"reindexed {out['documents']} documents: {index_name} now points at {out['to']} "
                         f"(was {out['from']}{', kept' if out['kept_old'] else ', deleted'})"])
    return EXIT_OK


def make_reencoder(bundle, device: str = "auto") -> Callable[[Document], Document | None]:
    """Document -> the same image encoded with ``bundle``; None when its file is gone or changed."""
    from d2s_search.encoder import Encoder
    from d2s_search.images import content_id, decode, read_bytes

    encoder = Encoder(bundle, device=device)
    draft = int(bundle.image_settings["size"]) * 2

    def reencode(doc: Document) -> Document | None:
        try:
            data = read_bytes(Path(doc.path))
            if content_id(data) != doc.id:
                return None  # the file changed since ingest: `ingest` stores it under its new id
            image, width, height = decode(data, draft_size=draft)
        except (OSError, ImageRejected):
            return None
        dense, sparse = encoder.encode_pixels(encoder.preprocess(image)[None])
        return Document(id=doc.id, path=doc.path, size_bytes=len(data), width=width, height=height,
                        sparse=encoder.to_terms(sparse[0]), dense=dense[0], url=doc.url,
                        ingested_at=doc.ingested_at)

    return reencode


@index.command("check")
@click.option("--index", envvar="D2S_INDEX", show_envvar=True, default="./d2s-index", show_default=True,
              type=click.Path(file_okay=False), help="Folder of the embedded local index.")
@click.option("--repair", is_flag=True,
              help="Rebuild what is derived (the search cache; the database file from its readable pages) "
                   "and report the documents that are lost.")
@json_option
def index_check(index, repair, as_json) -> int:
    """Integrity of a local index: SQLite's own check, the cache against its checksums."""
    from d2s_search.backends.local import LocalBackend

    store = LocalBackend(index)
    if not store.exists():
        raise D2SError(f"no index at {index}")
    try:
        report = store.check(repair=repair)
    finally:
        store.close()
    healthy = not report["database"] and not report["cache"]
    lines = [f"database: {'ok' if not report['database'] else report['database'][0]}",
             f"cache:    {'ok' if not report['cache'] else report['cache'][0]}"]
    if "database_repair" in report:
        lines.append(f"database: {report['database_repair']}")
    if report["repaired"]:
        lines.append(f"repaired: search cache rebuilt from the database ({report['documents']} documents)")
        lost = report["lost_documents"]
        lines.append(f"lost:     {len(lost)} document(s) unreadable or with damaged vectors ({', '.join(lost[:5])})"
                     if lost else "lost:     nothing")
    _emit({**report, "healthy": healthy}, as_json, lines)
    if repair:
        if not report["repaired"]:
            return EXIT_FAILED
        return EXIT_PARTIAL if report["lost_documents"] else EXIT_OK
    return EXIT_OK if healthy else EXIT_FAILED
