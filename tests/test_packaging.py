"""Packaging: the Apache-2.0 licence in full and as an SPDX expression; a build without a C
compiler succeeds and says so once in its log; an install without the compiled parts says so
at its first `index stats` and `serve` start, and not again."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from d2s_search.settings import tomllib  # tomli on Python 3.10
from tests.helpers import clean_env, interruptible, run_cli_json, write_image

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# sha256 of the Apache License 2.0 as the ASF publishes it (apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
BUILD_LINE = "d2s-search: built WITHOUT the local index's compiled parts"
NOTE = "note: this install has no compiled scoring code"


def _source_copy(dest: Path, with_compiled: bool = False) -> Path:
    """The files a build reads (what an sdist holds), without the compiled parts built here."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, dest / name)
    ignored = shutil.ignore_patterns("__pycache__", *(() if with_compiled else ("*.so", "*.pyd")))
    for package in ("d2s_search", "onnx_export"):  # folders
        shutil.copytree(ROOT / package, dest / package, ignore=ignored)
    return dest


def test_the_licence_is_apache_2_in_full_and_declared_as_an_spdx_expression():
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    (setuptools,) = [
        Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")
    ]
    assert not setuptools.specifier.contains("76.9") and setuptools.specifier.contains("77.0")


def test_a_build_without_a_c_compiler_succeeds_says_so_once_and_ships_the_licence(tmp_path):
    source = _source_copy(tmp_path / "src")
    env = clean_env(tmp_path) | {"CC": "false", "PIP_NO_INPUT": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            ".",
            "-w",
            str(tmp_path / "dist"),
        ],
        cwd=source,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert log.count(BUILD_LINE) == 1
    (line,) = [entry for entry in log.splitlines() if BUILD_LINE in entry]
    assert "_score.c, _query.c, _graph.c, _hits.c, _words.c" in line and "Everything works, searches are slower" in line
    (wheel,) = (tmp_path / "dist").glob("d2s_search-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        licence = archive.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE")))
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert (
        "License-Expression: Apache-2.0" in meta.splitlines()
        and "License-File: LICENSE" in meta.splitlines()
    )
    assert hashlib.sha256(licence).hexdigest() == APACHE_2_SHA256
    assert "Requires-Dist: onnxruntime>=1.17" in meta.splitlines()
    # the export side installs under this project's name, with its configs and shipped weights
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "d2s_search",
        "d2s_onnx_export",
    }
    for shipped in ("d2s_onnx_export/configs/offline-mini.json", "d2s_onnx_export/offline_mini/weights/head.safetensors",
                    "d2s_onnx_export/offline_mini/model.py", "d2s_search/serve/static/index.html",
                    "d2s_search/data/inflections.json"):
        assert shipped in names, shipped


def _cli(package_root: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = clean_env(config.parent) | {
        "PYTHONPATH": str(package_root),
        "D2S_CONFIG_DIR": str(config),
    }
    return subprocess.run(
        [sys.executable, "-m", "d2s_search.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=config.parent,
    )


def test_without_the_compiled_parts_the_first_index_stats_and_serve_say_so_once(
    tmp_path, tiny_blip_bundle, capsys
):
    for i in range(3):
        write_image(tmp_path / "photos" / f"p{i}.jpg", seed=i)
    index = tmp_path / "idx"
    run_cli_json(
        ["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], capsys
    )
    plain = _source_copy(tmp_path / "plain")  # as installed without a C compiler
    config = tmp_path / "config-plain"
    first = _cli(plain, config, "index", "stats", "--index", str(index), "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["scoring_kernel"] == "numpy"
    assert first.stderr.splitlines() == [
        f"{NOTE} (_score.c, _query.c, _graph.c, _hits.c, _words.c not built: no C compiler when it was installed); searches give the "
        "same results, slower. With a C compiler and Python's headers, reinstall d2s-search to build it"
    ]
    again = _cli(plain, config, "index", "stats", "--index", str(index))
    assert again.returncode == 0 and NOTE not in again.stderr, again.stderr

    serve_config = (
        tmp_path / "config-serve"
    )  # another user of the same install: its first start is serve
    env = clean_env(tmp_path) | {"PYTHONPATH": str(plain), "D2S_CONFIG_DIR": str(serve_config)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "d2s_search.cli",
            "serve",
            "--index",
            str(index),
            "--port",
            "0",
            "--json",
            "--thumbnail-dir",
            str(tmp_path / "thumbs"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,  # not this checkout: `-m` puts the working folder first on the path
        **interruptible(),
    )
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] is True
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert err.count(NOTE) == 1, err
    assert NOTE not in _cli(plain, serve_config, "index", "stats", "--index", str(index)).stderr

    built = _source_copy(
        tmp_path / "built", with_compiled=True
    )  # the compiled parts built: nothing to say
    if any(
        p.suffix in (".so", ".pyd") for p in built.glob("d2s_search/backends/local/_*")
    ):  # built here
        compiled = _cli(built, tmp_path / "config-built", "index", "stats", "--index", str(index))
        assert compiled.returncode == 0 and compiled.stderr == "", compiled.stderr
