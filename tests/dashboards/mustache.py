"""Just enough mustache to render the d2s-sparse template the way OpenSearch does.

Variables, sections over lists and truthy values, inverted sections; values are escaped
for JSON strings (OpenSearch's mustache escapes for the template's JSON content type).
"""

from __future__ import annotations

import json
import re
from typing import Any

_TAG = re.compile(r"\{\{([#^/]?)\s*([\w.-]+)\s*\}\}")


def render(template: str, params: dict[str, Any]) -> str:
    tokens = _parse(template)
    return _render(tokens, [params])


def _parse(template: str) -> list:
    root: list = []
    stack: list[tuple[str, str, list]] = []
    current = root
    pos = 0
    for m in _TAG.finditer(template):
        if m.start() > pos:
            current.append(template[pos : m.start()])
        kind, name = m.group(1), m.group(2)
        if kind in "#^" and kind:
            section: list = []
            current.append((kind, name, section))
            stack.append((kind, name, current))
            current = section
        elif kind == "/":
            open_kind, open_name, parent = stack.pop()
            assert open_name == name, f"mismatched section {open_name} / {name}"
            current = parent
        else:
            current.append(("var", name, None))
        pos = m.end()
    assert not stack, "unclosed section"
    current.append(template[pos:])
    return root


def _lookup(stack: list[Any], name: str) -> Any:
    for ctx in reversed(stack):
        if isinstance(ctx, dict) and name in ctx:
            return ctx[name]
    return None


def _falsy(value: Any) -> bool:
    return value is None or value is False or value == [] or value == ""


def _render(tokens: list, stack: list[Any]) -> str:
    out = []
    for tok in tokens:
        if isinstance(tok, str):
            out.append(tok)
            continue
        kind, name, body = tok
        value = _lookup(stack, name)
        if kind == "var":
            if value is None:
                continue
            if isinstance(value, bool):
                out.append("true" if value else "false")
            elif isinstance(value, str):
                out.append(json.dumps(value, ensure_ascii=False)[1:-1])
            else:
                out.append(repr(value))
        elif kind == "#":
            if _falsy(value):
                continue
            items = value if isinstance(value, list) else [value]
            for item in items:
                out.append(_render(body, [*stack, item]))
        elif kind == "^" and _falsy(value):
            out.append(_render(body, stack))
    return "".join(out)
