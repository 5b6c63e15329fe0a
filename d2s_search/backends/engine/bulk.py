"""Bulk and reindex helpers that read the same response shapes on both engines: the
per-item answers of ``_bulk`` (what to send again, what to report) and index generations."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

GENERATION = re.compile(r"^(?P<base>.+)-(?P<gen>\d{6})$")
T = TypeVar("T")


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


# Per-item bulk statuses worth sending again (queue full, node busy).
RETRY_ITEM_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass
class ChunkLimits:
    """How many documents and bytes one ``_bulk`` request may carry; halved after a 413."""

    docs: int
    bytes: int

    def halve(self) -> None:
        self.docs, self.bytes = max(1, self.docs // 2), max(1024, self.bytes // 2)


# One round of a bulk write: for each item sent, (item, accepted, the item's answer).
BulkRound = Callable[[list[T], ChunkLimits], Iterable[tuple[T, bool, Mapping[str, Any]]]]


def send_bulk(items: list[T], send: BulkRound[T], limits: ChunkLimits, *, retries: int,
              wait: Callable[[int, str], None], reason: Callable[[Mapping[str, Any]], str],
              ) -> tuple[dict[str, str], list[str]]:
    """Send ``items`` in rounds until none is left to send again; ({id: reason}, results).

    Items refused as busy (429/5xx) go again after ``wait(attempt, why)``, at most ``retries``
    times; items refused as too large (413) go again in smaller chunks (``limits`` halved,
    down to one document each, which is not a retry of a busy server). A delete of a missing
    document counts as done (result ``not_found``); other refusals are reported by id.
    """
    failures: dict[str, str] = {}
    results: list[str] = []
    pending, attempt = items, 0
    while pending:
        retry: list[T] = []
        too_large: list[T] = []
        for item, ok, result in send(pending, limits):
            status = int(result.get("status", 0) or 0)
            if ok or (status == 404 and result.get("result") == "not_found"):
                results.append(result.get("result", ""))
            elif status == 413 and limits.docs > 1:
                too_large.append(item)
            elif status in RETRY_ITEM_STATUSES and attempt < retries:
                retry.append(item)
            else:
                failures[str(result.get("_id"))] = reason(result)
        if too_large:
            limits.halve()
            retry += too_large
        elif retry:
            wait(attempt, f"{len(retry)} bulk item(s) refused as busy")
            attempt += 1
        pending = retry
    return failures, results
