"""Documents whose stored vectors are damaged: what a search warns about, `index check`
reports (the same documents), and `--repair` removes them, naming each by its path, so that
ingesting their files again restores them."""

from __future__ import annotations

import re
import shutil
import sqlite3

import numpy as np

from d2s_search.backends.local import LocalBackend
from tests.helpers import brute_force_sparse, run_cli, run_cli_json
from tests.reliability.local_index_fixtures import (
    filled_index,
    search_in_subprocess,
    synthetic_docs,
    warning_lines,
)

QUERY = {"w1": 1.0, "w2": 0.5, "w3": 0.25, "w7": 2.0}


def test_what_a_search_warns_about_check_reports_and_repair_names(tmp_path, capsys):
    index = tmp_path / "idx"
    docs = synthetic_docs(30, seed=11)
    filled_index(index, docs).close()
    db = sqlite3.connect(index / "index.sqlite")
    db.execute(
        "UPDATE docs SET dense = ? WHERE id = ?", (b"\x01\x02\x03", docs[4].id)
    )  # not a vector
    db.execute(
        "UPDATE docs SET term_ids = ? WHERE id = ?",
        (np.array([3, 10**6], "<i4").tobytes(), docs[17].id),
    )
    db.commit()
    db.close()
    damaged = {docs[4].path, docs[17].path}

    shutil.rmtree(index / "cache", ignore_errors=True)
    code, hits, err = search_in_subprocess(index, QUERY, k=100)
    assert code == 0, err
    (warning,) = warning_lines(err)
    assert "2 document(s)" in warning and "index check" in warning

    code, out, err = run_cli(["index", "check", "--index", index], capsys)
    assert code == 1, out
    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    (problem,) = report["database"]
    assert problem.startswith("2 document(s) have damaged stored vectors") and all(
        p in problem for p in damaged
    )

    code, report = run_cli_json(["index", "check", "--index", index, "--repair"], capsys)
    assert code == 3 and report["repaired"] and report["documents"] == 28, report
    named = {re.search(r"\((.*)\)$", lost).group(1) for lost in report["lost_documents"]}
    assert named == damaged

    code, report = run_cli_json(["index", "check", "--index", index], capsys)
    assert code == 0 and report["healthy"], report
    code, hits, err = search_in_subprocess(index, QUERY, k=100)
    assert code == 0 and not warning_lines(err), err
    good = [d for d in docs if d.path not in damaged]
    assert [h[0] for h in hits] == [i for i, _ in brute_force_sparse(good, QUERY)[:100]]
    # Their files ingested again: stored again, not skipped as "already stored".
    backend = LocalBackend(index)
    backend.open(None, create=False)
    assert backend.ids_present([docs[4].id, docs[17].id]) == set()
    backend.close()
    backend = filled_index(index, [docs[4], docs[17]])
    assert backend.count() == 30
    backend.close()
