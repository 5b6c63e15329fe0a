"""``d2s-search kibana``: install the saved objects (data view, saved search, tag cloud, dashboard)."""

from __future__ import annotations

import click

from d2s_search.cli.output import emit as _emit
from d2s_search.errors import EXIT_OK


@click.group()
def kibana() -> None:
    """Kibana: the d2s data view, saved search, tag cloud and dashboard."""


@kibana.command("install")
@click.option("--url", envvar="D2S_KIBANA_URL", show_envvar=True,
              help="Kibana URL, e.g. http://localhost:5601 (credentials from D2S_KIBANA_* or D2S_ELASTICSEARCH_*).")
@click.option("--space", default="default", show_default=True, help="Kibana space that receives the objects.")
@click.option("--index-name", envvar="D2S_ELASTICSEARCH_INDEX", default="d2s", show_default=True,
              help="Index (alias) the data view points at.")
@click.option("--file", "files", multiple=True, type=click.Path(exists=True),
              help="Import these .ndjson files or folders instead of the built-in objects (mappings/kibana/).")
@click.option("--insecure", is_flag=True, envvar="D2S_KIBANA_INSECURE",
              help="Do not verify Kibana's TLS certificate (local demo certificates only).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def kibana_install(url, space, index_name, files, insecure, as_json) -> int:
    """Import the saved objects through Kibana's saved-objects import API (overwrite)."""
    from d2s_search.backends.elasticsearch.kibana import KibanaClient, install, load_objects

    objects = load_objects(files, index_name)
    with KibanaClient.from_env(url, space=space, **({"verify": False} if insecure else {})) as client:
        result = install(client, objects)
    where = f"{result.url}" + ("" if result.space == "default" else f" (space {result.space})")
    lines = [f"imported {len(result.imported)} object(s) into {where}:"]
    lines += [f"  {o['type']:14s} {o['id']:24s} {o['title']}" for o in result.imported]
    lines.append(f"open {result.url}{client.space_prefix}/app/dashboards to see them")
    _emit(result.to_json(), as_json, lines)
    return EXIT_OK
