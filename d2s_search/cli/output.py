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
