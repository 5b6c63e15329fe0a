"""`query`'s hit table, laid out without rich's Table: columns line up in terminal cells,
matched terms wrap between terms, the width comes from $COLUMNS or the terminal."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from d2s_search.cli.output import table_lines, terminal_width, wrap_items
from tests.helpers import run_cli, run_cli_json


def test_items_wrap_between_items_and_a_too_long_item_is_folded():
    items = ["car 4.37", "cars 3.56", "dog 3.29", "dogs 2.35"]
    assert wrap_items(items, 20) == ["car 4.37, cars 3.56,", "dog 3.29, dogs 2.35"]
    assert wrap_items(items, 200) == ["car 4.37, cars 3.56, dog 3.29, dogs 2.35"]
    assert wrap_items(["abcdefghij 1.00", "x 2.00"], 6) == ["abcdef", "ghij", "1.00,", "x 2.00"]
    assert wrap_items(["a rather long term 1.00", "x 2.00"], 12) == ["a rather", "long term", "1.00, x 2.00"]
    assert wrap_items([], 10) == []
    assert wrap_items(["日本 1.00", "猫 2.00"], 10) == ["日本 1.00,", "猫 2.00"]  # CJK: two cells each


def test_table_columns_line_up_in_cells_and_the_last_wraps():
    rows = [("1", "2.5000", "a/日本.jpg"), ("10", "12.2500", "b/long-name.jpg")]
    items = [["dog 1.00", "cat 0.50"], ["car 2.00", "bus 1.00", "van 0.25"]]
    lines = table_lines(("#", "score", "path", "matched"), rows, items, right={0, 1}, width=49, min_last=10)
    assert lines == [
        " #    score  path             matched",
        " 1   2.5000  a/日本.jpg       dog 1.00, cat 0.50",
        "10  12.2500  b/long-name.jpg  car 2.00, bus 1.00,",
        "                              van 0.25",
    ]
    # the matched column starts at the same cell on every line, wide characters or not
    assert {cell_len(line.split("  dog")[0]) for line in lines[1:2]} == {28}
    narrow = table_lines(("#", "matched"), [("1",)], [["dog 1.00", "cat 0.50"]], width=5, min_last=9)
    assert narrow == ["#  matched", "1  dog 1.00,", "   cat 0.50"]  # never under min_last


def test_terminal_width_follows_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "123")
    assert terminal_width() == 123
    monkeypatch.setenv("COLUMNS", "wide")  # not a number: the terminal's, or 80 without one
    assert terminal_width() >= 1


@pytest.mark.parametrize("columns", ["60", "100"])
def test_query_prints_every_hit_once_with_its_score_and_terms(tmp_path, tiny_blip_bundle, image_folder, capsys,
                                                             monkeypatch, columns):
    index = tmp_path / "idx"
    assert run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)[0] == 0
    code, report = run_cli_json(["query", "a dog", "--index", index, "-k", "5", "--no-serve"], capsys)
    assert code == 0
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run_cli(["query", "a dog", "--index", index, "-k", "5", "--no-serve"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["#", "score", "path", "matched", "words"]
    assert lines[-1].startswith("5 result(s), sparse, ")
    text = " ".join(out.split())
    for hit in report["results"]:
        assert f"{hit['rank']} {hit['score']:.4f} " in text
        assert text.count(hit["path"].rpartition("/")[2]) == 1
        # inflections collapsed: each word once, its forms' contributions summed
        assert hit["words"] and len({w["word"] for w in hit["words"]}) == len(hit["words"])
        for word in hit["words"]:
            assert f"{word['word']} {word['contribution']:.2f}" in text
    assert all(cell_len(line) <= max(int(columns), 5 + 9 + 2 + 24 + 6 + 40) for line in lines)
