"""How every command prints: JSON with ``--json``, plain lines otherwise."""

from __future__ import annotations

import json
from collections.abc import Iterable

import click


def emit_json(payload: dict) -> None:
    click.echo(json.dumps(payload, indent=2, ensure_ascii=False, default=str))


def emit(payload: dict, as_json: bool, lines: Iterable[str]) -> None:
    """``payload`` as JSON, or the human-readable ``lines``."""
    if as_json:
        emit_json(payload)
    else:
        for line in lines:
            click.echo(line)


def fit_path(path: str, width: int, sep: str = "/") -> str:
    """``path`` in about ``width`` characters: whole folders are dropped from the left
    (shown as ``…``), the file name is never cut."""
    if len(path) <= width or sep not in path:
        return path
    head, _, name = path.rpartition(sep)
    room = width - len(name) - 2  # "…" and the separator before the name
    tail = head[-room:] if room > 0 else ""
    tail = tail[tail.index(sep):] if sep in tail else ""  # start at a folder boundary
    return f"…{tail}{sep}{name}"
