"""``d2s-search serve``: the search page and JSON API on a local web server.

Registered on the main group in ``cli.py`` (inside ``_register_optional_commands``)::

    from .cli_serve import serve
    cli.add_command(serve)

FastAPI and uvicorn are imported inside the command, so the rest of the CLI works without
the ``serve`` extra.
"""

from __future__ import annotations

import click

from .cli import backend_options, bundle_option, device_option, load_bundle, make_backend
from .errors import EXIT_OK, D2SError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes your pictures to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0 picks a free port.")
@click.option("--thumbnail-dir", envvar="D2S_THUMBNAIL_DIR", show_envvar=True, type=click.Path(file_okay=False),
              help="Where thumbnails are cached (default: ~/.cache/d2s-search/thumbnails).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@bundle_option
@backend_options
@device_option
def serve(host, port, thumbnail_dir, log_level, bundle, backend, index, url, index_name, device) -> int:
    """Serve the search page and the JSON API (docs at /docs)."""
    try:
        import uvicorn

        from .serve import create_app
    except ImportError as exc:
        raise D2SError(f"serve needs the `serve` extra ({exc.name} is missing): pip install 'd2s-search[serve]'") from None

    bundle_obj = load_bundle(bundle)
    store = make_backend(backend, index, url, index_name)
    allowed = ["127.0.0.1", "localhost"] if host in LOOPBACK else None
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
    server.run()
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
