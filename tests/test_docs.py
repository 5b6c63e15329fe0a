"""The documentation a user reads stays true to the repository: links and anchors resolve, every
benchmark table says how to reproduce it, every benchmark script is listed, and the project
speaks of what it does, not of how it was made."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Built from parts so that this file does not match itself.
HISTORY = re.compile("|".join(["sess" + r"ion [0-9]", "iss" + r"ue [0-9#]", r"\(" + "issue"]), re.IGNORECASE)


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = anchor(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, fragment = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{fragment}")
    assert not broken, f"{doc.name}: " + "; ".join(broken)


def test_anchor_rule_matches_github() -> None:
    assert anchor(" Caption benchmark: the default recipe") == "caption-benchmark-the-default-recipe"
    assert anchor("The training recipe (`d2s-search train` defaults)") == "the-training-recipe-d2s-search-train-defaults"
    assert anchor("Joint training (`--objective joint`, not the default)") == "joint-training---objective-joint-not-the-default"


def test_the_repository_speaks_of_the_product_not_its_history() -> None:
    hits = []
    for top in ("README.md", "docs", "d2s_search", "onnx_export", "benchmarks", "tests", "mappings"):
        paths = [ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")
        for path in paths:
            if path.suffix not in {".md", ".py", ".c", ".json", ".js", ".html", ".toml", ".txt", ".yml", ".ndjson"}:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if HISTORY.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits[:20])


def test_benchmark_doc_is_short_and_every_table_has_its_command() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 600
    sections = re.split(r"^#{2,3} ", text, flags=re.MULTILINE)[1:]
    missing = [s.splitlines()[0] for s in sections if "\n|---" in s and "benchmarks/" not in s]
    assert not missing, f"tables without a reproduction command: {missing}"


def test_every_benchmark_script_is_listed_and_every_suite_entry_exists() -> None:
    bench = ROOT / "benchmarks"
    listed = (bench / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in bench.glob("*.py") if f"`{p.name}`" not in listed]
    assert not unlisted, f"benchmarks/README.md does not list {unlisted}"
    sys.path.insert(0, str(bench))
    try:
        import run
    finally:
        sys.path.remove(str(bench))
    for entry in run.SUITE:
        assert (bench / entry.script).is_file(), entry
        assert f"`{entry.name}`" in listed, f"run.py entry {entry.name} is not in benchmarks/README.md"
    quick = [e for e in run.SUITE if e.quick]
    assert quick, "the quick set is empty"
    for entry in quick:  # the quick set writes the doc's tables: each script renders one
        source = (bench / entry.script).read_text(encoding="utf-8")
        assert "def render(" in source, entry.script
