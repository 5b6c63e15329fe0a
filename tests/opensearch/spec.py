"""Validate request bodies against the official OpenSearch API specification (OpenAPI 3.1).

    spec = OpenSearchSpec.load()                        # ../shared/opensearch-api-spec by default
    spec.validate("PUT", "/{index}", body)              # raises jsonschema.ValidationError
    spec.validate("POST", "/_bulk", lines, ndjson=True) # bulk: the list of parsed lines

Every YAML file is registered under its file URI, so ``$ref``s such as
``../schemas/_common.query_dsl.yaml#/components/schemas/QueryContainer`` resolve as written.

``strict=True`` also rejects keys the specification does not describe (a typo such as
``rank_featur`` or ``rescore_querry`` would otherwise pass, because most spec objects leave
``additionalProperties`` open). It adds ``unevaluatedProperties: false`` to object schemas
that are not mixins (schemas pulled into another one through ``allOf``).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DEFAULT_SPEC = Path(os.environ.get("D2S_OPENSEARCH_SPEC", "/work/shared/opensearch-api-spec"))
_OPEN_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


@dataclass
class Operation:
    method: str
    path: str
    operation_id: str
    file: Path
    body_schema: dict[str, Any] | None


class OpenSearchSpec:
    def __init__(self, root: Path, strict: bool = False) -> None:
        self.root = root / "spec" if (root / "spec").is_dir() else root
        if not (self.root / "namespaces").is_dir():
            raise FileNotFoundError(f"no OpenSearch API spec under {root}")
        self.strict = strict
        self.docs: dict[str, dict[str, Any]] = {}
        for path in sorted(self.root.rglob("*.yaml")):
            with open(path, encoding="utf-8") as fh:
                self.docs[path.resolve().as_uri()] = yaml.safe_load(fh)
        if strict:
            self._close_objects()
        self.registry = Registry().with_resources(
            (uri, Resource.from_contents(doc, default_specification=DRAFT202012))
            for uri, doc in self.docs.items()
        )

    @classmethod
    @lru_cache(maxsize=2)
    def load(cls, root: str | None = None, strict: bool = False) -> OpenSearchSpec:
        return cls(Path(root) if root else DEFAULT_SPEC, strict=strict)

    # -- operations -------------------------------------------------------------------------

    def operation(self, method: str, path: str) -> Operation:
        """The operation at ``path`` (as written in the spec, e.g. ``/{index}/_search``)."""
        for uri, doc in self.docs.items():
            if "/namespaces/" not in uri:
                continue
            op = (doc.get("paths") or {}).get(path, {}).get(method.lower())
            if op is None:
                continue
            schema = None
            body = op.get("requestBody")
            pointer = f"/paths/{_escape(path)}/{method.lower()}/requestBody"
            if body is not None and "$ref" in body:
                file, _, pointer = body["$ref"].partition("#")
                assert not file, "request bodies are referenced within their namespace file"
                body = _resolve_pointer(doc, pointer)
            if body is not None:
                content = body.get("content", {})
                for media in ("application/json", "application/x-ndjson"):
                    if "schema" in content.get(media, {}):
                        schema = {
                            "$schema": "https://json-schema.org/draft/2020-12/schema",
                            "$ref": f"{uri}#{pointer}/content/{_escape(media)}/schema",
                        }
                        break
            return Operation(method.upper(), path, op.get("operationId", ""), Path(uri), schema)
        raise KeyError(f"no operation {method.upper()} {path} in the spec")

    def paths_by_method(self) -> dict[str, list[tuple[re.Pattern, str]]]:
        """HTTP method -> (regex matching concrete paths, path template) for every operation."""
        by_method: dict[str, list[tuple[re.Pattern, str]]] = {}
        for uri, doc in self.docs.items():
            if "/namespaces/" not in uri:
                continue
            for template, item in (doc.get("paths") or {}).items():
                rx = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")
                for method in item:
                    by_method.setdefault(method.upper(), []).append((rx, template))
        return by_method

    def validate(self, method: str, path: str, body: Any, ndjson: bool = False) -> None:
        """Raise ``jsonschema.ValidationError`` if ``body`` breaks the operation's body schema."""
        op = self.operation(method, path)
        if op.body_schema is None:
            raise KeyError(f"{method.upper()} {path} takes no request body in the spec")
        validator = jsonschema.Draft202012Validator(op.body_schema, registry=self.registry)
        error = jsonschema.exceptions.best_match(validator.iter_errors(body))
        if error is not None:
            raise error

    def validate_schema(self, ref: str, instance: Any) -> None:
        """Validate against a named schema, e.g. ``schemas/_common.query_dsl.yaml#/components/schemas/QueryContainer``."""
        file, _, pointer = ref.partition("#")
        uri = (self.root / file).resolve().as_uri()
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"{uri}#{pointer}"}
        validator = jsonschema.Draft202012Validator(schema, registry=self.registry)
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
        if error is not None:
            raise error

    # -- strict mode ------------------------------------------------------------------------

    def _close_objects(self) -> None:
        """Add ``unevaluatedProperties: false`` where an object schema is *used*, not defined.

        Named schemas are often mixins (pulled into others through ``allOf``), so closing their
        definitions would reject the other half's keys. Instead every ``$ref`` outside an
        ``allOf`` list, and every inline object schema outside one, is closed; annotations flow
        through ``$ref`` and ``allOf``, so the mixins' properties still count as known.
        """
        for uri, doc in self.docs.items():
            components = doc.get("components") or {}
            for schema in (components.get("schemas") or {}).values():
                self._close(uri, schema, in_all_of=False, definition=True)
            for body in (components.get("requestBodies") or {}).values():
                for media in (body.get("content") or {}).values():
                    self._close(uri, media.get("schema"), in_all_of=False, definition=False)

    def _target(self, uri: str, ref: str) -> Any:
        target_uri, pointer = _ref_target(uri, ref)
        doc = self.docs.get(target_uri)
        return None if doc is None else _resolve_pointer(doc, pointer)

    def _closable(self, uri: str, schema: Any, depth: int = 0) -> bool:
        if not isinstance(schema, dict) or depth > 20 or any(k in schema for k in _OPEN_KEYS):
            return False
        if schema.get("type", "object") != "object":
            return False
        if "$ref" in schema:
            target_uri = _ref_target(uri, schema["$ref"])[0]
            return self._closable(target_uri, self._target(uri, schema["$ref"]), depth + 1)
        return "properties" in schema or "allOf" in schema

    def _close(self, uri: str, schema: Any, in_all_of: bool, definition: bool) -> None:
        if not isinstance(schema, dict):
            return
        if not in_all_of and not definition and self._closable(uri, schema):
            schema["unevaluatedProperties"] = False
        for key, value in list(schema.items()):
            if key == "allOf" and isinstance(value, list):
                for item in value:
                    self._close(uri, item, in_all_of=True, definition=False)
            elif key in ("anyOf", "oneOf", "prefixItems") and isinstance(value, list):
                for item in value:
                    self._close(uri, item, in_all_of=False, definition=False)
            elif key == "properties" and isinstance(value, dict):
                for item in value.values():
                    self._close(uri, item, in_all_of=False, definition=False)
            elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
                self._close(uri, value, in_all_of=False, definition=False)



def _walk(node: Any):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _ref_target(base_uri: str, ref: str) -> tuple[str, str]:
    file, _, pointer = ref.partition("#")
    if not file:
        return base_uri, pointer
    base = Path(base_uri.removeprefix("file://")).parent
    return (base / file).resolve().as_uri(), pointer


def _resolve_pointer(doc: Any, pointer: str) -> Any:
    node = doc
    for part in pointer.lstrip("/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def deep_copy(body: Any) -> Any:
    return copy.deepcopy(body)
