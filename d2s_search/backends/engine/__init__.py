"""Engine-neutral pieces shared by the OpenSearch and Elasticsearch backends.

Only what both engines send or do identically lives here (request bodies, JSON encoding);
version dialects, PIT vs scroll, response shapes and client libraries stay in each engine.
"""
