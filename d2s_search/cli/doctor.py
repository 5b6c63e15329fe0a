"""``d2s-search doctor``: check the configured OpenSearch (or Elasticsearch) cluster, one line per check."""

from __future__ import annotations

import click

from d2s_search.cli.options import (
    connection_options,
    elasticsearch_backend,
    json_option,
    load_bundle,
)
from d2s_search.cli.output import emit
from d2s_search.errors import EXIT_FAILED, EXIT_OK, D2SError

_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL", "skip": "skip"}


@click.command("doctor")
@connection_options
@click.option("--backend", type=click.Choice(["opensearch", "elasticsearch"]), default="opensearch", show_default=True,
              help="Which engine to check (Elasticsearch: --url or D2S_ELASTICSEARCH_URL, secrets from "
                   "D2S_ELASTICSEARCH_*).")
@click.option("--aws-region", envvar="D2S_OPENSEARCH_AWS_REGION", help="Sign requests with AWS SigV4 in this region.")
@click.option("--aws-service", envvar="D2S_OPENSEARCH_AWS_SERVICE", type=click.Choice(["es", "aoss"]),
              help="SigV4 service: es (Amazon OpenSearch Service) or aoss (Serverless).")
@click.option("--bundle", envvar="D2S_BUNDLE", type=click.Path(file_okay=False),
              help="Compare the index with this bundle (default: the bundle exported last, if any).")
@json_option
def doctor(url, index_name, insecure, backend, aws_region, aws_service, bundle, as_json) -> int:
    """Reachability, version, distribution, plugins, working plans, clause limit, ml-commons
    settings, and the index against the bundle. Exit 1 when a check fails."""
    identity = None
    try:
        identity = load_bundle(bundle).identity()
    except D2SError:
        if bundle:  # asked for explicitly: its problem is the answer
            raise
    if backend == "elasticsearch":
        from d2s_search.backends.elasticsearch.doctor import diagnose as diagnose_elasticsearch

        store = elasticsearch_backend(url, index_name, insecure, retries=2)
        try:
            report = diagnose_elasticsearch(store, identity)
        finally:
            store.close()
    else:
        report = _opensearch_report(url, index_name, insecure, aws_region, aws_service, identity)
    emit(report.to_json(), as_json, [f"{_MARK[c.status]}  {c.name:18s} {c.detail}" for c in report.checks])
    return EXIT_FAILED if report.failed else EXIT_OK


def _opensearch_report(url, index_name, insecure, aws_region, aws_service, identity):
    from d2s_search.backends.opensearch.backend import OpenSearchBackend
    from d2s_search.backends.opensearch.doctor import diagnose

    if not url:
        raise click.UsageError("needs --url or D2S_OPENSEARCH_URL")
    store = OpenSearchBackend.from_env(url=url, index_name=index_name, verify=False if insecure else None,
                                       aws_region=aws_region, aws_service=aws_service, retries=2)
    try:
        return diagnose(store, identity)
    finally:
        store.close()
