"""`index prune` / `index stats` on a remote backend (OpenSearch, Elasticsearch): one scenario,
run by tests/opensearch/test_prune_opensearch.py and tests/elasticsearch/test_es_prune.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from d2s_search.backends.base import Document, PathListing
from d2s_search.cli.index import index_prune, index_stats


def documents_with_files(docs: list[Document], folder: Path, gone: set[int]) -> list[Document]:
    """``docs`` pointed at files in ``folder`` (a space and non-ASCII in the names); the files of
    the positions in ``gone`` are not created."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        path = folder / f"pic {i:02d} é.jpg"
        if i not in gone:
            path.write_bytes(b"\xff\xd8 not decoded here")
        doc.path = str(path)
    return docs


def check_prune(store, docs: list[Document], gone: set[int], cli_args: list[str]) -> None:
    """``store`` holds ``docs``, whose files at the positions in ``gone`` are missing."""
    assert isinstance(store, PathListing)
    every = {d.id: d.path for d in docs}
    # Paging: with two per page, every document comes back exactly once.
    listed = list(store.document_paths(page=2))
    assert len(listed) == len(docs) and dict(listed) == every
    asked = [docs[0].id, docs[-1].id, "0" * 64]
    assert store.paths_of(asked) == {docs[0].id: [docs[0].path], docs[-1].id: [docs[-1].path]}
    assert store.paths_of([]) == {}

    missing = sorted(docs[i].path for i in gone)
    kept = {d.id for i, d in enumerate(docs) if i not in gone}
    runner = CliRunner()
    stats = runner.invoke(index_stats, [*cli_args, "--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["missing_files"] == len(gone)

    dry = runner.invoke(index_prune, [*cli_args, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    out = json.loads(dry.stdout)
    assert sorted(out["missing"]) == missing and out["removed"] == 0 and out["documents"] == len(docs)
    assert store.ids_present(every) == set(every)  # a dry run removes nothing

    real = runner.invoke(index_prune, [*cli_args, "--json"])
    assert real.exit_code == 0, real.output
    out = json.loads(real.stdout)
    assert sorted(out["missing"]) == missing and out["removed"] == len(gone)
    assert store.ids_present(every) == kept  # exactly the documents whose file is gone
    assert dict(store.document_paths()) == {i: p for i, p in every.items() if i in kept}

    after = runner.invoke(index_stats, [*cli_args, "--json"])
    assert json.loads(after.stdout)["missing_files"] == 0 and json.loads(after.stdout)["documents"] == len(kept)
