"""Engine-neutral pieces shared by the OpenSearch and Elasticsearch backends.

Only what both engines send or do identically lives here: request bodies and JSON encoding
(bodies), the ``_source`` of a document (documents), bulk rounds and 413 halving (bulk), the
bundle checks (identity), and the index logic itself (index: open, reindex, writes, reads by
id, hits) as a base class. Version dialects, PIT vs scroll, the bulk transport, body shapes
that differ and client libraries stay in each engine.
"""
