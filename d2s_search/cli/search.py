"""``d2s-search ingest`` and ``d2s-search query``: fill the index, search it, print hits."""

from __future__ import annotations

import os
from pathlib import Path

import click

from d2s_search.cli.options import (
    backend_options,
    bundle_option,
    console,
    device_option,
    json_option,
    load_bundle,
    make_backend,
)
from d2s_search.cli.output import emit_json as _emit_json
from d2s_search.errors import EXIT_OK, EXIT_PARTIAL


@click.command()
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

    from d2s_search.encoder import Encoder
    from d2s_search.images import DEFAULT_MAX_PIXELS
    from d2s_search.ingest import ingest as run_ingest
    from d2s_search.serve.image_urls import url_builder

    url_for = url_builder(url_base, paths) if url_base else None  # a bad base fails before any work
    bundle_obj = load_bundle(bundle, verify=True)
    store = make_backend(backend, index, url, index_name)
    store.open(bundle_obj.identity(), create=True)
    encoder = Encoder(bundle_obj, device=device)
    err = console(stderr=True)
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

@click.command()
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
    from d2s_search.encoder import Encoder
    from d2s_search.errors import QueryError
    from d2s_search.search import SearchOptions, encode_image_query, encode_text_query, run_query

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
            from d2s_search.backends.opensearch.server_side import run_server_side

            result = run_server_side(store, text, k=k, explain=explain, model_id=model_id, bundle=bundle_obj,
                                     encoder_factory=lambda: Encoder(bundle_obj, device=device))
            return _show_result(result, as_json)
        encoder = Encoder(bundle_obj, device=device)
        if image_path:
            from d2s_search.errors import ImageRejected
            from d2s_search.images import load_image

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

    if result.notice:  # before the hits: they are guesses
        click.echo(f"note: {result.notice}", err=True)
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
    out = console()
    out.print(table)
    out.print(f"[dim]{len(result.hits)} result(s), {result.mode}, {result.took_ms:.1f} ms[/dim]")


def _short_path(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path
