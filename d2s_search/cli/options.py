"""Options, loaders and output shared by the command modules (nothing here imports a command)."""

from __future__ import annotations

import os

import click

from d2s_search import settings


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def bundle_option(f):
    return click.option(
        "--bundle", envvar="D2S_BUNDLE", show_envvar=True, type=click.Path(file_okay=False),
        help="Model bundle directory (default: the bundle exported last).",
    )(f)


def backend_options(f):
    options = [
        click.option("--backend", envvar="D2S_BACKEND", show_envvar=True, type=click.Choice(["local", "opensearch", "elasticsearch"]),
                     help="Where the index lives (default: opensearch when a URL is set, elasticsearch when "
                          "only D2S_ELASTICSEARCH_URL is set, else local)."),
        click.option("--index", envvar="D2S_INDEX", show_envvar=True, default="./d2s-index", show_default=True,
                     type=click.Path(file_okay=False), help="Folder of the embedded local index."),
        click.option("--url", envvar="D2S_OPENSEARCH_URL", show_envvar=True, help="OpenSearch URL."),
        click.option("--index-name", envvar="D2S_OPENSEARCH_INDEX", default="d2s", show_default=True,
                     help="OpenSearch index name."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)


def device_option(f):
    return click.option("--device", envvar="D2S_DEVICE", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                        show_default=True, help="ONNX Runtime device (CUDA when it really loads).")(f)


def make_backend(backend: str | None, index: str, url: str | None, index_name: str):
    from d2s_search.backends import open_backend

    kind = backend or ("opensearch" if url else "elasticsearch" if os.environ.get("D2S_ELASTICSEARCH_URL") else "local")
    if kind == "elasticsearch":
        return elasticsearch_backend(url, index_name)
    if kind == "opensearch":
        if not url:
            raise click.UsageError("--backend opensearch needs --url or D2S_OPENSEARCH_URL")
        from d2s_search.backends.opensearch.backend import OpenSearchBackend

        # Credentials, CA file and D2S_OPENSEARCH_INSECURE come from the environment only.
        return OpenSearchBackend.from_env(url=url, index_name=index_name)
    return open_backend("local", index=index)


def load_bundle(path: str | None, verify: bool = False):
    from d2s_search.bundle import Bundle

    return Bundle.load(settings.resolve_bundle_path(path), verify_hashes=verify)


# --- OpenSearch connection (index create/reindex, register-model) ------------------------

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


def opensearch_backend(url: str | None, index_name: str, insecure: bool = False):
    """The backend from flags and D2S_OPENSEARCH_* variables (secrets only from the environment)."""
    from d2s_search.backends.opensearch.backend import OpenSearchBackend

    if not url:
        raise click.UsageError("needs --url or D2S_OPENSEARCH_URL")
    options = {k: os.environ[v] for k, v in _ENV.items() if os.environ.get(v)}
    return OpenSearchBackend(url, index_name=index_name, verify=not insecure, **options)


# --- Elasticsearch connection -------------------------------------------------------------


def elasticsearch_backend(url: str | None, index_name: str, insecure: bool = False, **options):
    """The backend from flags and D2S_ELASTICSEARCH_* variables (URL or cloud id; API key, user and
    password, CA file only from the environment)."""
    from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend

    try:
        import elasticsearch  # noqa: F401
    except ImportError:
        raise click.UsageError("--backend elasticsearch needs the client: pip install 'd2s-search[elasticsearch]'") from None
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
