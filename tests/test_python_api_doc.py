"""docs/python-api.md cannot drift: its ```python blocks run in order, as its "How the examples
run" section says (a folder with the bundle at d2s-bundles/blip-itm-base-coco, here the tiny
model, and pictures under photos/), and every public name has an example."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import d2s_search
from tests.helpers import write_image

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
NOT_RUN = "# needs a cluster"


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


@pytest.fixture
def example_folder(tmp_path, tiny_blip_bundle, monkeypatch) -> Path:
    shutil.copytree(tiny_blip_bundle, tmp_path / "d2s-bundles" / "blip-itm-base-coco")
    write_image(tmp_path / "photos" / "dog.jpg", seed=11)
    write_image(tmp_path / "photos" / "cat.png", seed=12)
    write_image(tmp_path / "photos" / "trip" / "beach.jpg", seed=13)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_examples_run_in_order(example_folder, capsys):
    namespace: dict = {}
    ran = 0
    for n, code in enumerate(blocks(), 1):
        compiled = compile(code, f"{DOC.name}, python block {n}", "exec")
        if code.startswith(NOT_RUN):
            continue
        exec(compiled, namespace)  # noqa: S102 (the doc's own examples)
        ran += 1
    printed = capsys.readouterr().out
    assert ran >= 7
    # What the examples made is what the page says they make.
    assert namespace["report"].stored == 3 and namespace["report"].exit_code == 0
    assert namespace["again"].already_stored == 3 and namespace["again"].stored == 0
    assert len(namespace["result"].hits) == 3 and namespace["result"].weak_query is True
    assert namespace["by_picture"].hits[0].path == str(example_folder / "photos" / "trip" / "beach.jpg")
    assert namespace["by_picture"].fusion == "client-minmax"
    assert len(namespace["pictures"][0].sparse) == 64
    assert [(b.added, b.moved, b.removed) for b in namespace["batches"]] == [(1, 0, 0), (0, 0, 1)]
    assert "3 documents in " + str(example_folder / "d2s-index") in printed
    assert "IndexStoreError: no index at" in printed
    assert "/photos/api/documents/" in printed and "tiny-blip 16" in printed
    assert namespace["library"].mode == "library" and [Path(h.path).name for h in namespace["library"].hits] == [
        "beach.jpg"]
    assert namespace["stored"].fields == {"trip": "seaside", "rating": 5.0}
    assert "rating >= 4.0" in printed and "[('home', 1), ('seaside', 1)]" in printed


def test_every_public_name_has_an_example():
    code = "\n".join(blocks())
    missing = [name for name in d2s_search.__all__ if name != "__version__" and f"d2s_search.{name}" not in code]
    assert not missing, f"docs/python-api.md has no example using {missing}"


def test_only_cluster_examples_are_not_run():
    not_run = [code for code in blocks() if code.startswith(NOT_RUN)]
    assert len(not_run) == 3 and all("url=" in code for code in not_run)  # a cluster index: opened, enriched, by ids
