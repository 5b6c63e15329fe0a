"""``d2s-search ingest`` and ``d2s-search query``: fill the index, search it, print hits."""

from __future__ import annotations

from pathlib import Path

import click

from d2s_search.cli.options import (
    backend_kind,
    backend_options,
    bundle_option,
    console,
    device_option,
    filter_options,
    given_filters,
    json_option,
    load_bundle,
    make_backend,
    open_index,
    prepare_search,
    ray_engine_options,
    search_threads_option,
)
from d2s_search.cli.output import echo_line, fit_path, table_lines, terminal_width
from d2s_search.cli.output import emit_json as _emit_json
from d2s_search.errors import EXIT_OK, D2SError, NoInputError
from d2s_search.pathtext import path_to_text


@click.command()
@click.argument("paths", nargs=-1, type=click.Path())
@bundle_option
@backend_options
@device_option
@click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True,
              help="Images encoded (and written) together; each batch is one transaction.")
@click.option("--workers", type=click.IntRange(1, 4096), default=2, show_default=True,
              help="Decoding threads; with --engine ray, encoding workers (each holds the image encoder).")
@ray_engine_options("the workers of a Ray cluster encode (and write to a cluster index themselves)")
@click.option("--top-k", type=click.IntRange(1), default=None, help="Keep only the k strongest terms per image.")
@click.option("--max-pixels", type=click.IntRange(1), default=None, help="Refuse images larger than this (default 120 MP).")
@click.option("--url-base", envvar="D2S_URL_BASE", default=None,
              help="Store each image's URL as URL_BASE + its path under the ingested folder (see serve-images).")
@click.option("--include-hidden", is_flag=True,
              help="Also walk hidden folders and files (.git, .thumbnails, ._IMG.jpg) and system folders "
                   "(@eaDir, #recycle, node_modules, __MACOSX); skipped by default.")
@click.option("--exclude", "exclude", multiple=True, metavar="GLOB",
              help="Skip what matches GLOB, its path below the folder given (raw/*, */thumbs) or its name "
                   "(*.png); GLOB/ matches folders only. Repeatable; a config file's `exclude = [...]` is used "
                   "when none is given.")
@click.option("--metadata", "metadata", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The pictures' own fields from a CSV (first row: path or file, then field names, each "
                   "optionally name:type) or JSON Lines file, by path or file name; searched with --where. "
                   "Pictures already stored get the new values without being encoded again.")
@click.option("--watch", is_flag=True,
              help="After ingesting, keep watching PATHS and apply each change until Ctrl-C: new and written "
                   "pictures ingested, moved ones keep their documents, deleted ones removed (needs the watch extra).")
@click.option("--watch-delay", type=click.FloatRange(0, 3600), default=1.0, show_default=True, metavar="SECONDS",
              help="With --watch: a changed file is taken once it has been quiet this long (a picture still "
                   "being copied is not read half-written).")
@click.option("--update-existing", "update_index", metavar="INDEX", default=None,
              help="Add picture search to your own OpenSearch (or Elasticsearch) index INDEX (with --image-field): each document's "
                   "picture is encoded and its words and vector added as a partial update; no PATHS.")
@click.option("--image-field", default=None, metavar="FIELD",
              help="With --update-existing: the field of INDEX that holds each picture's path or http(s) URL.")
@click.option("--image-root", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="With --update-existing or --documents: the folder relative picture paths are under.")
@click.option("--documents", "documents", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="A JSON Lines file of {\"id\": ..., \"image\": path or URL}: each picture stored under your id "
                   "in an OpenSearch or Elasticsearch index; no PATHS.")
@json_option
def ingest(paths, bundle, backend, index, url, index_name, device, batch_size, workers, engine, ray_address,
           cpus_per_worker, gpus_per_worker, top_k, max_pixels, url_base, include_hidden, exclude, metadata, watch,
           watch_delay, update_index, image_field, image_root, documents, as_json) -> int:
    """Encode the images under PATHS and store them in the index; or, with --update-existing
    INDEX --image-field FIELD, add picture search to an OpenSearch index of your own.

    Exit code 0: everything found is stored; 3: some files were rejected (listed), the rest
    stored; 1: nothing could be stored. A known picture found at a new place (its old file
    gone) keeps its document and gets the new path. Inside the folders given, hidden and
    system folders and files are skipped (and counted); a path given is always taken.

    With --watch, PATHS are then watched until Ctrl-C or SIGTERM (exit 0): one line per
    applied batch (with --json, one JSON object per line).
    """
    if documents is not None:
        if paths or metadata or watch or update_index or image_field or engine != "process":
            raise click.UsageError("--documents takes no PATHS, --metadata, --watch, --update-existing or --engine")
        return _ingest_documents(documents, url_base, image_root, bundle, backend, index, url, index_name, device,
                                 batch_size, workers, top_k, max_pixels, as_json)
    if update_index is not None or image_field is not None or image_root is not None:
        if update_index is None or image_field is None:
            raise click.UsageError("--update-existing INDEX and --image-field FIELD go together")
        if paths or metadata or watch or engine != "process":
            raise click.UsageError("--update-existing takes no PATHS, --metadata, --watch or --engine")
        return _update_existing(update_index, image_field, url_base, image_root, bundle, backend, url, device,
                                batch_size, workers, top_k, max_pixels, as_json)
    if not paths:
        raise click.UsageError("Missing argument 'PATHS...'.")
    if watch:
        _check_watchable(paths, engine)
    elif watch_delay != 1.0:
        raise click.UsageError("--watch-delay is for --watch")
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from d2s_search.python_api.index import Index
    from d2s_search.serve.image_urls import url_builder

    if url_base:
        url_builder(url_base, paths)  # a bad base fails before any index is opened
    if metadata:
        from d2s_search.metadata import read_sidecar

        read_sidecar(metadata)  # a bad file fails before any index is opened
    opened = open_index(backend, index, url, index_name, bundle, create=True, verify=True)
    store = opened.store
    err = console(stderr=True)
    progress = Progress(
        TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(), console=err, transient=as_json, disable=as_json and not err.is_terminal,
    )
    state = {"task": None, "t0": 0.0}

    def on_progress(done: int, found: int, stored: int) -> None:
        import time

        if state["task"] is None:  # the first call: files found, none done
            state["t0"] = time.perf_counter()
            state["task"] = progress.add_task("ingest", total=found, rate="")
        elapsed = time.perf_counter() - state["t0"]
        rate = f"{stored / elapsed:.1f} images/s" if elapsed > 0 and stored else ""
        progress.update(state["task"], completed=done, rate=rate)

    # The Python API's Index.ingest: one path for both (it also removes a new index left empty).
    target = Index(opened, device=device)
    try:
        with progress:
            try:
                report = target.ingest(
                    paths, batch_size=batch_size, workers=workers, top_k=top_k, max_pixels=max_pixels,
                    url_base=url_base, include_hidden=include_hidden, exclude=exclude, progress=on_progress,
                    prepare_search=False,  # prepared below, with a spinner on a terminal
                    engine=engine, ray_address=ray_address, cpus_per_worker=cpus_per_worker,
                    gpus_per_worker=gpus_per_worker, metadata=metadata)
            except NoInputError as exc:
                if not watch:
                    raise
                report, nothing_yet = None, str(exc)  # an empty folder: watched for its first pictures
        if report is not None and (report.stored or report.moved):
            report.search_seconds = prepare_search(store)
        if not watch:
            return _report_ingest(report, as_json)
        if report is not None:
            _report_ingest(report, as_json, one_line=True)
        else:
            echo_line(f"note: {nothing_yet}", err=True)
        if target._closed:  # a new index left empty was removed: made again, to watch into
            target = Index(open_index(backend, index, url, index_name, bundle, create=True, verify=False),
                           device=device)
        from d2s_search.watch import WatchOptions

        options = WatchOptions(delay=watch_delay, include_hidden=include_hidden, exclude=tuple(exclude),
                               batch_size=batch_size, workers=workers, top_k=top_k, max_pixels=max_pixels,
                               url_base=url_base, metadata=metadata)
        try:
            return _watch(target, paths, options, as_json)
        finally:
            if opened.created:  # made by this run and still empty: removed, as a plain ingest does
                target._discard_new_index()
    finally:
        target.close()


def _check_watchable(paths, engine: str) -> None:
    """--watch follows local folders and files in this process: one-line usage errors otherwise."""
    from d2s_search.sources import is_uri

    if engine == "ray":
        raise click.UsageError("--watch ingests in this process: leave out --engine ray")
    remote = [p for p in paths if is_uri(p)]
    if remote:
        raise click.UsageError(f"--watch follows local folders and files, not {remote[0]}")
    from d2s_search.watch import roots_of

    roots_of(paths)  # a missing folder fails before any index is opened


def _watch(target, paths, options, as_json: bool) -> int:
    """Watch PATHS until SIGINT or SIGTERM; each applied batch printed as it is done."""
    import signal
    import threading

    from d2s_search.cli.output import json_text, print_watch_batch
    from d2s_search.watch import Watcher

    stop = threading.Event()

    def on_batch(batch) -> None:
        print_watch_batch(batch, as_json)

    def on_error(message: str) -> None:
        if as_json:
            click.echo(json_text({"error": {"type": "BatchFailed", "message": message}}, indent=None))
        else:
            echo_line(f"error: {message} (the watch goes on)", err=True)

    def on_notice(message: str) -> None:
        echo_line(f"note: {message}", err=True)

    watcher = Watcher(target, paths, options, on_batch=on_batch, on_notice=on_notice, on_error=on_error)

    def stopping(signum, frame) -> None:
        if stop.is_set():  # a second Ctrl-C: at once (what is written stays written)
            raise KeyboardInterrupt
        stop.set()

    previous = {name: signal.signal(getattr(signal, name), stopping) for name in ("SIGINT", "SIGTERM")}
    try:
        watcher.start()
        shown = ", ".join(path_to_text(p) for p in paths)
        echo_line(f"watching {shown} (changes applied after {options.delay:g}s of quiet; Ctrl-C stops)", err=True)
        watcher.run(stop)
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
    echo_line("stopped watching", err=True)
    return EXIT_OK


def _update_existing(index_name, image_field, url_base, image_root, bundle, backend, url, device, batch_size, workers,
                     top_k, max_pixels, as_json) -> int:
    """``ingest --update-existing``: Index.update_existing with a progress bar, then the report."""
    from d2s_search.python_api.index import Index

    kind = backend_kind(backend, url)
    if kind == "local":
        raise click.UsageError("--update-existing adds picture search to an OpenSearch or Elasticsearch index: give "
                               "--url (or D2S_OPENSEARCH_URL, D2S_ELASTICSEARCH_URL)")
    progress, on_progress = _document_bar("update", as_json)
    with progress:
        report = Index.update_existing(index_name, image_field, url=url, backend=kind, bundle=bundle, url_base=url_base,
                                       image_root=image_root, progress=on_progress, batch_size=batch_size,
                                       workers=workers, top_k=top_k, max_pixels=max_pixels, device=device)
    code = report.exit_code
    if _document_report_as_json(report, as_json):
        return code
    click.echo(f"updated {report.updated} document(s) of {report.found} with a picture in {image_field!r}; "
               f"{report.already_done} done before, {len(report.failed)} failed ({report.seconds:.1f}s)")
    if report.dense == "flat":
        click.echo(f"note: {index_name!r} was not created with index.knn: true, so its dense vectors are stored "
                   "without a k-NN graph: sparse search works; for dense and hybrid, reindex it into a k-NN index "
                   "(docs/python-api.md)", err=True)
    return code


def _document_report_as_json(report, as_json: bool) -> bool:
    """A document run's report (--update-existing, --documents): with --json the report and its
    exit code (True), else each failed document on its own line on stderr (False)."""
    from d2s_search.cli.output import echo_line

    if as_json:
        _emit_json(report.to_json() | {"exit_code": report.exit_code})
        return True
    for doc_id, reason in report.failed:
        echo_line(f"failed {doc_id}: {reason}", err=True)
    return False


def _ingest_documents(documents, url_base, image_root, bundle, backend, index, url, index_name, device, batch_size,
                      workers, top_k, max_pixels, as_json) -> int:
    """``ingest --documents``: Index.ingest_documents with a progress bar, then the report."""
    from d2s_search.cli.output import echo_line
    from d2s_search.enrich import Pictures
    from d2s_search.python_api.index import Index
    from d2s_search.user_documents import read_lines

    if backend_kind(backend, url) == "local":
        raise click.UsageError("--documents stores pictures under your ids in an OpenSearch or Elasticsearch index "
                               "(--url); a local index keys pictures by their content: ingest the folder instead")
    Pictures(url_base, Path(image_root) if image_root else None)  # bad options fail before any index is opened
    read_lines(documents)  # so does a bad file
    opened = open_index(backend, index, url, index_name, bundle, create=True, verify=True)
    progress, on_progress = _document_bar("ingest", as_json)
    target = Index(opened, device=device)
    try:
        with progress:
            report = target.ingest_documents(documents, url_base=url_base, image_root=image_root,
                                             progress=on_progress, batch_size=batch_size, workers=workers,
                                             top_k=top_k, max_pixels=max_pixels)
    finally:
        target.close()
    code = report.exit_code
    if _document_report_as_json(report, as_json):
        return code
    click.echo(f"stored {report.stored} document(s) of {report.found}; {report.already_stored} already stored, "
               f"{len(report.failed)} failed ({report.seconds:.1f}s)")
    if report.left_out_keys:
        echo_line(f"note: the lines' other keys ({', '.join(report.left_out_keys)}) are not stored: this index "
                  "keeps no fields of its own", err=True)
    return code


def _document_bar(label: str, as_json: bool):
    """(a progress bar on stderr, the ``progress(done, total, written)`` callback that drives it)
    for --update-existing and --documents; the total is set by the first call."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    err = console(stderr=True)
    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=err, transient=as_json, disable=as_json and not err.is_terminal)
    task = []

    def on_progress(done: int, total: int, written: int) -> None:
        if not task:
            task.append(progress.add_task(label, total=total))
        progress.update(task[0], completed=done)

    return progress, on_progress


def _report_ingest(report, as_json: bool, one_line: bool = False) -> int:
    """The report as the command's last words (``one_line``: JSON on one line, more follows)."""
    code = report.exit_code
    error = None
    if report.nothing_stored:
        error = {"type": "NothingStored",
                 "message": f"nothing stored: all {len(report.rejected)} input(s) were rejected"}
    if as_json:
        payload = report.to_json() | {"exit_code": code} | ({"error": error} if error else {})
        if one_line:
            from d2s_search.cli.output import json_text

            click.echo(json_text(payload, indent=None))
        else:
            _emit_json(payload)
        return code
    from d2s_search.cli.output import echo_line  # file names and reasons: escaped

    for path, reason in report.rejected:
        echo_line(f"rejected {path}: {reason}", err=True)
    moved = f" ({report.moved} moved: path updated)" if report.moved else ""
    if report.metadata_updated:
        moved += f" ({report.metadata_updated} with new metadata)"
    click.echo(
        f"stored {report.stored} new image(s) of {report.found} found; {report.already_stored} already stored"
        f"{moved}, {report.duplicates} duplicate(s), {len(report.rejected)} rejected  "
        f"({report.seconds:.1f}s, {report.images_per_second:.1f} images/s"
        + (f"; search structures {report.search_seconds:.1f}s" if report.search_seconds is not None else "")
        + (f"; {report.workers} Ray worker(s), ready in {report.workers_start_seconds:.1f}s, not counted in the rate"
           if report.workers_start_seconds is not None else "") + ")"
    )
    skipped = [f"{n} {what}" for n, what in (
        (report.skipped_hidden, "hidden or system folder(s) and file(s) (--include-hidden takes them)"),
        (report.skipped_excluded, "matching --exclude")) if n]
    if skipped:
        click.echo(f"skipped {'; '.join(skipped)}")
    if error:
        click.echo(f"error: {error['message']}", err=True)
    return code


# --- query -------------------------------------------------------------------------------

# Measured at 123k documents (docs/design-decisions.md, "Two-phase on the local index"): recall@10
# against exact 0.22, 1.1 ms against 0.47 ms for exact.
# The plan itself stays as defined (the backends agree on it, tests compare them).
LOCAL_TWO_PHASE_NOTE = ("on the local index two-phase misses most of the exact top-k (recall@10 about 0.2 "
                        "in the benchmarks) and is slower: --mode sparse is exact")


@click.command()
@click.argument("text", required=False)
@click.option("--image", "image_path", type=click.Path(dir_okay=False),
              help="Search by a picture (a file, or an http(s) URL fetched up to 20 MiB).")
@click.option("--mode", type=click.Choice(["sparse", "two-phase", "dense", "hybrid"]), default="sparse", show_default=True,
              help="Query plan: sparse (exact, all terms), two-phase (own words, then rescored), dense (kNN), "
              "hybrid (sparse and dense fused).")
@click.option("-k", "k", type=click.IntRange(1, 10000), default=10, show_default=True, help="Number of results.")
@click.option("--window", type=click.IntRange(1), default=None, help="Candidates for two-phase/hybrid (default two-phase max(100, 10k); hybrid max(100, min(10k, k + max(k, 1000)))).")
@click.option("--fusion", type=click.Choice(["minmax", "rrf"]), default="minmax", show_default=True,
              help="How hybrid fuses the runs: weighted min-max scores or reciprocal rank fusion.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True, help="Dense weight in min-max fusion.")
@click.option("--explain", type=click.IntRange(0, 100), default=5, show_default=True, help="Matched words shown per hit (forms of one word such as dog, dogs "
              "as one, their contributions summed).")
@click.option("--server-side", is_flag=True, help="OpenSearch encodes the text (neural_sparse with the model "
              "from register-model; falls back to the search template d2s-sparse).")
@click.option("--model-id", envvar="D2S_OPENSEARCH_MODEL_ID", help="ml-commons model for --server-side "
              "(default: the one registered for the bundle).")
@click.option("--paths", "paths_only", is_flag=True, help="Print only the hits' paths, one per line (for piping; "
              "control characters in a name escaped as \\xNN).")
@click.option("-0", "--print0", is_flag=True, help="Print only the hits' paths as their exact bytes, each ended by a "
              "NUL (for xargs -0; names with newlines stay whole).")
@click.option("--no-serve", is_flag=True, help="Search in this process even when `d2s-search serve` runs on this index.")
@click.option("--ef", "dense_ef", envvar="D2S_DENSE_EF", show_envvar=True, type=click.IntRange(1, 100_000), default=None,
              help="Dense search of a local index of 100,000+ pictures: candidates each graph proposes, rescored "
              "exactly (default 64, 64 more per 4 shards a graph spans; at least k): more finds more of the exact top k, slower.")
@filter_options
@click.option("--offset", type=click.IntRange(0), default=0, help="The library (no TEXT, no --image): skip this many.")
@bundle_option
@backend_options
@search_threads_option
@device_option
@json_option
def query(text, image_path, mode, k, window, fusion, alpha, explain, server_side, model_id, paths_only, print0, no_serve,
          dense_ef, after, before, folders, where, near, offset, bundle, backend, index, url, index_name, search_threads, device,
          as_json) -> int:
    """Search the index by TEXT, by --image PATH (a file or an http(s) URL), or by both (the sum
    of the two queries). With neither: the library, newest pictures first (by date taken).
    --after, --before, --folder, --where and --near narrow any of them.

    A text query on a local index that `d2s-search serve` is serving (on loopback, same
    bundle) is answered by that serve, which has everything loaded; the output says so.
    Anything amiss with it (stopped, busy, another bundle) and the query runs here.
    """
    from d2s_search.search import SearchOptions

    narrowed = given_filters(after, before, folders, where, near)
    if text is None and image_path is None and server_side:
        raise click.UsageError("--server-side searches by TEXT")
    if server_side and narrowed:
        raise click.UsageError("--server-side searches the text alone: leave out the filters")
    if server_side and (image_path or mode != "sparse"):
        raise click.UsageError("--server-side searches by TEXT with the sparse plan")
    if (paths_only or print0) and as_json:
        raise click.UsageError("--paths/--print0 and --json are different outputs: give one")
    paths_only = "nul" if print0 else paths_only
    if server_side and (backend or ("opensearch" if url else "local")) != "opensearch":
        raise click.UsageError("--server-side needs --url or D2S_OPENSEARCH_URL")
    options = SearchOptions(mode=mode, k=k, window=window, fusion=fusion, alpha=alpha, explain=explain)
    options.validate()
    picture = _query_picture(image_path) if image_path is not None else None  # before any index or model
    local = backend_kind(backend, url) == "local"
    if dense_ef is not None and not local:
        raise click.UsageError("--ef sets the local index's graph search; a cluster's kNN has its own settings")
    note = LOCAL_TWO_PHASE_NOTE if local and mode == "two-phase" else None
    if server_side and text is not None and _edited(text):
        raise click.UsageError("--server-side encodes the text in the cluster: -word, +word and word^N need a "
                               "local model (leave out --server-side)")
    if text is not None and picture is None and not server_side and not no_serve and local and not _edited(text) \
            and not narrowed and dense_ef is None:
        answered = _ask_running_serve(text, options, index, bundle)
        if answered is not None:
            result, address = answered
            return _show_result(result, as_json, paths_only, answered_by=address, note=note)
    from d2s_search.encoder import Encoder  # not needed when a serve answered
    from d2s_search.python_api.index import Index

    opened = open_index(backend, index, url, index_name, bundle, create=False, threads=search_threads)
    bundle_obj, store = opened.bundle, opened.store
    if dense_ef is not None:
        store.dense_ef = dense_ef
    if server_side:
        from d2s_search.backends.opensearch.server_side import run_server_side

        try:
            result = run_server_side(store, text, k=k, explain=explain, model_id=model_id, bundle=bundle_obj,
                                     encoder_factory=lambda: Encoder(bundle_obj, device=device))
        finally:
            store.close()
        return _show_result(result, as_json, paths_only)
    # The Python API's Index.search: one path for both. quick_start: one query per process.
    with Index(opened, device=device, quick_start=True) as searched:
        filters = searched.filter(**narrowed) if narrowed else None
        if text is None and picture is None:
            return _show_result(searched.browse(k, filters=filters, offset=offset), as_json, paths_only)
        result = searched.search(text, image=picture, mode=mode, k=k, window=window, fusion=fusion, alpha=alpha,
                                 explain=explain, filters=filters)
    return _show_result(result, as_json, paths_only, note=note, words=text is not None and picture is not None)


def _edited(text: str) -> bool:
    """Whether the text has -word, +word or word^N (searched here: the serve's answer has no edits)."""
    from d2s_search.query_edits import parse_query

    try:
        return bool(parse_query(text))
    except D2SError:
        return True  # the local path reports it


def _query_picture(image_path: str):
    """The decoded query picture, from a file or an http(s) URL; a picture that is missing, not
    a picture, or cannot be fetched is a one-line error (exit 1; another URL scheme exit 2)
    before any index or model is opened."""
    import re

    from d2s_search.errors import ImageRejected, QueryImageError
    from d2s_search.images import QUERY_MAX_PIXELS, decode, load_image
    from d2s_search.pathtext import path_to_text
    from d2s_search.redact import strip_url_credentials
    from d2s_search.remote_image import fetch_image, is_url

    if is_url(image_path):
        data = fetch_image(image_path)
        try:
            return decode(data, max_pixels=QUERY_MAX_PIXELS)[0]
        except ImageRejected as exc:
            raise QueryImageError(f"cannot use {strip_url_credentials(image_path)} as a query: {exc}") from None
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", image_path) and not Path(image_path).exists():
        raise click.BadParameter("only http:// and https:// URLs are fetched: give a file or such a URL",
                                 param_hint="'--image'")
    try:
        return load_image(Path(image_path)).image
    except ImageRejected as exc:
        raise QueryImageError(f"cannot use {path_to_text(image_path)} as a query: {exc}") from None


def _ask_running_serve(text: str, options, index: str, bundle: str | None):
    """(result, the serve's address) when a running serve of this index answered and proved
    it (see serve/discovery.py), else None."""
    import sqlite3

    from d2s_search.serve import discovery

    if not discovery.discovery_path(index).is_file():
        return None  # the common case, decided without opening anything
    try:
        known = _recorded_identity_and_id(index)
        if known is None:
            return None
        recorded, index_id = known
        if not recorded.fingerprint or (bundle and load_bundle(bundle).fingerprint != recorded.fingerprint):
            return None  # the local path gives the proper error
    except (D2SError, sqlite3.Error, ValueError):  # damage: the local path reports it
        return None
    entry = discovery.find(index, recorded.fingerprint, index_id)
    answer = discovery.ask(entry, text, options, index_id) if entry is not None else None
    result = discovery.to_result(answer) if answer is not None else None
    return None if result is None else (result, discovery.address(entry))


def _recorded_identity_and_id(index: str):
    """(the recorded bundle identity, the random index id) of the local index at ``index``,
    as its own database says; None when there is no index, or it records neither."""
    peek = make_backend("local", index, None, "")
    try:
        if not peek.exists():
            return None
        peek.open(None, create=False)
        index_id = peek.generation()[0]
        return None if peek.identity is None or not index_id else (peek.identity, index_id)
    finally:
        peek.close()


def _show_result(result, as_json: bool, paths_only: bool | str = False, answered_by: str | None = None,
                 note: str | None = None, words: bool = False) -> int:
    """Hits as JSON, a table, or only their paths (``paths_only``: True one escaped path a line,
    ``"nul"`` the exact bytes of each name ended by a NUL)."""
    from d2s_search.cli.output import echo_line
    from d2s_search.pathtext import shown
    if as_json:
        _emit_json(result.to_json() | ({"answered_by": answered_by} if answered_by else {})
                   | ({"note": note} if note else {}))
        return EXIT_OK
    if paths_only == "nul":
        _print_paths_nul(result.hits)
    elif paths_only:
        for hit in result.hits:
            echo_line(hit.path)  # one line each: a newline in a name shows as \x0a
    else:
        _print_hits(result, words)
    if answered_by:
        line = shown(f"answered by the running serve at {answered_by}")
        if paths_only:
            click.echo(line, err=True)
        else:
            click.secho(line, dim=True)
    if note:
        click.echo(f"note: {note}", err=True)  # stderr: --paths output stays pipeable
    return EXIT_OK


def _print_paths_nul(hits) -> None:
    """Each hit's file name as its exact bytes (undecodable ones too), ended by a NUL."""
    import os
    import sys

    from d2s_search.pathtext import text_to_path

    sys.stdout.flush()
    out = sys.stdout.buffer
    for hit in hits:
        out.write(os.fsencode(text_to_path(hit.path)) + b"\0")
    out.flush()


SHOWN_QUERY_WORDS = 8


def _print_hits(result, words: bool = False) -> None:
    """The hits as a table; ``words``: first the query's strongest words (words and a picture
    searched together: what the sum came to)."""
    from d2s_search.cli.output import echo_line
    from d2s_search.pathtext import shown  # a name, a server's terms: nothing a terminal acts on

    if result.notice:  # before the hits: they are guesses
        echo_line(f"note: {result.notice}", err=True)
    if getattr(result, "edits", None):
        click.secho(shown(f"query edits: {result.edits.describe()}"), dim=True)
    if getattr(result, "filters", None):
        click.secho(shown(f"only: {result.filters.describe()}"), dim=True)
    if words:
        strongest = ", ".join(f"{w.word} {w.weight:.2f}" for w in result.query_words[:SHOWN_QUERY_WORDS])
        click.secho(shown(f"query words (text + picture): {strongest}"), dim=True)
    if not result.hits:
        echo_line(f"no results ({result.mode}, {result.took_ms:.1f} ms)")
        return
    # The path gets what the rank, score and at least 24 columns of matched terms leave;
    # folders are shortened from the left, the file name never. Laid out without rich's Table
    # (its import and layout were ~10% of a one-query process, docs/benchmarks.md).
    width = terminal_width()
    budget = max(20, width - 5 - 9 - 24 - 6)
    library = result.mode == "library"  # no query: no score to show
    rows = [(str(rank), "" if library else f"{hit.score:.4f}", fit_path(shown(hit.path), budget))
            for rank, hit in enumerate(result.hits, 1)]
    # Inflections collapsed (dog, dogs: one word), as the page shows them; a hit explained by
    # something other than the query plans (no words) shows its raw terms.
    matched = [[shown(f"{t} {c:.2f}") for t, c, *_ in (hit.words or hit.matched)] for hit in result.hits]
    header, *lines = table_lines(("#", "" if library else "score", "path", "" if library else "matched words"), rows,
                                 matched, right={0, 1}, width=width)
    click.secho(header, bold=True)
    for line in lines:
        click.echo(line)
    fused = f" ({result.fusion})" if getattr(result, "fusion", None) else ""
    click.secho(shown(f"{len(result.hits)} result(s), {result.mode}{fused}, {result.took_ms:.1f} ms"), dim=True)
