"""Request bodies that OpenSearch and Elasticsearch accept in the same form (pure, no I/O)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Filters:
    """Restrictions applied to every query plan."""

    path_prefix: str | None = None

    def clauses(self) -> list[dict[str, Any]]:
        if self.path_prefix:
            return [{"prefix": {"path": {"value": self.path_prefix}}}]
        return []


NO_FILTERS = Filters()


def mget_body(ids: Sequence[str]) -> dict[str, Any]:
    return {"ids": list(ids)}


def reindex_body(source_index: str, dest_index: str) -> dict[str, Any]:
    return {"source": {"index": source_index}, "dest": {"index": dest_index, "op_type": "index"}}


def alias_swap_body(alias: str, new_index: str, old_index: str | None, old_is_alias: bool) -> dict[str, Any]:
    """Point ``alias`` at ``new_index`` atomically; a same-named plain index is removed in the same step."""
    actions: list[dict[str, Any]] = [{"add": {"index": new_index, "alias": alias}}]
    if old_index and old_is_alias:
        actions.append({"remove": {"index": old_index, "alias": alias}})
    elif old_index:
        actions.append({"remove_index": {"index": old_index}})
    return {"actions": actions}


def dumps(obj: Any) -> str:
    """Compact JSON, no NaN, non-ASCII kept: the exact bytes both engines' bulk lines use."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
