"""``d2s-search dashboards install`` and ``d2s-search register-model``: the cluster-side parts
(OpenSearch Dashboards saved objects, the ml-commons query encoder and its search template)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from d2s_search.cli.options import (
    bundle_for_index,
    connection_options,
    index_location,
    load_bundle,
    opensearch_backend,
)
from d2s_search.cli.output import emit as _emit
from d2s_search.errors import EXIT_OK, IndexStoreError


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
    from d2s_search.backends.opensearch.dashboards import DashboardsClient, install, load_objects

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


@click.command("register-model")
@click.option("--bundle", envvar="D2S_BUNDLE", type=click.Path(file_okay=False),
              help="Model bundle whose text encoder is registered (default: the bundle that filled --index-name, "
                   "else the last exported; with --package-only: the last exported).")
@connection_options
@click.option("--configure-cluster", is_flag=True,
              help="Also set the ml-commons settings a single-node cluster needs (uploads allowed, "
                   "models on data nodes, memory threshold 99%).")
@click.option("--model-url", help="Let the cluster download the zip from this URL instead of uploading it "
                                  "in chunks (write it first with --package-only --zip-out).")
@click.option("--zip-out", type=click.Path(dir_okay=False), help="Keep the model zip at this path.")
@click.option("--package-only", is_flag=True, help="Only write the zip (needs --zip-out); no cluster.")
@click.option("--template-only", is_flag=True,
              help="Only store the search template d2s-sparse (clusters without ml-commons).")
@click.option("--max-query-terms", type=click.IntRange(1, 65536), default=1000, show_default=True,
              help="Keep at most this many terms per query (each is a clause; the cluster allows 1024).")
@click.option("--force", is_flag=True, help="Upload a new model version even if one with the same content exists.")
@click.option("--timeout", type=click.FloatRange(1), default=900.0, show_default=True,
              help="Seconds to wait for registration and deployment.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def register_model(bundle, url, index_name, insecure, configure_cluster, model_url, zip_out, package_only,
                   template_only, max_query_terms, force, timeout, as_json) -> int:
    """Register the bundle's text encoder + sparse head as an ml-commons SPARSE_ENCODING model.

    Then `neural_sparse` queries with `query_text` and `model_id` work from Dashboards Dev Tools
    and any client. Also stores the search template `d2s-sparse`, the fallback without ml-commons.
    """
    from d2s_search.backends.opensearch.ml_commons import MLCommons, MLCommonsUnavailable
    from d2s_search.backends.opensearch.ml_package import package_model

    if package_only and not zip_out:
        raise click.UsageError("--package-only needs --zip-out PATH")
    if package_only:
        loaded = load_bundle(bundle, verify=True)
        pkg = package_model(loaded, Path(zip_out), max_terms=max_query_terms)
        payload = {"zip": str(pkg.path), "sha256": pkg.sha256, "bytes": pkg.size, "name": pkg.name,
                   "dropped_terms": {k: len(v) for k, v in pkg.dropped_terms.items()}}
        _emit(payload, as_json, [f"wrote {pkg.path} ({pkg.size / 2**20:.1f} MiB, sha256 {pkg.sha256})"])
        return EXIT_OK

    store = opensearch_backend(url, index_name, insecure)
    try:
        # Queries must be encoded by the bundle that encoded the images: the one the index records.
        loaded = bundle_for_index(bundle, _recorded_identity(store), index_location(store), verify=True)
        ml = MLCommons(store.http, timeout=timeout, progress=lambda msg: click.echo(f"  {msg}", err=True))
        template = ml.store_search_template()
        if template_only:
            _emit({"search_template": template}, as_json,
                  [f"stored search template {template} at {store.url}", _template_example(index_name, template)])
            return EXIT_OK
        if configure_cluster:
            ml.configure_cluster(local_file=not model_url, url=bool(model_url))
        with tempfile.TemporaryDirectory(prefix="d2s-model-") as tmp:
            out = Path(zip_out) if zip_out else Path(tmp) / "d2s-sparse-encoder.zip"
            pkg = package_model(loaded, out, max_terms=max_query_terms)
            try:
                reg = ml.register(pkg, model_url=model_url, force=force)
            except MLCommonsUnavailable as exc:
                raise MLCommonsUnavailable(f"{exc}; the search template {template} is stored") from None
    finally:
        store.close()
    payload = reg.to_json() | {"search_template": template, "zip_sha256": pkg.sha256,
                               "dropped_terms": {k: len(v) for k, v in pkg.dropped_terms.items()}}
    verb = "already registered" if reg.reused else "registered"
    _emit(payload, as_json, [
        f"model {reg.model_id} {verb} and {reg.state.lower()} ({reg.name}, group {reg.model_group_id})",
        f"search template {template} stored",
        "try it in Dashboards Dev Tools:",
        f'GET {index_name}/_search\n{{"_source": ["path", "url", "terms"], "query": {{"neural_sparse": '
        f'{{"sparse": {{"query_text": "dogs in a car", "model_id": "{reg.model_id}"}}}}}}}}',
    ])
    return EXIT_OK


def _recorded_identity(store):
    """What the index records about the bundle that filled it; None without an index, or for one
    not made by d2s-search."""
    if not store.exists():
        return None
    try:
        store.open(None, create=False)
    except IndexStoreError:
        return None
    return store.identity


def _template_example(index_name: str, template: str) -> str:
    return (f'GET {index_name}/_search/template\n{{"id": "{template}", "params": {{"size": 10, "features": '
            '[{"name": "dog", "weight": 1.2}, {"name": "car", "weight": 0.7, "last": true}]}}')
