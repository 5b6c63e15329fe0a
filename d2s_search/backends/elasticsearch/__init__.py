"""The Elasticsearch engine: backend on the official client, query bodies, feature names, Kibana.
Runtime code: imports d2s_search's core modules, the ``elasticsearch`` client and httpx, never torch
or the CLI. Pure helpers shared with OpenSearch (feature-name escaping, Lucene's 9-bit weights,
matched terms) are imported from ``backends.opensearch.features``, not copied.
"""
