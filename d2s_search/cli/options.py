"""Options, loaders and output shared by the command modules (nothing here imports a command)."""

from __future__ import annotations

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


def _join_urls(ctx, param, values):
    return ",".join(values) or None  # the backend splits hosts at commas


# Repeatable; several hosts also as one comma-separated value (D2S_OPENSEARCH_URL=https://a:9200,https://b:9200).
url_option = click.option("--url", envvar="D2S_OPENSEARCH_URL", show_envvar=True, multiple=True, callback=_join_urls,
                          help="OpenSearch URL; repeat it (or separate with commas) for several hosts.")


def backend_options(f):
    options = [
        click.option("--backend", envvar="D2S_BACKEND", show_envvar=True, type=click.Choice(["local", "opensearch"]),
                     help="Where the index lives (default: opensearch when a URL is set, else local)."),
        click.option("--index", envvar="D2S_INDEX", show_envvar=True, default="./d2s-index", show_default=True,
                     type=click.Path(file_okay=False), help="Folder of the embedded local index."),
        url_option,
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

    kind = backend or ("opensearch" if url else "local")
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
    from d2s_search.backends.opensearch.backend import OpenSearchBackend

    if not url:
        raise click.UsageError("needs --url or D2S_OPENSEARCH_URL")
    # credentials, CA file, AWS SigV4 region/service and sniffing from D2S_OPENSEARCH_* variables
    return OpenSearchBackend.from_env(url=url, index_name=index_name, verify=False if insecure else None)
