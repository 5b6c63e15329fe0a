"""Optional dependencies: every command checks what it needs before any work (one line naming
the extra, exit 1, the JSON error under --json), the table agrees with pyproject.toml, and
the plain install (the base dependencies alone) runs the main job on a local index.

A package is made "not installed" in a fresh process by a meta-path finder that refuses it,
which is what Python reports for a package that is absent (ModuleNotFoundError).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import click
import pytest
from packaging.requirements import Requirement

from d2s_search.cli import cli
from d2s_search.settings import tomllib  # tomli on Python 3.10
from tests.helpers import clean_env, write_image

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# Runs the console script's main() in a process where the top-level packages named in
# argv[1] (comma-separated) cannot be imported.
WITHOUT = (
    "import sys\n"
    "class Absent:\n"
    "    def __init__(self, names):\n"
    "        self.names = set(filter(None, names.split(',')))\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.partition('.')[0] in self.names:\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "        return None\n"
    "sys.meta_path.insert(0, Absent(sys.argv[1]))\n"
    "from d2s_search.cli import main\n"
    "main(sys.argv[2:])\n"
)


def _run_without(absent, args, tmp_path, cwd=None):
    env = clean_env(tmp_path) | {
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "100",
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }  # the hub is never reached
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, ",".join(absent), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or tmp_path,
        timeout=300,
    )


def _captions(tmp_path: Path) -> Path:
    for i in range(3):
        write_image(tmp_path / "photos" / f"p{i}.jpg", seed=i)
    csv = tmp_path / "captions.csv"
    csv.write_text(
        "image,caption\n" + "".join(f"photos/p{i}.jpg,a photo number {i}\n" for i in range(3))
    )
    return csv


def _embeddings(folder: Path) -> Path:
    """A small dataset in the npy layout (no pyarrow needed to read it)."""
    import numpy as np

    from d2s_search.train.data import write_embeddings

    rng = np.random.default_rng(0)
    images = [
        {
            "imgid": str(i),
            "split": "train" if i < 6 else "val",
            "sentences": [{"sentid": f"{i}-0", "raw": f"a dog number {i}"}],
        }
        for i in range(8)
    ]
    write_embeddings(
        folder, "img", [str(i) for i in range(8)], rng.standard_normal((8, 16)), fmt="npy"
    )
    write_embeddings(
        folder, "text", [f"{i}-0" for i in range(8)], rng.standard_normal((8, 16)), fmt="npy"
    )
    (folder / "dataset_meta.json").write_text(json.dumps({"images": images}))
    return folder


CASES = {
    # name: (absent packages, extra the line names, what needs them, args; "{...}" filled per test)
    "embed without pyarrow": (
        ["pyarrow"],
        "train",
        "pyarrow",
        ["embed", "{captions}", "--bundle", "{bundle}", "--no-images", "--out", "{out}"],
    ),
    "train without torch": (
        ["torch"],
        "train",
        "torch",
        ["train", "--data", "{embeddings}", "--out", "{out}"],
    ),
    "offline export without torch": (
        ["torch"],
        "export",
        "torch",
        ["export-onnx", "--model", "offline-mini", "--out", "{out}"],
    ),
    "plain export without torch": (["torch"], "export", "torch", ["export-onnx", "--out", "{out}"]),
    "ingest without onnxruntime": (
        ["onnxruntime"],
        "cpu",
        "onnxruntime",
        ["ingest", "{photos}", "--bundle", "{bundle}", "--index", "{out}"],
    ),
    "query without onnxruntime": (
        ["onnxruntime"],
        "cpu",
        "onnxruntime",
        ["query", "dogs", "--index", "{out}"],
    ),
    "ingest into OpenSearch without its client": (
        ["opensearchpy"],
        "opensearch",
        "opensearch-py",
        [
            "ingest",
            "{photos}",
            "--bundle",
            "{bundle}",
            "--url",
            "http://127.0.0.1:9",
            "--index",
            "{out}",
        ],
    ),
    "ingest --watch without watchdog": (
        ["watchdog"],
        "watch",
        "watchdog",
        ["ingest", "{photos}", "--bundle", "{bundle}", "--index", "{out}", "--watch"],
    ),
    "serve without fastapi": (
        ["fastapi", "uvicorn"],
        "serve",
        "fastapi",
        ["serve", "--index", "{out}", "--port", "0"],
    ),
}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_package_is_one_line_naming_the_extra_before_any_work(
    case, as_json, tmp_path, tiny_blip_bundle
):
    absent, extra, package, args = CASES[case]
    out = tmp_path / "out"
    fill = {
        "captions": _captions(tmp_path),
        "bundle": tiny_blip_bundle,
        "out": out,
        "photos": tmp_path / "photos",
        "embeddings": _embeddings(tmp_path / "embs"),
    }
    done = _run_without(
        absent, [a.format(**fill) for a in args] + (["--json"] if as_json else []), tmp_path
    )
    assert done.returncode == 1, done.stderr
    install = f"pip install 'd2s-search[{extra}]'"
    if as_json:
        error = json.loads(done.stdout)["error"]
        assert error["type"] == "MissingDependencyError" and install in error["message"], error
        message = error["message"]
    else:
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and install in lines[0], (
            done.stderr
        )
        message = lines[0]
    assert package in message and "hub" not in message and "Traceback" not in done.stderr
    assert not out.exists()  # nothing embedded, trained, exported or indexed
    assert {p.name for p in tmp_path.iterdir()} - {"config"} == {"captions.csv", "photos", "embs"}


def test_the_line_says_which_option_asks_and_what_needs_nothing(tmp_path, tiny_blip_bundle):
    done = _run_without(
        ["pyarrow"],
        [
            "embed",
            _captions(tmp_path),
            "--bundle",
            tiny_blip_bundle,
            "--no-images",
            "--out",
            tmp_path / "out",
        ],
        tmp_path,
    )
    assert done.stderr == (
        "error: `d2s-search embed` (--format parquet) needs pyarrow, which is not installed: "
        "pip install 'd2s-search[train]', or use --format npy\n"
    )
    npy = _run_without(
        ["pyarrow"],
        [
            "embed",
            _captions(tmp_path),
            "--bundle",
            tiny_blip_bundle,
            "--no-images",
            "--format",
            "npy",
            "--out",
            tmp_path / "out",
            "--json",
        ],
        tmp_path,
    )
    assert npy.returncode == 0, npy.stderr
    assert json.loads(npy.stdout)["text"]["count"] == 3


def _command_paths(group: click.Group, prefix: str = "") -> list[str]:
    found = []
    for name in group.commands:
        command = group.commands[name]
        found.append(f"{prefix}{name}")
        if isinstance(command, click.Group):
            found += _command_paths(command, f"{prefix}{name} ")
    return found


def test_every_command_has_its_row_and_no_row_names_a_command_that_is_gone():
    from d2s_search import extras

    assert sorted(extras.COMMAND_NEEDS) == sorted(_command_paths(cli))


def _declared(extra: str) -> set[str]:
    """PyPI names an extra installs, following `d2s-search[other]` references."""
    names: set[str] = set()
    for spec in PYPROJECT["project"]["optional-dependencies"][extra]:
        req = Requirement(spec)
        if req.name == "d2s-search":
            for other in req.extras:
                names |= _declared(other)
        else:
            names.add(req.name)
    return names


def test_each_extra_the_table_names_installs_the_packages_it_lists():
    from d2s_search import extras

    for extra, modules in extras.EXTRAS.items():
        assert set(modules.values()) <= _declared(extra), extra
    for needs in extras.COMMAND_NEEDS.values():
        for need in needs:
            assert set(need.module_names()) <= set(extras.EXTRAS[need.extra]), need


# --- the plain install ---------------------------------------------------------------------


def _base_closure() -> set[str]:
    """Normalised names of the distributions `pip install d2s-search` brings, from
    pyproject.toml's dependencies and the installed packages' own requirements."""
    env = {"extra": ""}
    todo = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in seen or (req.marker and not req.marker.evaluate(env)):
            continue
        seen.add(name)
        with contextlib.suppress(
            metadata.PackageNotFoundError
        ):  # not installed: no requirements to follow
            todo += [Requirement(r) for r in metadata.requires(req.name) or []]
    return seen


def test_the_plain_install_holds_an_onnx_runtime_and_no_cluster_client_or_faiss():
    base = _base_closure()
    assert "onnxruntime" in base
    assert not base & {"opensearch-py", "grpcio", "faiss-cpu", "elasticsearch", "torch", "pyarrow"}
    assert _declared("opensearch") == {"opensearch-py"} and _declared("faiss") == {"faiss-cpu"}


def test_the_plain_install_runs_the_main_job(tmp_path, tiny_blip_bundle):
    """ingest, query and index stats on a local index, every package outside the base
    dependencies unimportable (torch, the cluster clients, faiss, fastapi, pyarrow, ...)."""
    base = _base_closure()
    outside = sorted(
        {
            module
            for module, dists in metadata.packages_distributions().items()
            if module.isidentifier()
            and module not in ("d2s_search", "d2s_onnx_export", "tests")
            and not {re.sub(r"[-_.]+", "-", d).lower() for d in dists} & base
        }
    )
    assert {"torch", "opensearchpy", "faiss", "fastapi", "pyarrow", "transformers"} <= set(outside)
    for i in range(4):
        write_image(tmp_path / "photos" / f"p{i}.jpg", seed=i)
    ingest = _run_without(
        outside,
        [
            "ingest",
            tmp_path / "photos",
            "--bundle",
            tiny_blip_bundle,
            "--index",
            tmp_path / "idx",
            "--json",
        ],
        tmp_path,
    )
    assert ingest.returncode == 0, ingest.stderr
    assert json.loads(ingest.stdout)["stored"] == 4
    query = _run_without(
        outside,
        ["query", "a photo", "--index", tmp_path / "idx", "--json", "--mode", "hybrid"],
        tmp_path,
    )
    assert query.returncode == 0, query.stderr
    assert len(json.loads(query.stdout)["results"]) == 4
    stats = _run_without(
        outside, ["index", "stats", "--index", tmp_path / "idx", "--json"], tmp_path
    )
    assert stats.returncode == 0 and json.loads(stats.stdout)["documents"] == 4, stats.stderr
