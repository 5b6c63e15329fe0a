"""``d2s-search serve`` (the search page and its JSON API) and ``d2s-search serve-images``
(the read-only picture server for Dashboards thumbnails).

FastAPI and uvicorn are imported inside the command, so the rest of the CLI works without
the ``serve`` extra.
"""

from __future__ import annotations

import contextlib

import click

from d2s_search.cli.options import (
    backend_options,
    bundle_option,
    device_option,
    load_bundle,
    make_backend,
)
from d2s_search.errors import EXIT_OK, D2SError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def run_serve(host, port, thumbnail_dir, log_level, bundle, backend, index, url, index_name, device) -> int:
    """Serve the search page and the JSON API (docs at /docs)."""
    try:
        import uvicorn

        from d2s_search.serve import create_app
    except ImportError as exc:
        raise D2SError(f"serve needs the `serve` extra ({exc.name} is missing): pip install 'd2s-search[serve]'") from None
    bundle_obj = load_bundle(bundle)
    store = make_backend(backend, index, url, index_name)
    allowed = ["127.0.0.1", "localhost", "[::1]"] if host in LOOPBACK else None
    app = create_app(bundle_obj, store, device=device, thumbnail_dir=thumbnail_dir, allowed_hosts=allowed)
    # Open the index and load the models before listening: a missing index or a bundle
    # mismatch is a one-line error here, not a page that fails on every search.
    app.state.service.start()
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug")
    server = uvicorn.Server(config)
    if host not in LOOPBACK:
        click.echo(f"warning: listening on {host}: anyone who can reach this address can search and see the pictures",
                   err=True)
    _announce_when_ready(server, host)
    # uvicorn re-raises Ctrl+C after its graceful shutdown; stopping is the normal end.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    click.echo("d2s-search: stopped", err=True)
    return EXIT_OK


def _announce_when_ready(server, host: str) -> None:
    """Print the page's address once uvicorn is listening (the real port, also for --port 0)."""
    import threading
    import time

    def wait() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started and server.servers:
            port = server.servers[0].sockets[0].getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            click.echo(f"d2s-search: search page at http://{shown}:{port}/  (API docs at /docs; Ctrl+C stops)", err=True)

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
              default="info", show_default=True)
@bundle_option
@backend_options
@device_option
def serve(**options) -> int:
    """Serve the search page and the JSON API (docs at /docs)."""
    return run_serve(**options)


@click.command("serve-images")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the pictures to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0 picks a free port.")
@click.option("--quiet", is_flag=True, help="Do not log each request.")
def serve_images(folder, host, port, quiet) -> int:
    """Serve the pictures under FOLDER read-only, so Dashboards can show thumbnails.

    Ingest the same folder with --url-base set to the URL printed here. Only image files are
    served; nothing outside FOLDER (no .., no symlinks leading out), no listings.
    """
    from d2s_search.serve.image_server import LOOPBACK_HOSTS, ImageServer

    log = None if quiet else (lambda line: click.echo(line, err=True))
    server = ImageServer(folder, host=host, port=port, log=log)
    if host not in LOOPBACK_HOSTS:
        click.echo(f"warning: listening on {host}: anyone who can reach it can see these pictures", err=True)
    click.echo(f"serving the pictures under {server.root} at {server.url} (read-only; Ctrl-C stops)")
    click.echo(f"ingest with: d2s-search ingest {folder} --url-base {server.url}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK
