"""Match recorded requests to operations of the OpenSearch API spec and validate their bodies."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Operations the spec has but whose body it cannot describe: ml-commons reads a model chunk
# as the raw request bytes, while the spec models it as JSON {"chunk": "..."}.
RAW_BODY_OPERATIONS = {("POST", "/_plugins/_ml/models/{model_id}/upload_chunk/{chunk_number}")}


@dataclass
class Checked:
    validated: set[tuple[str, str]]  # (method, spec path) whose JSON bodies were validated
    raw: set[tuple[str, str]]  # operations with a binary body, not validated
    without_body: set[tuple[str, str]]
    bodies: int


def spec_template(paths, method: str, path: str) -> str | None:
    matches = [t for rx, t in paths.get(method, []) if rx.match(path)]
    if not matches:
        return None
    return max(matches, key=lambda t: len(re.sub(r"\{[^}]+\}", "", t)))  # the most literal wins


def validate_recorded(spec, requests: Iterable) -> Checked:
    """Every request must be a spec operation; every JSON body must satisfy its schema."""
    paths = spec.paths_by_method()
    out = Checked(set(), set(), set(), 0)
    for r in requests:
        template = spec_template(paths, r.method, r.path)
        assert template, f"{r.method} {r.path} is not an operation of the OpenSearch API spec"
        key = (r.method, template)
        if not r.body:
            out.without_body.add(key)
        elif key in RAW_BODY_OPERATIONS:
            out.raw.add(key)
        elif "ndjson" in r.headers.get("content-type", ""):
            spec.validate(r.method, template, [json.loads(x) for x in r.body.decode().splitlines()])
            out.validated.add(key)
            out.bodies += 1
        else:
            spec.validate(r.method, template, json.loads(r.body))
            out.validated.add(key)
            out.bodies += 1
    return out
