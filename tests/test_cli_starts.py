"""The command line starts on every supported Python with the plain install alone (no torch,
no extras): the group and every (sub)command show their help, ``--version``
answers, and settings come from a config file. CI also runs this file on the lowest supported
Python (``.ci/run``), where the config file's parser is the ``tomli`` package."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from d2s_search import __version__
from d2s_search.cli import cli
from tests.helpers import clean_env, run_cli


def _every_command(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name in group.commands:
        command = group.commands[name]
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found.extend(_every_command(command, (*prefix, name)))
    return found


def test_the_console_script_starts_and_lists_every_command(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "d2s_search.cli", "--help"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path) | {"COLUMNS": "100"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert all(f"  {name} " in done.stdout for name in cli.commands)


@pytest.mark.parametrize("path", _every_command(cli), ids=" ".join)
def test_every_command_shows_its_help(path, capsys):
    code, out, err = run_cli([*path, "--help"], capsys)
    assert code == 0, err
    assert out.startswith(f"Usage: d2s-search {' '.join(path)}") and "--help" in out


def test_version_names_the_package(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"d2s-search, version {__version__}"


def test_settings_come_from_the_config_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d2s-search.toml").write_text(
        'index = "from-the-config"\n\n[opensearch]\nindex_name = "photos"\n'
    )
    code, _, err = run_cli(["index", "stats"], capsys)
    assert code == 1 and f"no index at {tmp_path / 'from-the-config'}" in err
    from d2s_search import settings

    assert settings.load_config() == {"index": "from-the-config", "index_name": "photos"}


def test_a_broken_config_file_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d2s-search.toml").write_text('index = "unterminated\n')
    code, out, err = run_cli(["index", "stats"], capsys)
    assert code == 1 and not out
    assert (
        err.startswith("error: cannot read config file d2s-search.toml: ") and err.count("\n") == 1
    )
