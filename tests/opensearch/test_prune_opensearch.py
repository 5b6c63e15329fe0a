"""`index prune` and the missing-file count of `index stats` on OpenSearch (osmem), reading
only the stored paths; the bodies that do it, against the OpenSearch API specification."""

from __future__ import annotations

import json

from d2s_os_faultproxy import FaultProxy
from d2s_os_reference import synthetic_docs

from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.backend import OpenSearchBackend
from tests.remote_prune import check_prune, documents_with_files

GONE = {1, 4, 5}


def test_prune_removes_exactly_the_documents_whose_file_is_gone(backend, osmem_url, tmp_path):
    docs = documents_with_files(synthetic_docs(7, dim=8), tmp_path / "pics", GONE)
    backend.upsert(docs)
    check_prune(backend, docs, GONE,
                ["--backend", "opensearch", "--url", osmem_url, "--index-name", backend.index_name])


def test_paths_travel_without_the_vectors(spec, osmem_url, identity, tmp_path):
    rec = FaultProxy(osmem_url)  # records every request and answer
    b = OpenSearchBackend(rec.url, index_name="d2s-paths", sleep=lambda s: None)
    try:
        b.open(identity)
        docs = synthetic_docs(5, dim=8)
        b.upsert(docs)
        start = len(rec.log)
        assert dict(b.document_paths(page=2)) == {d.id: d.path for d in docs}
        assert b.paths_of([docs[2].id]) == {docs[2].id: [docs[2].path]}
    finally:
        b.close()
        rec.close()
    sent = rec.log[start:]
    scans = [json.loads(s.body) for s in sent if s.path.split("?")[0] == "/d2s-paths/_search"]
    assert scans == [q.scan_body(2, ["path"])]
    spec.validate("POST", "/{index}/_search", scans[0])
    scrolls = [s for s in sent if s.path.split("?")[0] == "/_search/scroll"]
    assert [s.method for s in scrolls] == ["POST"] * 3 + ["DELETE"]  # pages 2 and 3, the empty 4th, clear
    for s in scrolls:
        spec.validate(s.method, "/_search/scroll", json.loads(s.body))
    (mget,) = [s for s in sent if "/_mget" in s.path]
    assert "_source=path" in mget.path
    spec.validate("POST", "/{index}/_mget", json.loads(mget.body))


def test_scan_bodies_match_spec(spec):
    spec.validate("POST", "/{index}/_search", q.scan_body(200))
    spec.validate("POST", "/{index}/_search", q.scan_body(1000, ["path"]))


def test_ingest_follows_a_moved_file_reading_only_paths(osmem_url, tiny_blip_bundle, tmp_path):
    from click.testing import CliRunner

    from d2s_search.cli import cli
    from tests.helpers import write_image

    photos = [write_image(tmp_path / "old" / f"{i}.jpg", seed=i) for i in range(3)]
    rec = FaultProxy(osmem_url)
    common = ["--bundle", str(tiny_blip_bundle), "--backend", "opensearch", "--url", rec.url, "--index-name", "pics"]
    try:
        runner = CliRunner()
        assert runner.invoke(cli, ["ingest", str(tmp_path / "old"), *common, "--json"]).exit_code == 0
        moved = tmp_path / "new" / "renamed.jpg"
        moved.parent.mkdir()
        photos[0].rename(moved)
        write_image(tmp_path / "new" / "fresh.jpg", seed=9)  # keeps the folder from being all-known
        start = len(rec.log)
        res = runner.invoke(cli, ["ingest", str(tmp_path / "new"), *common, "--json"])
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        assert report["moved"] == 1 and report["stored"] == 1
        mgets = [s for s in rec.log[start:] if "/_mget" in s.path]
    finally:
        rec.close()
    b = OpenSearchBackend(osmem_url, index_name="pics")
    try:
        listed = dict(b.document_paths())
    finally:
        b.close()
    assert sorted(listed.values()) == sorted([str(moved), str(photos[1]), str(photos[2]),
                                              str(tmp_path / "new" / "fresh.jpg")])
    # Which ids are stored, then their paths only, and those of the documents the move touches,
    # then the metadata of the known picture (is it still what the file says?): never a whole
    # document (its vectors).
    sources = [s.path.split("_source=")[1].split("&")[0] for s in mgets]
    assert sources == ["false", "path", "path", "path%2Ctaken_at%2Ccamera%2Clocation%2Cfields"]
    moved_id = next(i for i, p in listed.items() if p == str(moved))
    assert json.loads(mgets[2].body)["ids"] == json.loads(mgets[3].body)["ids"] == [moved_id]
