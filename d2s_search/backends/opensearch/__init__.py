"""The OpenSearch engine: backend, connection (opensearch-py), query bodies by cluster version,
feature names, SEISMIC, ml-commons, Dashboards, doctor.
Runtime code: imports d2s_search's core modules, opensearch-py and httpx, never torch or the CLI.
"""
