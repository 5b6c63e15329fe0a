"""`index prune` and the missing-file count of `index stats` with ``--backend elasticsearch``
(osmem behind the compatibility proxy), reading only the stored paths; the bodies that do it,
against the Elasticsearch API specification."""

from __future__ import annotations

from d2s_os_reference import synthetic_docs

from d2s_search.backends.elasticsearch import queries as q
from tests.remote_prune import check_prune, documents_with_files

GONE = {0, 3, 6}


def test_prune_removes_exactly_the_documents_whose_file_is_gone(make_backend, es_proxy, identity, tmp_path):
    store = make_backend(es_proxy.url)
    store.open(identity)
    docs = documents_with_files(synthetic_docs(7, dim=8), tmp_path / "pics", GONE)
    store.upsert(docs)
    check_prune(store, docs, GONE,
                ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", store.index_name])


def test_paths_travel_without_the_vectors(spec, make_backend, es_proxy, identity):
    store = make_backend(es_proxy.url)
    store.open(identity)
    docs = synthetic_docs(5, dim=8)
    store.upsert(docs)
    start = len(es_proxy.sent)
    assert dict(store.document_paths(page=2)) == {d.id: d.path for d in docs}
    assert store.paths_of([docs[2].id]) == {docs[2].id: [docs[2].path]}
    sent = es_proxy.sent[start:]
    pages = [s.json() for s in sent if s.path.split("?")[0] == "/_search"]
    assert len(pages) == 4 and all(p["_source"] == {"includes": ["path"]} for p in pages)  # 2 + 2 + 1 + empty
    for page in pages:
        spec.validate("POST", "/_search", page)
    (mget,) = [s for s in sent if "/_mget" in s.path]
    assert "_source=path" in mget.path
    spec.validate("POST", "/{index}/_mget", mget.json())
    (close,) = [s for s in sent if s.method == "DELETE" and s.path.split("?")[0] == "/_pit"]
    spec.validate("DELETE", "/_pit", close.json())


def test_path_page_body_matches_spec(spec):
    spec.validate("POST", "/_search", q.pit_page_body("pit-id", 1000, fields=["path"]))
    spec.validate("POST", "/_search", q.pit_page_body("pit-id", 1000, after=[3, 17], fields=["path"]))
