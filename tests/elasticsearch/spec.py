"""Validate request bodies against the Elasticsearch API specification.

Two sources, both from elastic/elasticsearch-specification (see the README next to them):

- ``elasticsearch-serverless-openapi.json`` (OpenAPI 3.0): request bodies of ``_bulk``,
  ``_search`` (query, knn, retriever, rescore, pit), index creation, mappings, aliases, reindex.
  ``spec.validate("POST", "/{index}/_search", body)`` raises ``jsonschema.ValidationError``.
  Strict: keys the specification does not describe are errors too (``unevaluatedProperties:
  false`` is added where an object schema is *used*, as in tests/opensearch/spec.py).
- ``types.ts`` (the full 9.x type model) for what the serverless file leaves out or renders
  lossily -- ``settings.index.number_of_shards``/``number_of_replicas`` (Serverless forbids
  them) and ``sort`` (the file drops SortOptions' field-name keys such as ``_shard_doc``):
  ``spec.types.validate("IndicesIndexSettings", settings)``. A small reader of the TypeScript
  declarations: interfaces (with ``extends`` and index signatures), unions, intersections,
  arrays, ``Record``/``Partial``, string literals and primitives.

``_bulk`` is checked line by line (action lines against ``_global.bulk.OperationContainer``,
source lines must be objects): the file's own array schema is ``oneOf[OperationContainer,
UpdateAction, object]``, which an action line matches twice.
"""

from __future__ import annotations

import copy
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DEFAULT_SPEC = Path(os.environ.get("D2S_ELASTICSEARCH_SPEC", "/work/shared/elasticsearch-api-spec"))
OPENAPI_FILE = "elasticsearch-serverless-openapi.json"
URI = "urn:elasticsearch-serverless-openapi"
_OPEN_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


class ElasticsearchSpec:
    def __init__(self, root: Path, strict: bool = True) -> None:
        file = root / OPENAPI_FILE
        if not file.is_file() or not (root / "types.ts").is_file():
            raise FileNotFoundError(f"no Elasticsearch API spec under {root}")
        with open(file, encoding="utf-8") as fh:
            self.doc = json.load(fh)
        _to_2020_12(self.doc)
        # The OpenAPI rendering turns types.ts' ``Metadata = Record<string, any>`` (UserDefinedValue)
        # into "values must be objects"; Elasticsearch takes any JSON value in ``_meta``.
        self.doc["components"]["schemas"]["_types.Metadata"] = {"type": "object"}
        # types.ts' ``QueryDslGeoDistanceQuery`` is its keys ``& { [property: string]: GeoLocation |
        # ... }``: the field and its point. The rendering keeps only the keys (as for ``terms``).
        geo = self.doc["components"]["schemas"]["_types.query_dsl.GeoDistanceQuery"]["allOf"][1]
        geo["additionalProperties"] = {"$ref": "#/components/schemas/_types.GeoLocation"}
        if strict:
            for schema in self.doc["components"]["schemas"].values():
                self._close(schema, definition=True)
            for body in (self.doc["components"].get("requestBodies") or {}).values():
                for media in (body.get("content") or {}).values():
                    self._close(media.get("schema"), definition=False)
        self.registry = Registry().with_resource(URI, Resource.from_contents(self.doc, default_specification=DRAFT202012))
        self.types = TypeModel((root / "types.ts").read_text(encoding="utf-8"))

    @classmethod
    @lru_cache(maxsize=2)
    def load(cls, root: str | None = None, strict: bool = True) -> ElasticsearchSpec:
        return cls(Path(root) if root else DEFAULT_SPEC, strict=strict)

    # -- operations -------------------------------------------------------------------------

    def body_pointer(self, method: str, path: str) -> str:
        op = (self.doc["paths"].get(path) or {}).get(method.lower())
        if op is None:
            raise KeyError(f"no operation {method.upper()} {path} in the spec")
        body = op.get("requestBody")
        if body is None:
            raise KeyError(f"{method.upper()} {path} takes no request body in the spec")
        pointer = f"/paths/{_escape(path)}/{method.lower()}/requestBody"
        if "$ref" in body:
            pointer = body["$ref"].removeprefix(URI).removeprefix("#")
            body = _resolve(self.doc, pointer)
        for media in ("application/json", "application/x-ndjson"):
            if "schema" in (body.get("content") or {}).get(media, {}):
                return f"{pointer}/content/{_escape(media)}/schema"
        raise KeyError(f"{method.upper()} {path}: no JSON body schema")

    def has_operation(self, method: str, path: str) -> bool:
        return method.lower() in (self.doc["paths"].get(path) or {})

    def validate(self, method: str, path: str, body: Any, ndjson: bool = False) -> None:
        """Raise ``jsonschema.ValidationError`` if ``body`` breaks the operation's body schema.

        ``ndjson=True``: ``body`` is the list of parsed ``_bulk`` lines.
        """
        if ndjson:
            return self._validate_bulk(body)
        if method.upper() == "PUT" and path == "/{index}" and isinstance(body, dict) and "settings" in body:
            # Serverless forbids shard counts, so its schema lacks them: settings go to types.ts.
            self.types.validate("IndicesIndexSettings", body["settings"])
            body = {k: v for k, v in body.items() if k != "settings"}
        if path.endswith("/_search") and isinstance(body, dict) and "sort" in body:
            # The file renders SortOptions without its field-name keys ({"path": "asc"},
            # {"_shard_doc": {...}}): sort goes to types.ts.
            self.types.validate("Sort", body["sort"])
            body = {k: v for k, v in body.items() if k != "sort"}
        self._check({"$ref": f"{URI}#{self.body_pointer(method, path)}"}, body)

    def validate_schema(self, name: str, instance: Any) -> None:
        """Validate against a named component schema, e.g. ``_types.query_dsl.QueryContainer``."""
        self._check({"$ref": f"{URI}#/components/schemas/{_escape(name)}"}, instance)

    def _validate_bulk(self, lines: list[Any]) -> None:
        i = 0
        while i < len(lines):
            action = lines[i]
            self.validate_schema("_global.bulk.OperationContainer", action)
            (op,) = action
            if op in ("index", "create", "update"):
                if i + 1 >= len(lines) or not isinstance(lines[i + 1], dict):
                    raise jsonschema.ValidationError(f"bulk {op} action without a source line")
                i += 2
            else:
                i += 1

    def _check(self, schema: dict, instance: Any) -> None:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        validator = jsonschema.Draft202012Validator(schema, registry=self.registry)
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
        if error is not None:
            raise error

    # -- strict mode ------------------------------------------------------------------------

    def _target(self, ref: str) -> Any:
        ref = ref.removeprefix(URI)
        return _resolve(self.doc, ref.removeprefix("#")) if ref.startswith("#") else None

    def _closable(self, schema: Any, depth: int = 0) -> bool:
        if not isinstance(schema, dict) or depth > 30 or any(k in schema for k in _OPEN_KEYS):
            return False
        if schema.get("type", "object") != "object":
            return False
        if "$ref" in schema:
            return self._closable(self._target(schema["$ref"]), depth + 1)
        if "allOf" in schema:
            return any(self._closable(s, depth + 1) for s in schema["allOf"])
        return "properties" in schema

    def _close(self, schema: Any, definition: bool, in_all_of: bool = False) -> None:
        """Close object schemas where they are used; definitions stay open (they may be mixins)."""
        if not isinstance(schema, dict):
            return
        if not in_all_of and not definition and self._closable(schema):
            schema["unevaluatedProperties"] = False
        for key, value in list(schema.items()):
            if key == "allOf" and isinstance(value, list):
                for item in value:
                    self._close(item, definition=False, in_all_of=True)
            elif key in ("anyOf", "oneOf") and isinstance(value, list):
                for item in value:
                    self._close(item, definition=False)
            elif key == "properties" and isinstance(value, dict):
                for item in value.values():
                    self._close(item, definition=False)
            elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
                self._close(value, definition=False)


def _to_2020_12(node: Any) -> None:
    """OpenAPI 3.0 -> JSON Schema 2020-12: refs point into this document; ``nullable`` allows null."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            node["$ref"] = URI + ref
        if "oneOf" in node:
            # TypeScript unions are rendered as oneOf, but they overlap (long | double are both
            # "number", string | null-or-string): a union is satisfied by any member.
            node["anyOf"] = node.pop("oneOf")
        props = node.get("properties")
        if node.get("minProperties") == 1 and node.get("maxProperties") == 1 and isinstance(props, dict) and props:
            # A variant container ("exactly one of these keys"). The file also uses this shape
            # inside allOf next to shared keys (Rescore: window_size + query|script|...), where
            # maxProperties would count the shared keys too: say "exactly one variant" instead.
            del node["minProperties"], node["maxProperties"]
            one = [{"required": [k]} for k in props]
            if "oneOf" in node:
                node.setdefault("allOf", []).append({"oneOf": one})
            else:
                node["oneOf"] = one
        if node.pop("nullable", False) and isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
        for key in ("discriminator", "example", "examples", "externalDocs", "x-state"):
            if key in node and not isinstance(node.get(key), dict | list) or key == "discriminator":
                node.pop(key, None)
        for v in node.values():
            _to_2020_12(v)
    elif isinstance(node, list):
        for v in node:
            _to_2020_12(v)


def _resolve(doc: Any, pointer: str) -> Any:
    node = doc
    for part in pointer.lstrip("/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


# -- types.ts ------------------------------------------------------------------------------

_DECL = re.compile(r"^export (interface|type) (\w+)(<[^>{=]*>)?\s*(?:extends ([^{]+?))?\s*(=|\{)", re.M)
_PRIMITIVE = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "null": lambda v: v is None,
    "any": lambda v: True,
    "unknown": lambda v: True,
    "object": lambda v: isinstance(v, dict),
}


class TypeError_(ValueError):
    pass


class TypeModel:
    """Just enough of a TypeScript declaration reader to check JSON values against types.ts."""

    def __init__(self, text: str) -> None:
        self.interfaces: dict[str, tuple[list[str], str]] = {}  # name -> (extends, body)
        self.aliases: dict[str, str] = {}
        for m in _DECL.finditer(text):
            kind, name, _generic, extends, opener = m.groups()
            start = m.end()
            if opener == "{":
                end = _matching(text, start - 1)
                self.interfaces[name] = ([e.strip() for e in _split(extends or "", ",")], text[start:end])
            else:
                end = _alias_end(text, start)
                self.aliases[name] = text[start:end].strip()

    def validate(self, type_expr: str, value: Any, where: str = "$") -> None:
        errors = self._errors(type_expr.strip(), value, where, 0)
        if errors:
            raise TypeError_(errors[0])

    def _errors(self, t: str, v: Any, where: str, depth: int) -> list[str]:
        if depth > 60:
            return []
        t = t.strip()
        while t.startswith("(") and _matching(t, 0, "(", ")") == len(t) - 1:
            t = t[1:-1].strip()
        alts = _split(t, "|")
        if len(alts) > 1:
            results = [self._errors(a, v, where, depth + 1) for a in alts]
            return [] if any(not r for r in results) else [f"{where}: matches none of {t[:120]}"] + results[0]
        parts = _split(t, "&")
        if len(parts) > 1:
            return self._intersection(parts, v, where, depth)
        if t.endswith("[]"):
            if not isinstance(v, list):
                return [f"{where}: expected an array ({t})"]
            return [e for i, x in enumerate(v) for e in self._errors(t[:-2], x, f"{where}[{i}]", depth + 1)]
        if t[0] in "'\"":
            return [] if v == t[1:-1] else [f"{where}: expected {t}, got {v!r}"]
        if re.fullmatch(r"-?\d+(\.\d+)?", t):
            return [] if v == float(t) else [f"{where}: expected {t}"]
        if t in ("true", "false"):
            return [] if v is (t == "true") else [f"{where}: expected {t}"]
        if t in _PRIMITIVE:
            return [] if _PRIMITIVE[t](v) else [f"{where}: expected {t}, got {type(v).__name__}"]
        if t.startswith("{"):
            return self._object([], t[1:_matching(t, 0)], v, where, depth)
        m = re.fullmatch(r"(\w+)<(.*)>", t, re.S)
        if m:
            return self._generic(m.group(1), _split(m.group(2), ","), v, where, depth)
        if t in self.aliases:
            return self._errors(self.aliases[t], v, where, depth + 1)
        if t in self.interfaces:
            extends, body = self.interfaces[t]
            return self._object(extends, body, v, where, depth)
        return [f"{where}: unknown type {t}"]

    def _generic(self, name: str, args: list[str], v: Any, where: str, depth: int) -> list[str]:
        if name in ("Record", "Partial") and name == "Record":
            if not isinstance(v, dict):
                return [f"{where}: expected an object (Record)"]
            return [e for k, x in v.items() for e in self._errors(args[1], x, f"{where}.{k}", depth + 1)]
        if name == "Partial":
            return self._errors(args[0], v, where, depth + 1)
        if name.startswith("SpecUtils"):  # Stringified<T>, WithNullValue<T>: T or a string form
            return self._errors(f"{args[0]} | string", v, where, depth + 1)
        # Other generics (EpochTime<U>, ...): check the alias body without binding parameters.
        if name in self.aliases:
            return self._errors(self.aliases[name], v, where, depth + 1)
        if name in self.interfaces:
            extends, body = self.interfaces[name]
            return self._object(extends, body, v, where, depth)
        return [f"{where}: unknown generic {name}"]

    def _intersection(self, parts: list[str], v: Any, where: str, depth: int) -> list[str]:
        if not isinstance(v, dict):
            return [f"{where}: expected an object"]
        fields, index = {}, []
        for p in parts:
            f, i = self._fields_of(p.strip(), depth)
            fields.update(f)
            index.extend(i)
        return self._check_fields(fields, index, v, where, depth)

    def _fields_of(self, t: str, depth: int) -> tuple[dict[str, tuple[str, bool]], list[str]]:
        if t.startswith("{"):
            return _parse_fields(t[1:_matching(t, 0)])
        if t in self.aliases:
            return self._fields_of(self.aliases[t].strip(), depth + 1)
        extends, body = self.interfaces.get(t, ([], ""))
        fields, index = _parse_fields(body)
        for base in extends:
            f, i = self._fields_of(re.sub(r"<.*>$", "", base), depth + 1)
            fields = {**f, **fields}
            index += i
        return fields, index

    def _object(self, extends: list[str], body: str, v: Any, where: str, depth: int) -> list[str]:
        if not isinstance(v, dict):
            return [f"{where}: expected an object, got {type(v).__name__}"]
        fields, index = _parse_fields(body)
        for base in extends:
            f, i = self._fields_of(re.sub(r"<.*>$", "", base), depth + 1)
            fields = {**f, **fields}
            index += i
        return self._check_fields(fields, index, v, where, depth)

    def _check_fields(self, fields: dict[str, tuple[str, bool]], index: list[str], v: dict, where: str,
                      depth: int) -> list[str]:
        errors = [f"{where}: missing required {k}" for k, (_, opt) in fields.items() if not opt and k not in v]
        for key, value in v.items():
            if key in fields:
                errors += self._errors(fields[key][0], value, f"{where}.{key}", depth + 1)
            elif index:
                errors += self._errors(index[0], value, f"{where}.{key}", depth + 1)
            else:
                errors.append(f"{where}: unknown key {key!r}")
        return errors


def _parse_fields(body: str) -> tuple[dict[str, tuple[str, bool]], list[str]]:
    """``name?: Type`` lines of an interface body (nested ``{...}`` kept whole)."""
    fields: dict[str, tuple[str, bool]] = {}
    index: list[str] = []
    body = re.sub(r"/\*.*?\*/|//[^\n]*", "", body, flags=re.S)
    for member in _members(body):
        m = re.match(r"\s*\[\s*\w+\s*:\s*\w+\s*\]\s*:\s*(.+)$", member, re.S)
        if m:
            index.append(m.group(1).strip())
            continue
        m = re.match(r"\s*('[^']+'|\"[^\"]+\"|[\w$]+)(\?)?\s*:\s*(.+)$", member, re.S)
        if m:
            fields[m.group(1).strip("'\"")] = (m.group(3).strip(), bool(m.group(2)))
    return fields, index


def _members(body: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in body:
        if ch in "{(<[":
            depth += 1
        elif ch in "})>]":
            depth -= 1
        if ch in "\n;" and depth == 0:
            if "".join(cur).strip():
                out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    # A member type may continue on the next line after a trailing '|' or '&'.
    merged: list[str] = []
    for m in out:
        if merged and (merged[-1].rstrip().endswith(("|", "&")) or m.lstrip().startswith(("|", "&"))):
            merged[-1] += " " + m
        else:
            merged.append(m)
    return merged


def _split(t: str, sep: str) -> list[str]:
    out, depth, cur, quote = [], 0, [], None
    for ch in t:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "{(<[":
            depth += 1
        elif ch in "})>]":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def _matching(text: str, start: int, open_: str = "{", close: str = "}") -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced braces in types.ts")


def _alias_end(text: str, start: int) -> int:
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch in "{(<[":
            depth += 1
        elif ch in "})>]":
            depth -= 1
        elif ch == "\n" and depth == 0:
            nxt = text[i + 1 : i + 80].lstrip(" \t")
            if not nxt.startswith(("|", "&")):
                return i
        i += 1
    return i


def deep_copy(body: Any) -> Any:
    return copy.deepcopy(body)
