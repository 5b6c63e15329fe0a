"""Settings: flags > environment (``D2S_*``) > config file > defaults.

Click gives flags and environment variables; the config file becomes click's
``default_map``. The config file is ``./d2s-search.toml`` if present, else
``<config dir>/config.toml``; the config dir is ``$D2S_CONFIG_DIR`` or
``$XDG_CONFIG_HOME/d2s-search`` (``~/.config/d2s-search``). It also keeps a small state file
remembering the bundle exported last, the default for ``--bundle`` when the index does not
name its own, and the local index used last (named when there is no index where one is asked for).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from .errors import D2SError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI (a dependency there only)
    import tomli as tomllib

# Keys a config file may set, and the option names they feed (same name, '-' -> '_').
CONFIG_KEYS = ("bundle", "index", "backend", "url", "index_name", "device", "batch_size", "mode", "k", "search_threads",
               "exclude", "dense_ef")


def backend_kind(backend: str | None, url: str | None) -> str:
    """Which backend the flags and environment name: local, opensearch or elasticsearch."""
    return backend or ("opensearch" if url else "elasticsearch" if os.environ.get("D2S_ELASTICSEARCH_URL") else "local")


def config_dir() -> Path:
    if os.environ.get("D2S_CONFIG_DIR"):
        return Path(os.environ["D2S_CONFIG_DIR"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "d2s-search"


def cache_dir() -> Path:
    """Derived files worth keeping between runs (e.g. optimised ONNX graphs): under the
    config dir when D2S_CONFIG_DIR is set, else ``$XDG_CACHE_HOME/d2s-search``."""
    if os.environ.get("D2S_CONFIG_DIR"):
        return config_dir() / "cache"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "d2s-search"


def config_file() -> Path | None:
    for candidate in (Path("d2s-search.toml"), config_dir() / "config.toml"):
        if candidate.is_file():
            return candidate
    return None


def load_config() -> dict:
    path = config_file()
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise D2SError(f"cannot read config file {path}: {exc}") from None
    flat = {k: v for k, v in data.items() if k in CONFIG_KEYS}
    flat.update({k: v for k, v in data.get("opensearch", {}).items() if k in ("url", "index_name")})
    unknown = sorted(set(data) - set(CONFIG_KEYS) - {"opensearch"})
    if unknown:
        raise D2SError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}")
    exclude = flat.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(glob, str) and glob for glob in exclude):
        raise D2SError(f'{path}: exclude must be a list of globs, e.g. exclude = ["*/thumbs/", "*.png"]')
    return flat


def default_map_for(group, flat: dict) -> Mapping:
    """click ``default_map`` giving every (sub)command the config values it has options for.

    A group's entries are worked out when click asks for them, so a command's module is only
    imported when that command runs (see ``cli.lazy``)."""
    return _GroupDefaults(group, flat)


class _GroupDefaults(Mapping):
    """Subcommand name -> its default map (a group's own options take none from the config)."""

    def __init__(self, group, flat: dict) -> None:
        self._group, self._flat, self._done = group, flat, {}

    def __getitem__(self, name: str):
        if name not in self._done:
            import click

            command = self._group.commands[name]  # KeyError: not a subcommand
            if isinstance(command, click.Group):
                self._done[name] = _GroupDefaults(command, self._flat)
            else:
                options = {p.name for p in command.params}
                self._done[name] = {k: v for k, v in self._flat.items() if k in options}
        return self._done[name]

    def __contains__(self, name: object) -> bool:
        return name in self._group.commands

    def __iter__(self) -> Iterator[str]:
        return iter(self._group.commands)

    def __len__(self) -> int:
        return len(self._group.commands)


def _state_file() -> Path:
    return config_dir() / "state.json"


def _remember(key: str, path: Path) -> None:
    state_file = _state_file()
    try:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state = json.loads(state_file.read_text()) if state_file.is_file() else {}
        if state.get(key) == str(Path(path).resolve()):
            return
        state[key] = str(Path(path).resolve())
        tmp = state_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_file)
    except (OSError, ValueError):
        pass  # remembering is a convenience; never fail a command over it


def _remembered(key: str) -> Path | None:
    try:
        value = json.loads(_state_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return Path(value) if isinstance(value, str) and value else None


def remember_bundle(path: Path) -> None:
    _remember("last_bundle", path)


def last_bundle() -> Path | None:
    return _remembered("last_bundle")


def remember_index(path: Path) -> None:
    """The local index used last, named by "no index here" errors elsewhere."""
    _remember("last_index", path)


def last_index() -> Path | None:
    return _remembered("last_index")


def first_time_here(key: str, where: Path) -> bool:
    """True the first time ``key`` is asked for the install at ``where`` (a package folder),
    then False (remembered in the state file): a note said once, not at every start."""
    if _remembered(key) == Path(where).resolve():
        return False
    _remember(key, where)
    return True


def resolve_bundle_path(given: str | None) -> Path:
    if given:
        return Path(given).expanduser()
    remembered = last_bundle()
    if remembered is not None:
        return remembered
    raise D2SError("no model bundle: run `d2s-search export-onnx` first, or pass --bundle DIR (or set D2S_BUNDLE)")
