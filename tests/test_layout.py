"""The package layout keeps its promises: no import cycles, torch only on the torch side."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import clean_env

ROOT = Path(__file__).resolve().parents[1]
# import name -> folder: the export side lives in onnx_export/ and installs as d2s_onnx_export
PACKAGES = {"d2s_search": "d2s_search", "d2s_onnx_export": "onnx_export"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``name`` imports anywhere (top level or inside functions)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod itself
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a package path
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_itself_back_through_others():
    modules = _modules()
    assert {"d2s_search.cli", "d2s_search.backends.opensearch.backend", "d2s_onnx_export.offline_mini.model"} <= set(modules)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_command_modules_never_import_the_group():
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("d2s_search.cli.") and name != "d2s_search.cli.__main__":
            assert "d2s_search.cli" not in _imports(name, path, modules), name


def test_runtime_side_never_imports_the_torch_side():
    """Statically: no runtime module names torch, transformers or d2s_onnx_export at all, except the
    commands that exist to run the torch side (export-onnx, train/embed/evaluate heads, align)."""
    torch_side = ("d2s_search.train", "d2s_onnx_export")
    may_reach = {"d2s_search.cli.export", "d2s_search.cli.train", "d2s_search.cli.align", "d2s_search.evaluate",
                 "d2s_search.ray_embed",
                 "d2s_search.embed"}
    modules = _modules()
    offenders = []
    for name, path in modules.items():
        if name.startswith(torch_side) or name in may_reach:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{name}: {n}" for n in names if n.split(".")[0] in ("torch", "transformers", "d2s_onnx_export")
                          or n.startswith("d2s_search.train")]
    assert offenders == []


def test_importing_every_runtime_module_loads_no_torch(tmp_path):
    runtime = sorted(n for n in _modules() if n.startswith("d2s_search") and not n.startswith("d2s_search.train"))
    script = (
        "import importlib, json, sys\n"
        f"for name in {runtime!r}:\n"
        "    if name.endswith('__main__'):\n"
        "        continue\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(tmp_path),
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_command_modules_are_not_hidden_by_their_commands():
    import types

    import d2s_search.cli as cli_package

    for name in ("align", "cluster", "export", "index", "search", "serve", "train", "options", "output"):
        __import__(f"d2s_search.cli.{name}")
        assert isinstance(getattr(cli_package, name), types.ModuleType), name


def test_nothing_imports_the_export_side_by_its_folder_name():
    """The folder is onnx_export/, the installed package d2s_onnx_export: an import of the bare
    name works only from a checkout's root, and would load a second copy next to the first."""
    offenders = []
    for folder in ("d2s_search", "onnx_export", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "onnx_export"]
    assert offenders == []
