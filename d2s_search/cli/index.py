"""``d2s-search index``: create, inspect, reindex or delete an index (local or OpenSearch)."""

from __future__ import annotations

from collections.abc import Callable

import click

from d2s_search.backends.base import Document, PathListing
from d2s_search.cli.options import (
    backend_options,
    connection_options,
    elastic_mapping_options,
    elasticsearch_backend,
    index_location,
    json_option,
    load_bundle,
    make_backend,
    note_missing_compiled_parts,
    opensearch_backend,
    prepare_search,
    remember_index,
    require_index,
)
from d2s_search.cli.output import echo_line
from d2s_search.cli.output import emit as _emit
from d2s_search.cli.output import emit_json as _emit_json
from d2s_search.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, D2SError, ImageRejected
from d2s_search.index_access import describe_index, missing_files
from d2s_search.sources import exists


@click.group()
def index() -> None:
    """Create, inspect, prune, reindex or delete an index."""


@index.command("stats")
@backend_options
@json_option
def index_stats(backend, index, url, index_name, as_json) -> int:
    """Documents, terms, bundle, size, and how many stored files are missing."""
    store = make_backend(backend, index, url, index_name)
    require_index(store)
    try:
        store.open(None, create=False)
        stats = describe_index(store)  # what the Python API's Index.stats() gives too
    finally:
        store.close()
    remember_index(store)
    note_missing_compiled_parts(store)
    if as_json:
        _emit_json(stats)
    else:
        for key, value in stats.items():
            echo_line(f"{key:26s} {value}")  # the location and bundle path may hold any character
        if stats.get("missing_files"):
            click.echo(f"{stats['missing_files']} stored file(s) are gone: `d2s-search index prune` removes them "
                       "(re-ingest moved folders first: moved pictures keep their documents)", err=True)
    return EXIT_OK


_missing = missing_files


def _paths_per_document(store) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(id -> how many paths the document has, the (id, path) pairs whose file is gone)."""
    counts: dict[str, int] = {}
    missing = []
    for doc_id, path in store.document_paths():
        counts[doc_id] = counts.get(doc_id, 0) + 1
        if not exists(path):  # a local file, or a URI (object store) read through pyarrow
            missing.append((doc_id, path))
    return counts, missing


@index.command("prune")
@backend_options
@click.option("--dry-run", is_flag=True, help="Only list the stored files that are gone; remove nothing.")
@click.option("--yes", is_flag=True, help="Also prune when every stored file is gone (e.g. an unmounted drive).")
@json_option
def index_prune(backend, index, url, index_name, dry_run, yes, as_json) -> int:
    """Remove the stored paths whose image file is gone, and the documents left without one
    (a picture with a copy elsewhere keeps its document; re-ingest moved folders first)."""
    store = make_backend(backend, index, url, index_name)
    require_index(store)
    if not isinstance(store, PathListing):
        raise click.UsageError(f"index prune needs a backend that lists stored paths; {store.name} does not")
    try:
        store.open(None, create=False)
        from d2s_search.user_documents import holds_user_ids

        if holds_user_ids(store):
            raise D2SError(f"{index_location(store)} holds documents under your ids (ingest --documents): they are "
                           "removed by id, not by missing file (delete them with the cluster's API)")
        total = store.stats()["documents"]
        counts, missing = _paths_per_document(store)
        if missing and len(missing) == sum(counts.values()) and not dry_run and not yes:
            raise D2SError(f"every one of the {total} stored files is gone (an unmounted drive or a moved folder?): "
                           "nothing removed; re-ingest the folder at its new place, or pass --yes to prune them all")
        gone_per_document: dict[str, int] = {}
        for doc_id, _ in missing:
            gone_per_document[doc_id] = gone_per_document.get(doc_id, 0) + 1
        doomed = sum(1 for doc_id, n in gone_per_document.items() if n >= counts[doc_id])
        removed = 0 if dry_run else store.relink(gone=[p for _, p in missing])
        seconds = prepare_search(store) if missing and not dry_run else None
    finally:
        store.close()
    kept = len(gone_per_document) - doomed  # documents that lose a path and keep a copy
    payload = {"location": index_location(store), "documents": total, "missing": [p for _, p in missing],
               "removed": removed, "without_any_file": doomed, "kept_by_a_copy": kept, "dry_run": dry_run,
               **({"search_structures_seconds": round(seconds, 3)} if seconds is not None else {})}
    verb = "would remove" if dry_run else "removed"
    copies = f"; {kept} more keep a copy elsewhere (only the gone path dropped)" if kept else ""
    _emit(payload, as_json, [f"gone: {p}" for _, p in missing]
          + [f"{verb} {doomed if dry_run else removed} of {total} document(s) whose files are all gone{copies}"])
    return EXIT_OK


@index.command("delete")
@backend_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed when not run from a terminal).")
@json_option
def index_delete(backend, index, url, index_name, yes, as_json) -> int:
    """Delete the whole index (the images themselves are not touched)."""
    import sys

    store = make_backend(backend, index, url, index_name)
    where = index_location(store)  # never with the URL's credentials
    try:
        if not store.exists():
            raise D2SError(f"no index to delete at {where}")
        refusal = getattr(store, "why_not_droppable", lambda: None)()  # local: refuse before asking
        if refusal:
            raise D2SError(refusal)
        if not yes:
            if not sys.stdin.isatty():
                raise click.UsageError(f"not asking without a terminal: pass --yes to delete the index at {where}")
            if not click.confirm(f"delete the index at {where}?", err=True):
                raise D2SError(f"not deleted: the index at {where} is unchanged")
        dropped = store.drop()
        # Success only when the index is really gone (a proxy may answer 200 and do nothing).
        if (isinstance(dropped, list) and not dropped) or store.exists():
            raise D2SError(f"nothing was deleted at {where}: the index is still there")
    finally:
        store.close()
    payload = {"deleted": where} | ({"indices": dropped} if isinstance(dropped, list) else {})
    _emit(payload, as_json, [f"deleted {where}"])
    return EXIT_OK


def mapping_options(f):
    for option in reversed([
        click.option("--engine", type=click.Choice(["faiss", "lucene"]), default="faiss", show_default=True,
                     help="k-NN engine of the dense HNSW field."),
        click.option("--shards", type=click.IntRange(1), default=1, show_default=True,
                     help="Primary shards of the new index."),
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
@click.option("--sparse-index", type=click.Choice(["rank_features", "seismic"]), default="rank_features",
              show_default=True, help="seismic: approximate sparse_vector index for collections past a few "
              "million images (OpenSearch 3.3+; see the README for its trade-offs).")
@elastic_mapping_options
@json_option
def index_create(bundle, url, index_name, insecure, engine, shards, replicas, pipelines, sparse_index, as_json,
                 **elastic) -> int:
    """Create the OpenSearch index (mappings/index.json) and its hybrid search pipelines,
    or with --backend elasticsearch the Elasticsearch index (mappings/elasticsearch/)."""
    if _is_elastic(elastic):
        return _elastic_create(bundle, url, index_name, insecure, shards, replicas, as_json, **elastic)
    bundle_obj = load_bundle(bundle)
    identity = bundle_obj.identity()
    store = opensearch_backend(url, index_name, insecure)
    try:
        existed = store.exists()
        store.open(identity, create=True, engine=engine, shards=shards, replicas=replicas, sparse_index=sparse_index,
                   vocabulary=bundle_obj.terms if sparse_index == "seismic" else None)
        installed, warnings = [], []
        # A SEISMIC index fuses hybrid here (its dense vectors are in a sibling): no pipeline.
        if pipelines and not store.dense_index:
            for method in ("min_max", "rrf"):
                try:
                    installed.append(store.ensure_pipeline(method))
                except Exception as exc:  # the index is usable without them
                    warnings.append(str(exc))
        stats = store.stats()
    finally:
        store.close()
    layout = _layout(store, stats)
    payload = {"index": index_name, "created": not existed, "indices": stats["indices"],
               "bundle_fingerprint": identity.fingerprint, "dense_dim": identity.dense_dim,
               "pipelines": installed, "warnings": warnings, "layout": layout}
    verb = "exists already for this bundle" if existed else "created"
    _emit(payload, as_json, [f"index {index_name} {verb} at {store.url} ({', '.join(stats['indices'])})"]
          + ([f"layout: {layout}"] if layout else [])
          + [f"search pipeline {p} ready" for p in installed] + [f"warning: {w}" for w in warnings])
    return EXIT_OK


def _layout(store, stats: dict) -> str | None:
    """What differs from one index holding both vectors (None: nothing)."""
    if store.dense_index:
        return (f"SEISMIC sparse vectors in {', '.join(stats['indices'])} (no k-NN there: k-NN and neural-search "
                f"cannot share one index), dense vectors in {store.dense_index}; hybrid runs both searches and "
                "fuses them here (client-minmax or client-rrf)")
    if store.content_ids:
        return ("Amazon OpenSearch Serverless: the collection assigns document ids, so each document's content "
                "hash is its content_id field; no _refresh, no scroll, no reindex")
    return None


@index.command("reindex")
@click.option("--bundle", envvar="D2S_BUNDLE", type=click.Path(file_okay=False),
              help="Move to this bundle: every image is read again from its stored path and re-encoded.")
@connection_options
@mapping_options
@click.option("--keep-old", is_flag=True, help="Keep the previous index (the alias moves either way).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime device for re-encoding (CUDA when it really loads).")
@elastic_mapping_options
@json_option
def index_reindex(bundle, url, index_name, insecure, engine, shards, replicas, keep_old, device, as_json,
                  **elastic) -> int:
    """Copy the index into a new one (new mapping and/or bundle), then swap the alias.

    Nothing changes unless every document made it: the new index is removed otherwise.
    Stop ingests while this runs.
    """
    if _is_elastic(elastic):
        return _elastic_reindex(bundle, url, index_name, insecure, shards, replicas, keep_old, device, as_json,
                                **elastic)
    store = opensearch_backend(url, index_name, insecure)
    try:
        store.open(None, create=False)
        identity, reencode = _reindex_target(store, bundle, device)
        out = store.reindex(identity, reencode, engine=engine, shards=shards, replicas=replicas, keep_old=keep_old)
    finally:
        store.close()
    _emit(out, as_json, [_reindexed_line(out, index_name)])
    return EXIT_OK


def make_reencoder(bundle, device: str = "auto") -> Callable[[Document], Document | None]:
    """Document -> the same image encoded with ``bundle``; None when its file is gone or changed."""
    from d2s_search.encoder import Encoder
    from d2s_search.images import content_id, decode
    from d2s_search.sources import read as read_source

    encoder = Encoder(bundle, device=device)
    draft = int(bundle.image_settings["size"]) * 2

    def readable(doc: Document) -> bytes | None:
        """The document's bytes from the first of its paths that still holds them."""
        for path in doc.paths:
            try:
                data = read_source(path)
            except (OSError, ImageRejected):
                continue
            if content_id(data) == doc.id:  # else changed since ingest: `ingest` stores it anew
                return data
        return None

    def reencode(doc: Document) -> Document | None:
        data = readable(doc)
        if data is None:
            return None
        try:
            image, width, height = decode(data, draft_size=draft)
        except (OSError, ImageRejected):
            return None
        dense, sparse = encoder.encode_pixels(encoder.preprocess(image)[None])
        return Document(id=doc.id, path=doc.path, size_bytes=len(data), width=width, height=height,
                        sparse=encoder.to_terms(sparse[0]), dense=dense[0], url=doc.url,
                        ingested_at=doc.ingested_at, copies=doc.copies)

    return reencode


# --- Elasticsearch (index create / reindex --backend elasticsearch) -----------------------


def _is_elastic(options: dict) -> bool:
    """Pop --backend; Elasticsearch-only options with the OpenSearch backend are a usage error."""
    if options.pop("backend") == "elasticsearch":
        return True
    given = [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
    if given:
        raise click.UsageError(f"{', '.join(given)} only apply with --backend elasticsearch")
    return False


def _vector_mapping(current, sparse_type, similarity, dense_index):
    from d2s_search.backends.elasticsearch.queries import VectorMapping

    base = current or VectorMapping()
    return VectorMapping(sparse_type=sparse_type or base.sparse_type, similarity=similarity or base.similarity,
                         index_type=dense_index or base.index_type)


def _elastic_create(bundle, url, index_name, insecure, shards, replicas, as_json, *, sparse_type, similarity,
                    dense_index) -> int:
    identity = load_bundle(bundle).identity()
    store = elasticsearch_backend(url, index_name, insecure,
                                  mapping=_vector_mapping(None, sparse_type, similarity, dense_index))
    try:
        existed = store.exists()
        store.open(identity, create=True, shards=shards, replicas=replicas)
        stats = store.stats()
    finally:
        store.close()
    payload = {"index": index_name, "created": not existed, "indices": stats["indices"],
               "bundle_fingerprint": identity.fingerprint, "dense_dim": identity.dense_dim,
               "server_version": stats["server_version"], "sparse_type": stats["sparse_type"],
               "similarity": stats["similarity"], "dense_index": stats["dense_index"]}
    verb = "exists already for this bundle" if existed else "created"
    _emit(payload, as_json, [f"index {index_name} {verb} at {store.url} ({', '.join(stats['indices'])}; "
                             f"{stats['sparse_type']}, {stats['similarity']}, {stats['dense_index']}; "
                             f"Elasticsearch {stats['server_version']})"])
    return EXIT_OK


def _elastic_reindex(bundle, url, index_name, insecure, shards, replicas, keep_old, device, as_json, *,
                     sparse_type, similarity, dense_index) -> int:
    store = elasticsearch_backend(url, index_name, insecure)
    try:
        store.open(None, create=False)
        identity, reencode = _reindex_target(store, bundle, device)
        mapping = _vector_mapping(store.mapping, sparse_type, similarity, dense_index)
        out = store.reindex(identity, reencode, mapping=mapping, shards=shards, replicas=replicas, keep_old=keep_old)
    finally:
        store.close()
    _emit(out, as_json, [_reindexed_line(out, index_name)])
    return EXIT_OK


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
    lines = [f"database: {problem}" for problem in report["database"][:5]] or ["database: ok"]
    lines.append(f"cache:    {'ok' if not report['cache'] else report['cache'][0]}")
    if "database_repair" in report:
        lines.append(f"database: {report['database_repair']}")
    if report.get("identity_repair"):
        lines.append(f"identity: restored {'; '.join(report['identity_repair'])}")
    if report["repaired"]:
        lines.append(f"repaired: search cache rebuilt from the database ({report['documents']} documents)")
        lost = report["lost_documents"]
        lines.append(f"lost:     {len(lost)} document(s) ({', '.join(lost[:5])}"
                     f"{' …' if len(lost) > 5 else ''}): ingest their files again to restore them"
                     if lost else "lost:     no document")
        lines += [f"lost:     {part}" for part in report.get("lost_parts", [])]
    lines += [f"unknown:  {what}" for what in report.get("unresolved", [])]
    _emit({**report, "healthy": healthy}, as_json, lines)
    if repair:
        if not report["repaired"]:
            return EXIT_FAILED
        partial = report["lost_documents"] or report.get("lost_parts") or report.get("unresolved")
        return EXIT_PARTIAL if partial else EXIT_OK
    return EXIT_OK if healthy else EXIT_FAILED


def _reindex_target(store, bundle, device):
    """(identity, re-encoder) for reindex: the bundle's identity, and a re-encoder only when the
    bundle differs from the one the index was built with (either engine)."""
    identity, reencode = None, None
    if bundle:
        loaded = load_bundle(bundle)
        identity = loaded.identity()
        if store.identity and identity.fingerprint != store.identity.fingerprint:
            reencode = make_reencoder(loaded, device)
    return identity, reencode


def _reindexed_line(out: dict, index_name: str) -> str:
    return (f"reindexed {out['documents']} documents: {index_name} now points at {out['to']} "
            f"(was {out['from']}{', kept' if out['kept_old'] else ', deleted'})")
