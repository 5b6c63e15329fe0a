"""A click group whose commands are imported only when one is used.

``d2s-search query`` imports the query's module alone, not every command family (index,
serve, train, ...): a one-query process saves their import time. ``--help`` still lists every
command with its short help (that imports them all, which help can afford).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping, MutableMapping

import click

from d2s_search.errors import CommandLoadError


class LazyCommands(MutableMapping):
    """Command name -> click command, importing ``module:attribute`` on first access.

    Names, order and membership are known without importing anything, so click's
    ``list_commands`` and "did you mean" suggestions stay free; ``commands[name]``,
    ``.get(name)`` and ``.items()`` import what they return.
    """

    def __init__(self, package: str, specs: Mapping[str, str]) -> None:
        self._package = package
        self._specs = dict(specs)  # name -> "module:attribute", relative to the package
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name in self._loaded:
            return self._loaded[name]
        spec = self._specs[name]  # KeyError: no such command
        self._loaded[name] = command = self._load(name, spec)
        return command

    def _load(self, name: str, spec: str) -> click.Command:
        module_name, _, attribute = spec.partition(":")
        try:
            module = importlib.import_module(f"{self._package}.{module_name}")
        except ImportError as exc:  # a missing dependency or file of this command only
            raise CommandLoadError(f"the `{name}` command cannot load ({self._package}.{module_name}): {exc}; "
                                   "reinstall d2s-search with the extras this command needs") from exc
        command = getattr(module, attribute, None)
        if not isinstance(command, click.Command):
            raise CommandLoadError(f"the `{name}` command cannot load: {self._package}.{module_name} has no "
                                   f"command {attribute!r}; reinstall d2s-search")
        return check_needs_first(command, name)

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command  # replaces a lazy entry in place (same position)

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._specs.pop(name, None)
        self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._specs

    def __iter__(self) -> Iterator[str]:
        yield from self._specs
        yield from (name for name in self._loaded if name not in self._specs)

    def __len__(self) -> int:
        return len(self._specs.keys() | self._loaded.keys())

    def loaded(self) -> set[str]:
        """The names whose command has been imported so far."""
        return set(self._loaded)


def check_needs_first(command: click.Command, path: str) -> click.Command:
    """``command`` (and its subcommands) checking its optional dependencies
    (``d2s_search.extras.COMMAND_NEEDS[path]``) with the parsed options, before its own code
    runs: after click's usage errors, before any work."""
    callback = command.callback
    if callback is not None and not getattr(callback, "checks_needs", False):

        @functools.wraps(callback)
        def checked(*args, **params):
            from d2s_search import extras

            if click.get_current_context().invoked_subcommand is None:  # a group: its subcommand's rows apply
                extras.check_command(path, params)
            return callback(*args, **params)

        checked.checks_needs = True
        command.callback = checked
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            check_needs_first(sub, f"{path} {name}")
    return command


class LazyGroup(click.Group):
    """A ``click.Group`` whose ``commands`` is a :class:`LazyCommands` of ``lazy_commands``
    (name -> ``"module:attribute"`` under ``package``); click's own lookups work unchanged."""

    def __init__(self, *args, package: str, lazy_commands: Mapping[str, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(package, lazy_commands)
