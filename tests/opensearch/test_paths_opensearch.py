"""One path is one document on OpenSearch (osmem): the scenario of tests/one_path_one_document.py."""

from __future__ import annotations

from d2s_search.backends.opensearch.backend import OpenSearchBackend
from tests.one_path_one_document import check_one_path_one_document


def test_one_path_is_one_document(tmp_path, tiny_blip_bundle, osmem_url, capsys):
    def open_store():
        store = OpenSearchBackend(osmem_url, index_name="paths")
        store.open(None, create=False)
        return store

    check_one_path_one_document(
        tmp_path,
        tiny_blip_bundle,
        ["--url", osmem_url, "--index-name", "paths"],
        open_store,
        capsys,
    )
