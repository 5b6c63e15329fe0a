"""A database that lost its documents table, or was emptied, is damage: no answer from the
search cache made before, `index check` says so, ingest refuses to start a new index over it,
and `index check --repair` makes it usable again, naming every lost document by its path."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from d2s_search.backends.local import LocalBackend
from d2s_search.errors import IndexStoreError
from tests.helpers import brute_force_sparse, run_cli, run_cli_json, write_image
from tests.reliability.local_index_fixtures import IDENTITY, filled_index, synthetic_docs

QUERY = {"w1": 1.0, "w2": 0.5, "w7": 2.0}


def drop_docs(index):
    db = sqlite3.connect(index / "index.sqlite")
    db.execute("DROP TABLE docs")
    db.commit()
    db.close()


def truncate_database(index):
    with open(index / "index.sqlite", "wb"):
        pass


@pytest.fixture(
    params=[drop_docs, truncate_database], ids=["docs-table-dropped", "database-truncated"]
)
def damaged(request, tmp_path):
    index = tmp_path / "idx"
    docs = synthetic_docs(30, seed=8)
    backend = filled_index(index, docs)
    assert backend.sparse_search(QUERY, 5)  # the cache now holds every document
    backend.close()
    request.param(index)
    return index, docs


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_queries_do_not_answer_from_the_cache_of_what_is_gone(damaged):
    index, _ = damaged
    backend = LocalBackend(index)
    with pytest.raises(IndexStoreError) as caught:
        backend.open(None, create=False)
        backend.sparse_search(QUERY, 10)
    backend.close()
    message = str(caught.value)
    assert "\n" not in message and "nothing was written" in message
    assert "index check" in message and "--repair" in message and "index delete" in message


def test_check_reports_it_and_ingest_refuses_to_start_afresh(
    damaged, tmp_path, tiny_blip_bundle, capsys
):
    index, _ = damaged
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 1 and not report["healthy"] and report["database"], report
    before = sha(index / "index.sqlite")
    photo = write_image(tmp_path / "photos" / "new.jpg", seed=7)
    code, out, err = run_cli(
        ["ingest", photo, "--bundle", tiny_blip_bundle, "--index", index], capsys
    )
    assert code == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "--repair" in err and "index delete" in err
    assert sha(index / "index.sqlite") == before  # nothing written over it
    backend = LocalBackend(index)
    with pytest.raises(IndexStoreError):  # nor through the backend itself
        backend.open(IDENTITY, create=True)
    backend.close()
    assert sha(index / "index.sqlite") == before
    code, out, err = run_cli(
        ["index", "delete", "--index", index, "--yes"], capsys
    )  # the other way out
    assert code == 0 and not index.exists(), err


def test_repair_names_every_lost_document_and_leaves_a_working_index(damaged, capsys):
    index, docs = damaged
    code, report = run_cli_json(["index", "check", "--index", index, "--repair"], capsys)
    assert code == 3 and report["repaired"] and report["documents"] == 0, report
    assert len(report["lost_documents"]) == 30
    assert {lost.split(" (", 1)[1].rstrip(")") for lost in report["lost_documents"]} == {
        d.path for d in docs
    }
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 0 and report["healthy"], report
    more = synthetic_docs(5, seed=9)
    backend = filled_index(index, more)  # the same bundle as before, recorded again
    assert [h.id for h in backend.sparse_search(QUERY, 100)] == [
        i for i, _ in brute_force_sparse(more, QUERY)
    ]
    backend.close()


def test_a_running_search_stops_answering_when_the_documents_table_is_dropped(tmp_path):
    index = tmp_path / "idx"
    docs = synthetic_docs(30, seed=8)
    backend = filled_index(index, docs)
    assert [h.id for h in backend.sparse_search(QUERY, 100)] == [
        i for i, _ in brute_force_sparse(docs, QUERY)
    ]
    drop_docs(index)  # by another program, while this one (a serve) keeps its cache
    with pytest.raises(IndexStoreError) as caught:
        backend.sparse_search(QUERY, 100)
    assert "index check" in str(caught.value) and "\n" not in str(caught.value)
    backend.close()
