"""``d2s-search serve``: the search page and JSON API on a local web server.

Registered on the main group in ``cli.py`` (inside ``_register_optional_commands``)::

    from .cli_serve import serve
    cli.add_command(serve)

The command reuses cli.py's option decorators, and cli.py imports this module while it is
itself being imported, so the command is built on first access (``serve_command``), never
at import: either module can be imported first. FastAPI and uvicorn are imported inside the
command, so the rest of the CLI works without the ``serve`` extra.
"""

from __future__ import annotations

import contextlib
import functools

import click

from .errors import EXIT_OK, D2SError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def run_serve(host, port, thumbnail_dir, log_level, bundle, backend, index, url, index_name, device) -> int:
    """Serve the search page and the JSON API (docs at /docs)."""
    try:
        import uvicorn

        from .serve import create_app
    except ImportError as exc:
        raise D2SError(f"serve needs the `serve` extra ({exc.name} is missing): pip install 'd2s-search[serve]'") from None
    from .cli import load_bundle, make_backend

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


@functools.cache
def serve_command() -> click.Command:
    from .cli import backend_options, bundle_option, device_option

    decorators = [
        click.command("serve"),
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="Address to listen on. Anything but loopback exposes your pictures to the network."),
        click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
                     help="0 picks a free port."),
        click.option("--thumbnail-dir", envvar="D2S_THUMBNAIL_DIR", show_envvar=True,
                     type=click.Path(file_okay=False),
                     help="Where thumbnails are cached (default: ~/.cache/d2s-search/thumbnails)."),
        click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
                     default="info", show_default=True),
        bundle_option,
        backend_options,
        device_option,
    ]
    def callback(**options) -> int:  # a fresh function: click's decorators mark the one they wrap
        return run_serve(**options)

    callback.__doc__ = run_serve.__doc__
    command = callback
    for decorate in reversed(decorators):  # the order `@` lines would apply them
        command = decorate(command)
    return command


def __getattr__(name: str):
    """``from .cli_serve import serve`` builds the command on first use."""
    if name == "serve":
        return serve_command()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
