"""``d2s-search serve`` (the search page and its JSON API) and ``d2s-search serve-images``
(the read-only picture server for Dashboards thumbnails).

FastAPI and uvicorn are imported inside the command, so the rest of the CLI works without
the ``serve`` extra.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import json
import signal
import socket
import threading

import click

from d2s_search import extras
from d2s_search.cli.options import (
    as_usage_error,
    backend_options,
    bundle_option,
    device_option,
    index_location,
    json_option,
    note_missing_compiled_parts,
    remember_index,
    search_threads_option,
)
from d2s_search.cli.output import echo_line
from d2s_search.errors import EXIT_OK, D2SError
from d2s_search.pathtext import path_to_text
from d2s_search.serve import discovery

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening socket, or a one-line error (a busy port is exit code 1, not a log dump)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise D2SError(f"cannot listen on {host}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = ": pass another --port (0 picks a free one)" if port else ""
        raise D2SError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    sock.set_inheritable(True)
    return sock


def page_address(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def run_serve(host, port, thumbnail_dir, log_level, bundle, backend, index, url, index_name, device,
              as_json=False, search_threads=1, watch=(), watch_delay=1.0) -> int:
    """Serve the search page and the JSON API (docs at /docs); with ``watch``, keep the index
    in sync with those folders while serving."""
    extras.require("serve", who="`d2s-search serve`")
    if watch:
        extras.require("watch", who="`d2s-search serve --watch`")
        from d2s_search.sources import is_uri

        remote = [p for p in watch if is_uri(p)]
        if remote:
            raise click.UsageError(f"--watch follows local folders and files, not {remote[0]}")
        from d2s_search.watch import roots_of

        roots_of(watch)  # a missing folder fails before the models load
    elif watch_delay != 1.0:
        raise click.UsageError("--watch-delay is for --watch")
    import uvicorn

    from d2s_search.python_api.web import app_for

    allowed = ["127.0.0.1", "localhost", "[::1]"] if host in LOOPBACK else None
    with as_usage_error():  # the Python API's search_app builds the same app
        app = app_for(backend, index, url, index_name, bundle, device=device, search_threads=search_threads,
                      thumbnail_dir=thumbnail_dir, allowed_hosts=allowed)
    store, bundle_obj = app.state.service.backend, app.state.service.bundle
    note_missing_compiled_parts(store)
    where = index_location(store)
    sock = listen_socket(host, port)  # a busy port fails before the models load
    # Open the index and load the models before serving: a bundle mismatch or a broken index
    # is a one-line error here, not a page that fails on every search.
    try:
        app.state.service.start()
    except BaseException:
        sock.close()
        raise
    # Everything start-up made lives as long as the server: out of the collector's way, so a
    # full collection walks only what requests leave (with the offline model 66,907 objects,
    # 20-35 ms paid by whichever request set it off).
    gc.collect()
    gc.freeze()
    remember_index(store)
    address = page_address(host, sock.getsockname()[1])
    config = uvicorn.Config(app, log_level=log_level, access_log=log_level == "debug")
    server = uvicorn.Server(config)
    if host not in LOOPBACK:
        click.echo(f"warning: listening on {host}: anyone who can reach this address can search and see the pictures",
                   err=True)
    ready = {"address": address, "index": where, "bundle": str(bundle_obj.path.resolve()), "api_docs": address + "docs"}
    # `d2s-search query` on this index may ask this serve (loopback only; see serve/discovery.py).
    discoverable = None
    if store.name == "local":
        app.state.serve_token = discovery.new_token()
        app.state.serve_index_id = app.state.service.index_id()  # what `query` matches (proven)
        bound = sock.getsockname()
        discoverable = (store.path, bound[0], bound[1], bundle_obj.fingerprint,
                        app.state.serve_index_id, app.state.serve_token)
    watching = None
    if watch:
        try:
            watching = _start_watching(app.state.service, watch, watch_delay, (backend, index, url, index_name),
                                       device, thumbnail_dir, as_json)
        except BaseException:
            sock.close()
            raise
    _announce_when_ready(server, ready, as_json, discoverable)
    _stop_gracefully_on_term_and_hangup(server)
    # A fatal signal Python cannot turn into an exception (SIGBUS, SIGSEGV) still says where it
    # struck, on stderr, rather than ending the process without a word.
    with contextlib.suppress(ValueError, OSError, RuntimeError):  # stderr without a descriptor
        faulthandler.enable()
    try:
        # uvicorn re-raises Ctrl+C after its graceful shutdown; stopping is the normal end.
        with contextlib.suppress(KeyboardInterrupt, _Stopped):
            server.run(sockets=[sock])
    finally:
        if discoverable is not None:
            discovery.withdraw(store.path, app.state.serve_token)
        if watching is not None:
            with contextlib.suppress(Exception):  # an error that ended the watch was said when it did
                watching.stop()  # the batch under way is finished first
    if not as_json:
        click.echo("d2s-search: stopped", err=True)
    return EXIT_OK


def _start_watching(service, paths, delay: float, where: tuple, device: str, thumbnail_dir, as_json: bool):
    """The watcher of ``serve --watch``: a thread of its own that writes through its own
    connection to the index this server searches (a local index's searches see each new
    generation; a cluster's, after its refresh), with the server's loaded models."""
    from pathlib import Path

    from d2s_search.cli.output import print_watch_batch
    from d2s_search.index_access import open_index
    from d2s_search.python_api.index import Index
    from d2s_search.serve.thumbnails import default_cache_dir
    from d2s_search.watch import Watching, WatchOptions

    backend, index, url, index_name = where

    def open_for_watching() -> Index:
        opened = open_index(backend, index, url, index_name, str(service.bundle.path), create=False, remember=False)
        watcher_index = Index(opened, device=device)
        watcher_index._runtime = service.encoder  # ONNX Runtime runs a loaded model from several threads
        return watcher_index

    def on_batch(batch) -> None:
        print_watch_batch(batch, as_json, prefix="d2s-search: ", err=True)

    def on_error(message: str) -> None:
        echo_line(f"d2s-search: error: {message} (the watch goes on)", err=True)

    # Thumbnails are pictures too: a cache inside a watched folder must not be ingested.
    thumbnails = Path(thumbnail_dir) if thumbnail_dir else default_cache_dir()
    options = WatchOptions(delay=delay, ignored=(str(thumbnails),))
    watching = Watching(open_for_watching, paths, options, on_batch=on_batch, on_error=on_error,
                        on_notice=lambda line: echo_line(f"d2s-search: note: {line}", err=True))
    if not as_json:
        shown = ", ".join(path_to_text(p) for p in paths)
        echo_line(f"d2s-search: watching {shown} (changes applied after {delay:g}s of quiet)", err=True)
    return watching


class _Stopped(Exception):
    """SIGTERM or SIGHUP arrived (after uvicorn's graceful shutdown, when it was running)."""


def _stop_gracefully_on_term_and_hangup(server) -> None:
    """End on SIGTERM and SIGHUP as on Ctrl+C: uvicorn shuts down gracefully on SIGTERM and
    then raises it again, which by default ends the process before any ``finally`` runs; SIGHUP
    (the terminal closed) would end it at once. Either way the discovery file would stay."""

    def stop(signum: int, frame) -> None:
        if server.started and not server.should_exit:
            server.handle_exit(signum, frame)  # graceful; uvicorn raises the signal again after
        else:
            raise _Stopped

    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (uvicorn's own then stay unset too)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), stop)


def _announce_when_ready(server, ready: dict, as_json: bool, discoverable: tuple | None = None) -> None:
    """Print the page's address once, when uvicorn is accepting connections (and write the
    discovery file for `query`, when ``discoverable``)."""
    import time

    def wait() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if not server.started:
            return
        if discoverable is not None:
            discovery.announce(*discoverable)
        if as_json:
            click.echo(json.dumps({"ready": True, **ready}))  # one line: read it, then connect
        else:
            echo_line(f"d2s-search: search page at {ready['address']}  (API docs at /docs; Ctrl+C stops)", err=True)

    threading.Thread(target=wait, daemon=True, name="d2s-announce").start()


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes your pictures to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="0 picks a free port.")
@click.option("--thumbnail-dir", envvar="D2S_THUMBNAIL_DIR", show_envvar=True,
              type=click.Path(file_okay=False),
              help="Where thumbnails are cached (default: ~/.cache/d2s-search/thumbnails).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="warning", show_default=True,
              help="uvicorn's logging on stderr (info: its start-up lines; debug: every request).")
@click.option("--watch", multiple=True, metavar="PATH", type=click.Path(),
              help="Keep the index in sync with the pictures under PATH while serving (repeatable): new and "
                   "written pictures ingested, moved ones keep their documents, deleted ones removed. Needs the "
                   "watch extra; ingest PATH first, what is there already is not ingested.")
@click.option("--watch-delay", type=click.FloatRange(0, 3600), default=1.0, show_default=True, metavar="SECONDS",
              help="With --watch: a changed file is taken once it has been quiet this long.")
@bundle_option
@backend_options
@search_threads_option
@device_option
@json_option
def serve(as_json, **options) -> int:
    """Serve the search page and the JSON API (docs at /docs).

    With --json, one line {"ready": true, "address": ...} on stdout says it is listening (and
    with --watch, one JSON object per line per applied batch follows).
    """
    return run_serve(as_json=as_json, **options)


@click.command("serve-images")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the pictures to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0 picks a free port.")
@click.option("--quiet", is_flag=True, help="Do not log each request.")
@json_option
def serve_images(folder, host, port, quiet, as_json) -> int:
    """Serve the pictures under FOLDER read-only, so Dashboards can show thumbnails.

    Ingest the same folder with --url-base set to the URL printed here. Only image files are
    served; nothing outside FOLDER (no .., no symlinks leading out), no listings. With --json,
    one line {"ready": true, "url": ...} on stdout says it is listening.
    """
    from d2s_search.serve.image_server import LOOPBACK_HOSTS, ImageServer

    log = None if quiet else (lambda line: echo_line(line, err=True))  # a request line may hold anything
    server = ImageServer(folder, host=host, port=port, log=log)
    if host not in LOOPBACK_HOSTS:
        click.echo(f"warning: listening on {host}: anyone who can reach it can see these pictures", err=True)
    ingest_with = f"d2s-search ingest {path_to_text(folder)} --url-base {server.url}"
    if as_json:
        click.echo(json.dumps({"ready": True, "url": server.url, "root": str(server.root), "ingest_with": ingest_with}))
    else:
        echo_line(f"serving the pictures under {path_to_text(server.root)} at {server.url} (read-only; Ctrl-C stops)")
        echo_line(f"ingest with: {ingest_with}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK
