"""OpenSearch parts of ``d2s-search index``: create, reindex, and the extra stats fields.

The lead registers these in ``cli.py`` (inside the ``index`` group)::

    from .cli_opensearch import index_create, index_reindex
    index.add_command(index_create)
    index.add_command(index_reindex)

Both take the same connection options as the other commands (``--url`` or
``D2S_OPENSEARCH_URL``; credentials only from ``D2S_OPENSEARCH_USER`` /
``D2S_OPENSEARCH_PASSWORD`` / ``D2S_OPENSEARCH_API_KEY`` and ``D2S_OPENSEARCH_CA_FILE``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click

from .backends.base import Document
from .cli_output import emit as _emit
from .errors import EXIT_OK, ImageRejected

_ENV = {
    "user": "D2S_OPENSEARCH_USER",
    "password": "D2S_OPENSEARCH_PASSWORD",
    "api_key": "D2S_OPENSEARCH_API_KEY",
    "ca_file": "D2S_OPENSEARCH_CA_FILE",
}


def connection_options(f):
    for option in reversed([
        click.option("--url", envvar="D2S_OPENSEARCH_URL", show_envvar=True, help="OpenSearch URL."),
        click.option("--index-name", envvar="D2S_OPENSEARCH_INDEX", default="d2s", show_default=True,
                     help="OpenSearch index (an alias over <name>-000001, <name>-000002, ...)."),
        click.option("--insecure", is_flag=True, envvar="D2S_OPENSEARCH_INSECURE",
                     help="Do not verify the server's TLS certificate (local demo certificates only)."),
    ]):
        f = option(f)
    return f


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


def opensearch_backend(url: str | None, index_name: str, insecure: bool = False):
    """The backend from flags and D2S_OPENSEARCH_* variables (secrets only from the environment)."""
    from .backends.opensearch import OpenSearchBackend

    if not url:
        raise click.UsageError("needs --url or D2S_OPENSEARCH_URL")
    options = {k: os.environ[v] for k, v in _ENV.items() if os.environ.get(v)}
    return OpenSearchBackend(url, index_name=index_name, verify=not insecure, **options)




@click.command("create")
@click.option("--bundle", envvar="D2S_BUNDLE", type=click.Path(file_okay=False),
              help="Model bundle whose fingerprint and dense size the index records (default: the last exported).")
@connection_options
@mapping_options
@click.option("--pipelines/--no-pipelines", default=True, show_default=True,
              help="Also install the hybrid search pipelines (needs the neural-search plugin).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def index_create(bundle, url, index_name, insecure, engine, shards, replicas, pipelines, as_json) -> int:
    """Create the OpenSearch index (mappings/index.json) and its hybrid search pipelines."""
    from .cli import load_bundle

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


@click.command("reindex")
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
            from .cli import load_bundle

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
    from .encoder import Encoder
    from .images import content_id, decode, read_bytes

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
