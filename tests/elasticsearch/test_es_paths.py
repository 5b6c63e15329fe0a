"""One path is one document with ``--backend elasticsearch`` (osmem behind the compatibility
proxy): the scenario of tests/one_path_one_document.py."""

from __future__ import annotations

from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend
from tests.one_path_one_document import check_one_path_one_document


def test_one_path_is_one_document(tmp_path, tiny_blip_bundle, es_proxy, capsys):
    def open_store():
        store = ElasticsearchBackend(es_proxy.url, index_name="paths")
        store.open(None, create=False)
        return store

    where = ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", "paths"]
    check_one_path_one_document(tmp_path, tiny_blip_bundle, where, open_store, capsys)
