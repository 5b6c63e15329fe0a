"""One path is one document, on every backend: one scenario through the CLI (ingest, query,
index stats, index prune), run by tests/test_paths.py (local), tests/opensearch/test_paths_opensearch.py
and tests/elasticsearch/test_es_paths.py.

A photo overwritten in place and ingested again replaces its document (the old picture no
longer answers with the new file's path); the same bytes at two paths are one document with
both paths, so deleting one copy drops only that path and ``prune`` removes the document only
when no copy is left; a copy found later and a move keep the document.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from d2s_search.images import content_id
from tests.helpers import run_cli_json, write_image


def check_one_path_one_document(
    tmp_path: Path, bundle: Path, where: list, open_store: Callable, capsys
) -> None:
    """``where``: the CLI arguments naming the index; ``open_store()``: that index, opened."""
    photos = tmp_path / "photos"
    a = write_image(photos / "a.jpg", 11)
    b = write_image(photos / "b.jpg", 12)
    old_a = (
        tmp_path / "old-a.jpg"
    )  # the first picture of a.jpg, kept outside the folder to query with
    shutil.copy(a, old_a)
    id_a, id_b = content_id(a.read_bytes()), content_id(b.read_bytes())

    def ingest(folder: Path = photos) -> dict:
        code, report = run_cli_json(["ingest", folder, "--bundle", bundle, *where], capsys)
        assert code == 0, report
        return report

    def paths() -> dict[str, list[str]]:
        """id -> its paths, the shown one first, as the index lists them."""
        store = open_store()
        try:
            listed: dict[str, list[str]] = {}
            for doc_id, path in store.document_paths():
                listed.setdefault(doc_id, []).append(path)
            return listed
        finally:
            store.close()

    def hits(picture: Path) -> list[dict]:
        code, result = run_cli_json(
            ["query", "--image", picture, "-k", "10", "--bundle", bundle, *where], capsys
        )
        assert code == 0, result
        return result["results"]

    def prune() -> dict:
        code, report = run_cli_json(["index", "prune", *where], capsys)
        assert code == 0, report
        return report

    assert ingest()["stored"] == 2
    assert paths() == {id_a: [str(a)], id_b: [str(b)]}

    # Overwritten in place: the new picture's document replaces the old one at that path.
    write_image(a, 13)
    id_new = content_id(a.read_bytes())
    assert ingest()["stored"] == 1
    assert paths() == {id_new: [str(a)], id_b: [str(b)]}
    answered = hits(old_a)
    assert id_a not in {h["id"] for h in answered}  # the old picture no longer answers as a.jpg
    assert [h["id"] for h in answered if h["path"] == str(a)] in ([], [id_new])
    code, stats = run_cli_json(["index", "stats", *where], capsys)
    assert stats["documents"] == 2 and stats["missing_files"] == 0

    # The same bytes at several paths: one document that has them all, whether the bytes were
    # stored before (a copy) or are new in this run (a duplicate).
    b2 = photos / "b2.jpg"
    shutil.copy(b, b2)
    d = write_image(photos / "d.jpg", 15)
    d2 = photos / "d2.jpg"
    shutil.copy(d, d2)
    id_d = content_id(d.read_bytes())
    report = ingest()
    assert report["stored"] == 1 and report["copies"] == 1 and report["duplicates"] == 1
    assert paths() == {id_new: [str(a)], id_b: [str(b), str(b2)], id_d: [str(d), str(d2)]}

    report = ingest()  # nothing changed: nothing stored, no path moves
    assert (
        report["stored"] == 0
        and report["already_stored"] == 5
        and report["moved"] == report["copies"] == 0
    )
    assert paths() == {id_new: [str(a)], id_b: [str(b), str(b2)], id_d: [str(d), str(d2)]}
    store = open_store()
    try:  # the lookup ingest makes agrees with the listing
        assert store.paths_of([id_b, id_d, "0" * 64]) == {
            id_b: [str(b), str(b2)],
            id_d: [str(d), str(d2)],
        }
    finally:
        store.close()

    # One copy deleted: only its path goes; the document stays, shown from the copy.
    b.unlink()
    code, stats = run_cli_json(["index", "stats", *where], capsys)
    assert stats["documents"] == 3 and stats["missing_files"] == 1
    report = prune()
    assert (
        report["missing"] == [str(b)] and report["removed"] == 0 and report["kept_by_a_copy"] == 1
    )
    assert paths()[id_b] == [str(b2)]
    assert {h["path"] for h in hits(b2) if h["id"] == id_b} == {str(b2)}

    # A copy found in a later run joins the document; a move replaces the gone path.
    later = tmp_path / "more" / "b-again.jpg"
    later.parent.mkdir()
    shutil.copy(b2, later)
    report = ingest(later.parent)
    assert report["copies"] == 1 and report["stored"] == 0
    assert paths()[id_b] == [str(b2), str(later)]
    moved = photos / "b-moved.jpg"
    b2.rename(moved)
    report = ingest()
    assert report["moved"] == 1 and report["stored"] == 0
    assert paths()[id_b] == [str(moved), str(later)]  # the new place is shown

    # Overwritten with the bytes of another stored picture: that path joins the other document,
    # and the picture it held, left without a path, is gone.
    shutil.copy(moved, a)
    assert ingest()["copies"] == 1
    assert paths() == {id_b: [str(moved), str(later), str(a)], id_d: [str(d), str(d2)]}

    # The last copies deleted: prune removes the document.
    for path in (moved, later, a):
        path.unlink()
    report = prune()
    assert report["removed"] == 1 and sorted(report["missing"]) == sorted(
        [str(moved), str(later), str(a)]
    )
    assert paths() == {id_d: [str(d), str(d2)]}
