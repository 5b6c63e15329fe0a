"""``d2s-search dashboards install`` and ``d2s-search serve-images``.

The lead registers them in ``cli.py`` (inside ``_register_optional_commands``)::

    from .cli_dashboards import dashboards, serve_images
    cli.add_command(dashboards)
    cli.add_command(serve_images)
"""

from __future__ import annotations

import click

from .cli_output import emit as _emit
from .errors import EXIT_OK


@click.group()
def dashboards() -> None:
    """OpenSearch Dashboards: saved objects for browsing and searching pictures."""


@dashboards.command("install")
@click.option("--url", envvar="D2S_DASHBOARDS_URL", show_envvar=True,
              help="OpenSearch Dashboards URL, e.g. http://localhost:5601.")
@click.option("--index-name", envvar="D2S_OPENSEARCH_INDEX", default="d2s", show_default=True,
              help="The index (or alias) the index pattern points at.")
@click.option("--tenant", default="global", show_default=True,
              help="Security-plugin tenant that receives the objects ('' to send none).")
@click.option("--file", "files", multiple=True, type=click.Path(exists=True),
              help="Import these .ndjson files (or folders of them) instead of the built-in objects; repeatable.")
@click.option("--insecure", is_flag=True, envvar="D2S_DASHBOARDS_INSECURE",
              help="Do not verify Dashboards' TLS certificate (local demo certificates only).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def dashboards_install(url, index_name, tenant, files, insecure, as_json) -> int:
    """Import the index pattern (thumbnails), saved search, tag cloud and dashboard.

    Credentials come from D2S_DASHBOARDS_USER/_PASSWORD, else D2S_OPENSEARCH_USER/_PASSWORD;
    a private CA from D2S_DASHBOARDS_CA_FILE. Existing objects with the same ids are replaced.
    """
    from .dashboards import DashboardsClient, install, load_objects

    if not url:
        raise click.UsageError("needs --url or D2S_DASHBOARDS_URL (e.g. http://localhost:5601)")
    objects = load_objects(files, index_name=index_name)
    options = {"verify": False} if insecure else {}
    with DashboardsClient.from_env(url, tenant=tenant or None, **options) as client:
        result = install(client, objects)
    lines = [f"imported {len(result.imported)} saved object(s) into {result.url}"
             + (f" (tenant {result.tenant})" if result.tenant else "")]
    lines += [f"  {o['type']:14s} {o['id']}  {o['title']}" for o in result.imported]
    if any(o["type"] == "dashboard" for o in result.imported):
        lines.append(f"open {result.url}/app/dashboards#/view/d2s-dashboard")
    _emit(result.to_json(), as_json, lines)
    return EXIT_OK


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
    from .image_server import LOOPBACK_HOSTS, ImageServer

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
