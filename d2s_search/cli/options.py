"""Options, loaders and output shared by the command modules (nothing here imports a command)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import click

from d2s_search import extras, settings
from d2s_search.errors import BundleError, BundleMismatchError, IndexStoreError


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def prepare_search(store) -> float | None:
    """Have a local index build its search structures now (after ingest or prune), while the
    user expects to wait, not at the first query. Returns the seconds it took; None when the
    backend has nothing to build or it failed: that loses nothing (the documents are stored; the
    first search builds them) and is said in one warning line."""
    import time

    from d2s_search.errors import D2SError

    prepare = getattr(store, "prepare_search", None)
    if prepare is None:
        return None
    err = console(stderr=True)
    t0 = time.perf_counter()
    try:
        with err.status("preparing the search structures…"):  # shows nothing when stderr is not a terminal
            prepare()
    except D2SError as exc:
        click.echo(f"warning: the search structures were not prepared ({exc}); the first search builds them",
                   err=True)
        return None
    return time.perf_counter() - t0


def note_missing_compiled_parts(store) -> None:
    """A local index without its compiled parts (no C compiler at install time) works, only
    slower: said in one note line on stderr, at the first `index stats` or `serve` of an install."""
    if store.name != "local":
        return
    from d2s_search.backends.local import kernels

    missing = kernels.missing_compiled_parts()
    if missing and settings.first_time_here("noted_missing_compiled_parts", Path(kernels.__file__).parent):
        click.echo(f"note: this install has no compiled scoring code ({', '.join(missing)} not built: no C compiler "
                   "when it was installed); searches give the same results, slower. With a C compiler and Python's "
                   "headers, reinstall d2s-search to build it", err=True)


def bundle_option(f):
    return click.option(
        "--bundle", envvar="D2S_BUNDLE", show_envvar=True, type=click.Path(file_okay=False),
        help="Model bundle directory (default: the bundle that filled the index, else the one exported last).",
    )(f)


def _join_urls(ctx, param, values):
    return ",".join(values) or None  # the backend splits hosts at commas


# Repeatable; several hosts also as one comma-separated value (D2S_OPENSEARCH_URL=https://a:9200,https://b:9200).
url_option = click.option("--url", envvar="D2S_OPENSEARCH_URL", show_envvar=True, multiple=True, callback=_join_urls,
                          help="OpenSearch URL; repeat it (or separate with commas) for several hosts.")


def backend_options(f):
    options = [
        click.option("--backend", envvar="D2S_BACKEND", show_envvar=True, type=click.Choice(["local", "opensearch", "elasticsearch"]),
                     help="Where the index lives (default: opensearch when a URL is set, elasticsearch when "
                          "only D2S_ELASTICSEARCH_URL is set, else local)."),
        click.option("--index", envvar="D2S_INDEX", show_envvar=True, default="./d2s-index", show_default=True,
                     type=click.Path(file_okay=False), help="Folder of the embedded local index."),
        url_option,
        click.option("--index-name", envvar="D2S_OPENSEARCH_INDEX", default="d2s", show_default=True,
                     help="OpenSearch index name."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def search_threads_option(f):
    return click.option("--search-threads", envvar="D2S_SEARCH_THREADS", show_envvar=True, type=click.IntRange(0, 1024),
                        default=0, show_default=True,
                        help="Shards of a local index (65,536 pictures each) searched at once; 0: one per CPU.")(f)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print machine-readable JSON (errors too: {\"error\": {\"type\", \"message\"}}).")(f)


def device_option(f):
    return click.option("--device", envvar="D2S_DEVICE", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                        show_default=True, help="ONNX Runtime device (CUDA when it really loads).")(f)


backend_kind = settings.backend_kind  # which backend the flags and environment name


def make_backend(backend: str | None, index: str, url: str | None, index_name: str, threads: int = 1):
    from d2s_search.backends import open_backend

    kind = backend_kind(backend, url)
    if kind == "elasticsearch":
        return elasticsearch_backend(url, index_name)
    if kind == "opensearch":
        if not url:
            raise click.UsageError("--backend opensearch needs --url or D2S_OPENSEARCH_URL")
        extras.require("opensearch", who="--backend opensearch")
        from d2s_search.backends.opensearch.backend import OpenSearchBackend

        # Credentials, CA file and D2S_OPENSEARCH_INSECURE come from the environment only.
        return OpenSearchBackend.from_env(url=url, index_name=index_name)
    return open_backend("local", index=index, threads=threads)


def load_bundle(path: str | None, verify: bool = False):
    from d2s_search.bundle import Bundle

    return Bundle.load(settings.resolve_bundle_path(path), verify_hashes=verify)


# --- the index and the bundle that filled it ---------------------------------------------

def index_location(store) -> str:
    """Where an index lives, absolute: a folder for ``local``, URL/name for OpenSearch; safe to
    print (undecodable bytes escaped, no credentials)."""
    from d2s_search import redact
    from d2s_search.pathtext import path_to_text

    if store.name == "local":
        return path_to_text(os.path.abspath(store.path))
    return redact.strip_url_credentials(f"{store.url}/{store.index_name}")


def require_index(store) -> None:
    """Refuse early when there is no local index here, naming the one used last."""
    if store.name != "local" or store.exists():
        return
    where = Path(os.path.abspath(store.path))
    message = f"no index at {where}: ingest some images first (`d2s-search ingest PATH`)"
    last = settings.last_index()
    if last is not None and last != where.resolve() and (last / "index.sqlite").is_file():
        message += f"; the index used last is {last} (pass --index {last} or set D2S_INDEX)"
    raise IndexStoreError(message)


def remember_index(store) -> None:
    if store.name == "local":
        settings.remember_index(Path(store.path))


def recorded_identity(backend, index, url, index_name):
    """What an existing index records about the bundle that filled it (None: no index, or empty)."""
    peek = make_backend(backend, index, url, index_name)
    try:
        if not peek.exists():
            return None
        peek.open(None, create=False)
        return peek.identity
    finally:
        peek.close()


def bundle_for_index(given: str | None, recorded, where: str, verify: bool = False):
    """The bundle to use with an index: ``given`` if it matches the index; without one, the
    bundle that filled the index (its recorded path), else the one exported last."""
    from d2s_search.bundle import Bundle

    if recorded is not None and not recorded.fingerprint:  # an index that lost the record of its bundle
        return _bundle_for_unrecorded(given, recorded, where, verify)
    if given:
        bundle = load_bundle(given, verify)
        if recorded is not None and recorded.fingerprint and recorded.fingerprint != bundle.fingerprint:
            raise BundleMismatchError(
                f"index {where} was filled with bundle {_describe(recorded)}, not with {bundle.path.resolve()} "
                f"({bundle.fingerprint[:12]}, {bundle.model_name}); their vectors differ: leave out --bundle to use "
                "the recorded one, or re-ingest the images with this bundle into another --index"
            )
        return bundle
    damaged = None  # the recorded bundle is there but refused (a file changed): said as --bundle says it
    if recorded is not None and recorded.bundle_path:
        try:
            bundle = Bundle.load(recorded.bundle_path, verify_hashes=verify)
        except BundleError as exc:
            bundle = None
            if (Path(recorded.bundle_path) / "manifest.json").is_file():
                damaged = exc
        if bundle is not None and bundle.fingerprint == recorded.fingerprint:
            return bundle
    try:
        bundle = load_bundle(None, verify)
    except BundleError:
        if damaged is not None:
            raise damaged from None
        raise
    if recorded is not None and recorded.fingerprint and recorded.fingerprint != bundle.fingerprint:
        if damaged is not None:
            raise damaged from None
        gone = ", which is gone or now holds another bundle" if recorded.bundle_path else ""
        raise BundleMismatchError(
            f"index {where} was filled with bundle {_describe(recorded)}{gone}; the bundle exported last "
            f"({bundle.path.resolve()}, {bundle.fingerprint[:12]}) is another one: pass --bundle with the original, "
            "or use another --index"
        )
    return bundle


def _bundle_for_unrecorded(given: str | None, recorded, where: str, verify: bool):
    """An index holds documents but no longer records the bundle that filled them: never the
    bundle exported last behind the user's back, only one named with --bundle whose dense size
    is that of the stored vectors."""
    size = f" (its vectors have {recorded.dense_dim} dimensions)" if recorded.dense_dim else ""
    if not given:
        raise IndexStoreError(
            f"index {where} no longer records the bundle that filled it{size}; nothing was done: run "
            f"`d2s-search index check --index {where} --repair` to restore the record from what survives, or "
            "name that bundle with --bundle"
        )
    bundle = load_bundle(given, verify)
    made = bundle.identity().dense_dim
    if recorded.dense_dim and made != recorded.dense_dim:
        raise BundleMismatchError(
            f"index {where} holds {recorded.dense_dim}-dimensional vectors; {bundle.path.resolve()} "
            f"({bundle.fingerprint[:12]}, {bundle.model_name}) makes {made}-dimensional ones: it did not fill this "
            "index. Name the bundle that did with --bundle"
        )
    return bundle


def _describe(identity) -> str:
    model = f", {identity.model}" if identity.model else ""
    at = f" at {identity.bundle_path}" if identity.bundle_path else ""
    return f"{identity.fingerprint[:12]}{model}{at}"


class OpenedIndex(NamedTuple):
    bundle: Any
    store: Any
    created: bool  # this call created the index (it did not exist before)


def open_index(backend, index, url, index_name, bundle: str | None, *, create: bool, verify: bool = False,
               threads: int = 1) -> OpenedIndex:
    """The index at the given place, opened, with the bundle that belongs to it (``threads``:
    shards a local index searches at once)."""
    store = make_backend(backend, index, url, index_name, threads)
    if not create:
        require_index(store)
    recorded = recorded_identity(backend, index, url, index_name)
    chosen = bundle_for_index(bundle, recorded, index_location(store), verify)
    existed = store.exists()
    try:
        store.open(chosen.identity(), create=create)
    except BaseException:
        store.close()
        raise
    remember_index(store)
    return OpenedIndex(chosen, store, not existed)


# --- OpenSearch connection (index create/reindex, register-model) ------------------------

def connection_options(f):
    for option in reversed([
        url_option,
        click.option("--index-name", envvar="D2S_OPENSEARCH_INDEX", default="d2s", show_default=True,
                     help="OpenSearch index (an alias over <name>-000001, <name>-000002, ...)."),
        click.option("--insecure", is_flag=True, envvar="D2S_OPENSEARCH_INSECURE",
                     help="Do not verify the server's TLS certificate (local demo certificates only)."),
    ]):
        f = option(f)
    return f


def opensearch_backend(url: str | None, index_name: str, insecure: bool = False):
    """The backend from flags and D2S_OPENSEARCH_* variables (secrets only from the environment)."""
    if not url:
        raise click.UsageError("needs --url or D2S_OPENSEARCH_URL")
    extras.require("opensearch", who="OpenSearch")
    from d2s_search.backends.opensearch.backend import OpenSearchBackend

    # credentials, CA file, AWS SigV4 region/service and sniffing from D2S_OPENSEARCH_* variables
    return OpenSearchBackend.from_env(url=url, index_name=index_name, verify=False if insecure else None)


# --- Elasticsearch connection -------------------------------------------------------------


def elasticsearch_backend(url: str | None, index_name: str, insecure: bool = False, **options):
    """The backend from flags and D2S_ELASTICSEARCH_* variables (URL or cloud id; API key, user and
    password, CA file only from the environment)."""
    extras.require("elasticsearch", who="--backend elasticsearch")
    from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend

    url = url or os.environ.get("D2S_ELASTICSEARCH_URL")
    if not url and not os.environ.get("D2S_ELASTICSEARCH_CLOUD_ID"):
        raise click.UsageError("--backend elasticsearch needs --url, D2S_ELASTICSEARCH_URL or D2S_ELASTICSEARCH_CLOUD_ID")
    return ElasticsearchBackend.from_env(url=url, index_name=index_name, verify=False if insecure else None, **options)


def elastic_mapping_options(f):
    for option in reversed([
        click.option("--backend", type=click.Choice(["opensearch", "elasticsearch"]), default="opensearch",
                     show_default=True, help="Which engine the index lives in (Elasticsearch: --url or "
                     "D2S_ELASTICSEARCH_URL, secrets from D2S_ELASTICSEARCH_*)."),
        click.option("--sparse-type", type=click.Choice(["rank_features", "sparse_vector"]), default=None,
                     help="Elasticsearch: sparse field type (sparse_vector needs 8.11+, its query 8.15+). "
                          "Default: rank_features (reindex: keep the current one)."),
        click.option("--similarity", type=click.Choice(["dot_product", "max_inner_product"]), default=None,
                     help="Elasticsearch: dense similarity (dot_product needs unit vectors; "
                          "max_inner_product needs 8.11+). Default: dot_product."),
        click.option("--dense-index", type=click.Choice(["hnsw", "int8_hnsw"]), default=None,
                     help="Elasticsearch: HNSW graph of float or int8-quantised vectors (int8_hnsw needs 8.12+)."),
    ]):
        f = option(f)
    return f


# --- --engine ray (ingest, embed) ---------------------------------------------------------

def ray_engine_options(what_ray_does: str):
    """``--engine``, ``--address``, ``--cpus-per-worker``, ``--gpus-per-worker``; the command
    keeps its own ``--workers``."""
    def decorate(f):
        for option in reversed([
            click.option("--engine", type=click.Choice(["process", "ray"]), default="process", show_default=True,
                         help=f"process: this process encodes; ray: {what_ray_does}. Inputs and bundle must be "
                              "at the same paths on every node (docs/ray.md)."),
            click.option("--address", "ray_address", default=None, metavar="ADDR",
                         help="--engine ray: the Ray cluster to join (HOST:PORT, ray://HOST:PORT or auto; default: "
                              "RAY_ADDRESS, else a Ray instance on this machine for this run)."),
            click.option("--cpus-per-worker", type=click.FloatRange(0, min_open=True), default=1.0,
                         show_default=True, help="--engine ray: CPUs each worker reserves (also its encoder's threads)."),
            click.option("--gpus-per-worker", type=click.FloatRange(0), default=0.0, show_default=True,
                         help="--engine ray: GPUs each worker reserves (>0: it encodes on CUDA)."),
        ]):
            f = option(f)
        return f
    return decorate
