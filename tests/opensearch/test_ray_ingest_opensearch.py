"""``ingest --engine ray`` into OpenSearch (osmem): the workers write to ``_bulk`` themselves,
the documents are those one process stores, and a second run stores nothing twice. Ray is
started by the command itself here (a local instance for the run, stopped after it)."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.opensearch.backend import OpenSearchBackend
from tests.helpers import run_cli_json, write_image

pytest.importorskip("ray", reason="the ray extra is not installed")


def _documents(url: str, name: str) -> dict:
    store = OpenSearchBackend(url, index_name=name)
    store.open(None, create=False)
    try:
        ids = sorted({doc_id for doc_id, _ in store.document_paths()})
        paths = store.paths_of(ids)
        return {d.id: (sorted(paths[d.id]), d.sparse, np.asarray(d.dense)) for d in store.get(ids)}
    finally:
        store.close()


def test_workers_write_to_the_cluster(tmp_path, tiny_blip_bundle, osmem_url, capsys, monkeypatch):
    import ray

    assert not ray.is_initialized()
    monkeypatch.setenv("D2S_OPENSEARCH_USER", "admin")  # carried to the workers with the job
    for i in range(24):
        write_image(tmp_path / "photos" / f"p{i:02d}.jpg", seed=100 + i)
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    common = [tmp_path / "photos", "--bundle", tiny_blip_bundle, "--url", osmem_url, "--batch-size", "8"]
    code, one = run_cli_json(["ingest", *common, "--index-name", "one-process"], capsys)
    assert code == 3 and one["stored"] == 24
    code, report = run_cli_json(["ingest", *common, "--index-name", "by-ray", "--engine", "ray", "--workers", "2"],
                                capsys)
    assert code == 3 and report["stored"] == 24 and report["workers"]["count"] == 2
    assert [r["path"] for r in report["rejected"]] == [str(tmp_path / "photos" / "broken.jpg")]
    assert not ray.is_initialized()  # the run's own Ray instance is stopped
    got, want = _documents(osmem_url, "by-ray"), _documents(osmem_url, "one-process")
    assert got.keys() == want.keys() and len(got) == 24
    for doc_id, (paths, terms, dense) in want.items():
        assert got[doc_id][0] == paths and got[doc_id][1].keys() == terms.keys()
        np.testing.assert_allclose(got[doc_id][2], dense, rtol=1e-5, atol=1e-7)

    code, again = run_cli_json(["ingest", *common, "--index-name", "by-ray", "--engine", "ray", "--workers", "1"],
                               capsys)
    assert code == 3 and again["stored"] == 0 and again["already_stored"] == 24
    assert len(_documents(osmem_url, "by-ray")) == 24
