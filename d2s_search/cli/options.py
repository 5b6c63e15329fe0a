"""Options, loaders and output shared by the command modules (nothing here imports a command)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from d2s_search import extras, index_access, settings
from d2s_search.errors import SettingsError

# Re-exported: the command modules import them from here.
from d2s_search.index_access import (  # noqa: F401
    OpenedIndex,
    bundle_for_index,
    index_location,
    load_bundle,
    remember_index,
    require_index,
)


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


@contextmanager
def as_usage_error() -> Iterator[None]:
    """Settings that name no index are a usage error on the command line (exit 2, its --help)."""
    try:
        yield
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None


def make_backend(backend: str | None, index: str, url: str | None, index_name: str, threads: int = 1):
    with as_usage_error():
        return index_access.make_backend(backend, index, url, index_name, threads)


def recorded_identity(backend, index, url, index_name):
    """What an existing index records about the bundle that filled it (None: no index, or empty)."""
    with as_usage_error():
        return index_access.recorded_identity(backend, index, url, index_name)


def open_index(backend, index, url, index_name, bundle: str | None, *, create: bool, verify: bool = False,
               threads: int = 1) -> OpenedIndex:
    """The index at the given place, opened, with the bundle that belongs to it (``threads``:
    shards a local index searches at once)."""
    with as_usage_error():
        return index_access.open_index(backend, index, url, index_name, bundle, create=create, verify=verify,
                                       threads=threads)


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
    with as_usage_error():
        return index_access.elasticsearch_backend(url, index_name, insecure, **options)


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


def filter_options(command):
    """--after, --before, --folder, --where, --near: what a search (or the library) is narrowed to."""
    for decorator in reversed([
        click.option("--after", metavar="DATE", help="Only pictures taken on or after DATE (YYYY-MM-DD, or with "
                     "a time: 2019-06-01T14:30; no zone: UTC). A picture without EXIF date counts its file's time."),
        click.option("--before", metavar="DATE", help="Only pictures taken before DATE (--after 2019-06-01 "
                     "--before 2019-07-01 is June)."),
        click.option("--folder", "folders", multiple=True, metavar="PATH",
                     help="Only pictures in PATH or below it (any of their paths). Repeatable: either folder."),
        click.option("--where", "where", multiple=True, metavar="FIELD=VALUE",
                     help="Only pictures whose FIELD (camera, width, height, size_bytes, taken, or a field of "
                          "ingest --metadata) is =, !=, >=, >, <=, < VALUE. Repeatable: all hold, except that "
                          "several FIELD=VALUE of one field are alternatives."),
        click.option("--near", metavar="LAT,LON,KM", help="Only pictures whose GPS position is within KM "
                     "kilometres of LAT,LON."),
    ]):
        command = decorator(command)
    return command


def given_filters(after, before, folders, where, near) -> dict | None:
    """The filter options as Index.filter's keywords, or None when none was given."""
    if not (after or before or folders or where or near):
        return None
    return {"after": after, "before": before, "folders": list(folders), "where": list(where), "near": near}
