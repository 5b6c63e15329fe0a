"""The ``d2s-search`` command line: parse, call, print. Nothing clever lives here."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import click

from . import settings
from .cli_output import emit_json as _emit_json
from .errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, D2SError, HubUnreachableError

_DEBUG = {"on": os.environ.get("D2S_DEBUG") == "1"}


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="d2s-search")
def cli(debug: bool) -> None:
    """Text-to-image search on learned sparse (Dense2Sparse) vectors.

    \b
    d2s-search export-onnx                 # build the model bundle
    d2s-search ingest ./images             # encode and index a folder
    d2s-search query "dogs in a car"       # search it
    """
    if debug:
        _DEBUG["on"] = True


# --- shared options ----------------------------------------------------------------------

def bundle_option(f):
    return click.option(
        "--bundle", envvar="D2S_BUNDLE", show_envvar=True, type=click.Path(file_okay=False),
        help="Model bundle directory (default: the bundle exported last).",
    )(f)


def backend_options(f):
    options = [
        click.option("--backend", envvar="D2S_BACKEND", show_envvar=True, type=click.Choice(["local", "opensearch"]),
                     help="Where the index lives (default: opensearch when a URL is set, else local)."),
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
    from .backends import open_backend

    kind = backend or ("opensearch" if url else "local")
    if kind == "opensearch":
        if not url:
            raise click.UsageError("--backend opensearch needs --url or D2S_OPENSEARCH_URL")
        from .backends.opensearch import OpenSearchBackend

        # Credentials, CA file and D2S_OPENSEARCH_INSECURE come from the environment only.
        return OpenSearchBackend.from_env(url=url, index_name=index_name)
    return open_backend("local", index=index)


def load_bundle(path: str | None, verify: bool = False):
    from .bundle import Bundle

    return Bundle.load(settings.resolve_bundle_path(path), verify_hashes=verify)


# --- export-onnx -------------------------------------------------------------------------

@cli.command("export-onnx")
@click.option("--model", "model", default=None, help="Dense model: a built-in name, a hub id or a local checkpoint "
              "(default: blip-itm-base-coco, or offline-mini when the hub cannot be reached). See --list-models.")
@click.option("--head", type=click.Path(dir_okay=False, exists=True), help="Trained sparse head checkpoint "
              "(default: untrained head initialised from the vocabulary projection).")
@click.option("--out", type=click.Path(file_okay=False), help="Bundle directory (default: ./d2s-bundles/<model>).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True)
@click.option("--tolerance", type=float, default=1e-4, show_default=True, help="Max abs difference allowed vs torch (fp32).")
@click.option("--list-models", is_flag=True, help="List the built-in model names and exit.")
@json_option
def export_onnx(model, head, out, precision, tolerance, list_models, as_json) -> int:
    """Export a dense image-text model + sparse head to an ONNX model bundle."""
    from onnx_export.registry import DEFAULT_MODEL, available_models, load_config

    if list_models:
        names = available_models()
        if as_json:
            _emit_json({"models": [{"name": n, "description": load_config(n).get("description", "")} for n in names]})
        else:
            for n in names:
                click.echo(f"{n:24s} {load_config(n).get('description', '')}")
        return EXIT_OK
    explicit = model is not None
    model = model or DEFAULT_MODEL
    config = load_config(model)
    if config.get("hub_id") and not config.get("random_init"):
        from onnx_export.hub import ensure_hub_reachable

        try:
            ensure_hub_reachable(config["hub_id"])  # before torch and transformers take seconds to import
        except HubUnreachableError:
            from onnx_export.offline_fallback import (
                OFFLINE_MODEL,
                fallback_note,
                missing_offline_packages,
            )

            if explicit or missing_offline_packages():
                raise  # asked for this model by name, or the offline extra is not installed
            click.echo(fallback_note(f"the Hugging Face hub cannot be reached for {config['hub_id']}"), err=True)
            model, config = OFFLINE_MODEL, load_config(OFFLINE_MODEL)
    from onnx_export.export import export_bundle

    out_dir = Path(out) if out else Path("d2s-bundles") / Path(model).name.replace("/", "--")
    err = _console(stderr=True)
    with err.status(f"exporting {model}") as status:
        result = export_bundle(model, out_dir, head_path=head, precision=precision, tolerance=tolerance,
                               overwrite=True, progress=lambda msg: status.update(msg))
    settings.remember_bundle(result.bundle.path)
    summary = result.bundle.summary() | {"parity_max_abs_diff": result.parity, "seconds": round(result.seconds, 2)}
    if as_json:
        _emit_json(summary)
    else:
        worst = max(v for g in result.parity.values() for v in g.values())
        trained = "trained head" if summary["head_trained"] else "untrained head (vocabulary init)"
        click.echo(f"bundle {result.bundle.path}  ({summary['model']}, {trained}, {precision})")
        click.echo(f"  dense dim {summary['dense_dim']}, vocabulary {summary['vocab_size']}, fingerprint {summary['fingerprint']}")
        click.echo(f"  parity vs torch: max abs diff {worst:.1e}  ({result.seconds:.1f}s)")
    return EXIT_OK


# --- ingest ------------------------------------------------------------------------------

@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@bundle_option
@backend_options
@device_option
@click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True, help="Decoding threads.")
@click.option("--top-k", type=click.IntRange(1), default=None, help="Keep only the k strongest terms per image.")
@click.option("--max-pixels", type=click.IntRange(1), default=None, help="Refuse images larger than this (default 120 MP).")
@click.option("--url-base", envvar="D2S_URL_BASE", default=None,
              help="Store each image's URL as URL_BASE + its path under the ingested folder (see serve-images).")
@json_option
def ingest(paths, bundle, backend, index, url, index_name, device, batch_size, workers, top_k, max_pixels, url_base,
           as_json) -> int:
    """Encode the images under PATHS and store them in the index."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from .encoder import Encoder
    from .image_urls import url_builder
    from .images import DEFAULT_MAX_PIXELS
    from .ingest import ingest as run_ingest

    url_for = url_builder(url_base, paths) if url_base else None  # a bad base fails before any work
    bundle_obj = load_bundle(bundle, verify=True)
    store = make_backend(backend, index, url, index_name)
    store.open(bundle_obj.identity(), create=True)
    encoder = Encoder(bundle_obj, device=device)
    err = _console(stderr=True)
    progress = Progress(
        TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(), console=err, transient=as_json, disable=as_json and not err.is_terminal,
    )
    state = {"task": None, "t0": 0.0}

    def on_start(total: int) -> None:
        import time

        state["t0"] = time.perf_counter()
        state["task"] = progress.add_task("ingest", total=total, rate="")

    def on_progress(done: int, stored: int) -> None:
        import time

        elapsed = time.perf_counter() - state["t0"]
        rate = f"{stored / elapsed:.1f} images/s" if elapsed > 0 and stored else ""
        progress.update(state["task"], completed=done, rate=rate)

    try:
        with progress:
            report = run_ingest(
                paths, encoder, store, batch_size=batch_size, workers=workers, top_k=top_k,
                max_pixels=max_pixels or DEFAULT_MAX_PIXELS, on_start=on_start, on_progress=on_progress,
                url_for=url_for,
            )
    finally:
        store.close()
    code = EXIT_PARTIAL if report.rejected else EXIT_OK
    if as_json:
        _emit_json(report.to_json() | {"exit_code": code})
        return code
    for path, reason in report.rejected:
        click.echo(f"rejected {path}: {reason}", err=True)
    click.echo(
        f"stored {report.stored} new image(s) of {report.found} found; {report.already_stored} already stored, "
        f"{report.duplicates} duplicate(s), {len(report.rejected)} rejected  "
        f"({report.seconds:.1f}s, {report.images_per_second:.1f} images/s)"
    )
    return code


# --- query -------------------------------------------------------------------------------

@cli.command()
@click.argument("text", required=False)
@click.option("--image", "image_path", type=click.Path(dir_okay=False), help="Search by an image instead of text.")
@click.option("--mode", type=click.Choice(["sparse", "two-phase", "dense", "hybrid"]), default="sparse", show_default=True)
@click.option("-k", "k", type=click.IntRange(1, 10000), default=10, show_default=True)
@click.option("--window", type=click.IntRange(1), default=None, help="Candidates for two-phase/hybrid (default max(100, 10k)).")
@click.option("--fusion", type=click.Choice(["minmax", "rrf"]), default="minmax", show_default=True)
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True, help="Dense weight in min-max fusion.")
@click.option("--explain", type=click.IntRange(0, 100), default=5, show_default=True, help="Matched terms shown per hit.")
@click.option("--server-side", is_flag=True, help="OpenSearch encodes the text (neural_sparse with the model "
              "from register-model; falls back to the search template d2s-sparse).")
@click.option("--model-id", envvar="D2S_OPENSEARCH_MODEL_ID", help="ml-commons model for --server-side "
              "(default: the one registered for the bundle).")
@bundle_option
@backend_options
@device_option
@json_option
def query(text, image_path, mode, k, window, fusion, alpha, explain, server_side, model_id, bundle, backend, index, url,
          index_name, device, as_json) -> int:
    """Search the index by TEXT (or --image PATH)."""
    from .encoder import Encoder
    from .errors import QueryError
    from .search import SearchOptions, encode_image_query, encode_text_query, run_query

    if (text is None) == (image_path is None):
        raise click.UsageError("give either TEXT or --image PATH")
    if server_side and (image_path or mode != "sparse"):
        raise click.UsageError("--server-side searches by TEXT with the sparse plan")
    options = SearchOptions(mode=mode, k=k, window=window, fusion=fusion, alpha=alpha, explain=explain)
    bundle_obj = load_bundle(bundle)
    store = make_backend(backend, index, url, index_name)
    if server_side and store.name != "opensearch":
        raise click.UsageError("--server-side needs --url or D2S_OPENSEARCH_URL")
    try:
        store.open(bundle_obj.identity(), create=False)
        if server_side:
            from .server_side import run_server_side

            result = run_server_side(store, text, k=k, explain=explain, model_id=model_id, bundle=bundle_obj,
                                     encoder_factory=lambda: Encoder(bundle_obj, device=device))
            return _show_result(result, as_json)
        encoder = Encoder(bundle_obj, device=device)
        if image_path:
            from .errors import ImageRejected
            from .images import load_image

            try:
                vectors = encode_image_query(encoder, load_image(Path(image_path)).image)
            except ImageRejected as exc:
                raise QueryError(f"cannot use {image_path} as a query: {exc}") from None
        else:
            vectors = encode_text_query(encoder, text)
        result = run_query(store, vectors, options)
    finally:
        store.close()
    return _show_result(result, as_json)


def _show_result(result, as_json: bool) -> int:
    if as_json:
        _emit_json(result.to_json())
    else:
        _print_hits(result)
    return EXIT_OK


def _print_hits(result) -> None:
    from rich.table import Table

    if not result.hits:
        click.echo(f"no results ({result.mode}, {result.took_ms:.1f} ms)")
        return
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("path", overflow="fold")
    table.add_column("matched terms", overflow="fold")
    for rank, hit in enumerate(result.hits, start=1):
        matched = ", ".join(f"{t} {c:.2f}" for t, c in hit.matched)
        table.add_row(str(rank), f"{hit.score:.4f}", _short_path(hit.path), matched)
    console = _console()
    console.print(table)
    console.print(f"[dim]{len(result.hits)} result(s), {result.mode}, {result.took_ms:.1f} ms[/dim]")


def _short_path(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


# --- index -------------------------------------------------------------------------------

@cli.group()
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
    if not yes and not click.confirm(f"delete the index at {where}?", err=True):
        return EXIT_FAILED
    store.drop()
    if as_json:
        _emit_json({"deleted": where})
    else:
        click.echo(f"deleted {where}")
    return EXIT_OK


def _register_optional_commands() -> None:
    """Commands that live in their own modules (each imports its heavy parts lazily)."""
    from .cli_align import align
    from .cli_dashboards import dashboards, serve_images
    from .cli_ml_commons import register_model
    from .cli_opensearch import index_create, index_reindex
    from .cli_serve import serve
    from .cli_train import embed, evaluate_cmd, train

    index.add_command(index_create)
    index.add_command(index_reindex)
    for command in (dashboards, serve_images, register_model, serve, train, evaluate_cmd, embed, align):
        cli.add_command(command)


_register_optional_commands()


# --- entry point -------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    """Run the CLI: one-line errors, documented exit codes (0 ok, 1 failed, 2 usage, 3 partial)."""
    try:
        flat = settings.load_config()
        code = cli.main(args=argv, prog_name="d2s-search", standalone_mode=False,
                        default_map=settings.default_map_for(cli, flat))
    except (click.exceptions.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
        click.echo("interrupted: everything stored so far is kept; run the same command again to continue", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except D2SError as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else EXIT_OK)


if __name__ == "__main__":
    main()
