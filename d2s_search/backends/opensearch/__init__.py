"""The OpenSearch engine: backend, HTTP client, query bodies, feature names, ml-commons, Dashboards.
Runtime code: imports d2s_search's core modules and httpx, never torch or the CLI.
"""
