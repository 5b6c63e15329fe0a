"""Bulk and reindex helpers that read the same response shapes on both engines."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

GENERATION = re.compile(r"^(?P<base>.+)-(?P<gen>\d{6})$")


def item_reason(result: Mapping[str, Any], clip: Callable[[str], str]) -> str:
    """One line for a refused ``_bulk`` item; ``clip`` is the engine's way to shorten/redact it."""
    err = result.get("error")
    if isinstance(err, dict):
        cause = err.get("caused_by") if isinstance(err.get("caused_by"), dict) else None
        text = f"{err.get('type', 'error')}: {err.get('reason', '')}"
        if cause:
            text += f" ({cause.get('reason', '')})"
        return clip(text)
    return clip(f"status {result.get('status')}: {err or 'unknown error'}")


def next_generation(alias: str, current: str) -> str:
    """``d2s-000001`` -> ``d2s-000002``; anything else starts the alias at generation 1."""
    m = GENERATION.match(current)
    gen = int(m.group("gen")) + 1 if m and m.group("base") == alias else 1
    return f"{alias}-{gen:06d}"
