"""The command group imports a command's module only when that command runs (``cli.lazy``):
help still lists every command as an eager group would, config defaults still reach every
command, and a module that cannot load is a one-line error."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import click
import pytest

from d2s_search import settings
from d2s_search.cli import COMMANDS, cli
from d2s_search.cli.lazy import LazyCommands, LazyGroup
from tests.helpers import clean_env, run_cli, run_cli_json

# Runs the console script's main() and writes which command modules were imported.
RUN_AND_LIST = (
    "import json, sys\n"
    "from d2s_search.cli import main\n"
    "try:\n"
    "    main(sys.argv[2:])\n"
    "finally:\n"
    "    with open(sys.argv[1], 'w') as out:\n"
    "        json.dump(sorted(m for m in sys.modules if m.startswith('d2s_search.cli.')), out)\n"
)
NOT_COMMANDS = {"d2s_search.cli.lazy", "d2s_search.cli.options", "d2s_search.cli.output"}


def _run(tmp_path, *args, env=None):
    listing = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST, str(listing), *map(str, args)], capture_output=True,
                          text=True, env=env or clean_env(tmp_path) | {"COLUMNS": "100"}, timeout=120)
    return done, set(json.loads(listing.read_text())) - NOT_COMMANDS


def _eager_twin(group: click.Group) -> click.Group:
    twin = copy.copy(group)
    twin.commands = dict(group.commands.items())  # every command imported up front, as before
    return twin


def test_every_registered_name_is_the_commands_own_name():
    assert list(cli.commands) == list(COMMANDS)
    for name in COMMANDS:
        assert cli.commands[name].name == name


def test_help_is_the_text_of_an_eager_group_and_lists_every_command(tmp_path):
    with click.Context(cli, info_name="d2s-search", max_content_width=100, terminal_width=100) as ctx:
        lazy_help = cli.get_help(ctx)
    eager = _eager_twin(cli)
    with click.Context(eager, info_name="d2s-search", max_content_width=100, terminal_width=100) as ctx:
        assert lazy_help == eager.get_help(ctx)
    done, loaded = _run(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == sorted(COMMANDS)
    for line in listed:
        name, shown = line.split(None, 1)
        assert cli.commands[name].get_short_help_str(100).startswith(shown.removesuffix("..."))


def test_a_command_imports_its_own_module_only(tmp_path):
    done, loaded = _run(tmp_path, "query", "--server-side")  # a usage error raised inside the command
    assert done.returncode == 2 and "--server-side searches by TEXT" in done.stderr
    assert loaded == {"d2s_search.cli.search"}
    done, loaded = _run(tmp_path, "index", "stats", "--index", tmp_path / "none")
    assert done.returncode == 1 and done.stderr.startswith("error: ")
    assert loaded == {"d2s_search.cli.index"}


def test_a_mistyped_command_is_suggested_without_importing_any(tmp_path):
    done, loaded = _run(tmp_path, "quer")
    assert done.returncode == 2 and "Did you mean 'query'?" in done.stderr
    assert loaded == set()


def test_the_default_map_imports_a_command_only_when_asked_for_it():
    group = LazyGroup(name="probe", package="d2s_search.cli", lazy_commands=COMMANDS)
    defaults = settings.default_map_for(group, {"k": 3, "index": "/some/index", "batch_size": 8})
    assert set(defaults) == set(COMMANDS) and "query" in defaults and "debug" not in defaults
    assert group.commands.loaded() == set()
    assert defaults["query"] == {"k": 3, "index": "/some/index"}
    assert defaults["ingest"] == {"index": "/some/index", "batch_size": 8}
    assert defaults["index"]["stats"] == {"index": "/some/index"}
    assert group.commands.loaded() == {"query", "ingest", "index"}
    with pytest.raises(KeyError):
        defaults["no-such-command"]


def test_config_defaults_reach_lazily_loaded_commands(tmp_path, tiny_blip_bundle, image_folder, capsys):
    index = tmp_path / "idx"
    code, _ = run_cli_json(["ingest", image_folder, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0
    env = clean_env(tmp_path)
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "config.toml").write_text(f'bundle = "{tiny_blip_bundle}"\nindex = "{index}"\nk = 3\nmode = "dense"\n')
    done, loaded = _run(tmp_path, "query", "a dog", "--no-serve", "--json", env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["results"]) == 3 and result["mode"] == "dense"
    assert loaded == {"d2s_search.cli.search"}
    done, loaded = _run(tmp_path, "index", "stats", "--json", env=env)  # a group's subcommand
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["documents"] == 40
    assert loaded == {"d2s_search.cli.index"}


@pytest.mark.parametrize(("spec", "named"), [("no_such_module:cmd", "no_such_module"),
                                             ("search:no_such_command", "no_such_command")])
def test_a_command_that_cannot_load_is_a_one_line_error(monkeypatch, capsys, spec, named):
    monkeypatch.setattr(cli, "commands", LazyCommands("d2s_search.cli", {**COMMANDS, "broken": spec}))
    code, out, err = run_cli(["broken", "--help"], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: the `broken` command cannot load") and named in err
    assert len(err.strip().splitlines()) == 1
    code, report = run_cli_json(["broken"], capsys)
    assert code == 1 and report["error"]["type"] == "CommandLoadError"
    code, out, _ = run_cli(["query", "--help"], capsys)  # the others still work
    assert code == 0 and "Search the index by TEXT" in out


def test_the_commands_mapping_can_be_changed_like_a_dict():
    commands = LazyCommands("d2s_search.cli", {"doctor": "doctor:doctor", "query": "search:query"})
    replacement = click.Command("doctor")
    commands["doctor"] = replacement
    assert list(commands) == ["doctor", "query"] and commands["doctor"] is replacement
    del commands["query"]
    assert "query" not in commands and len(commands) == 1 and commands.loaded() == {"doctor"}
    with pytest.raises(KeyError):
        del commands["query"]
