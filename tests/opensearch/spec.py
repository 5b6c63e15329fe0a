"""Validate request bodies against the official OpenSearch API specification (OpenAPI 3.1).

    spec = OpenSearchSpec.load()                        # ../shared/opensearch-api-spec by default
    spec.validate("PUT", "/{index}", body)              # raises jsonschema.ValidationError
    spec.validate("POST", "/_bulk", lines, ndjson=True) # bulk: the list of parsed lines

Every YAML file is registered under its file URI, so ``$ref``s such as
``../schemas/_common.query_dsl.yaml#/components/schemas/QueryContainer`` resolve as written.

``version="2.19.1"`` validates for one release: properties and ``oneOf``/``anyOf`` branches
marked ``x-version-added`` later (or ``x-version-removed`` by then) are taken out, so a key a
cluster of that version does not know is an unknown key. :data:`OVERLAY` adds what the spec
(commit in its ``COMMIT`` file) does not record, each entry read from plugin source at a
release tag and cited; ``test_spec_overlay_is_needed`` shows each is missing from the spec.

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

_PIPELINE = "schemas/search_pipeline._common.yaml"
_QUERY = "schemas/_common.query_dsl.yaml"
_MAPPING = "schemas/_common.mapping.yaml"
_INDICES = "schemas/indices._common.yaml"
_SEISMIC_PARAMETERS = {
    "type": "object",
    "properties": {
        "n_postings": {"type": "integer", "minimum": 1},
        "cluster_ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "summary_prune_ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "approximate_threshold": {"type": "integer", "minimum": 0},
        "quantization_ceiling_ingest": {"type": "number", "exclusiveMinimum": 0},
        "quantization_ceiling_search": {"type": "number", "exclusiveMinimum": 0},
    },
    "additionalProperties": False,  # Seismic.validateMethod: "Unknown parameter '%s' found"
}
# (file, JSON pointer of an object schema's "properties" or a list, key, schema) -- set on load.
OVERLAY: list[tuple[str, str, str, Any]] = [
    # neural-search 2.19.0.0 query/HybridQueryBuilder.java: PAGINATION_DEPTH_FIELD is new in 2.19
    # (MinClusterVersionUtil.MINIMAL_SUPPORTED_VERSION_PAGINATION_IN_HYBRID_QUERY = V_2_19_0).
    (_QUERY, "/components/schemas/HybridQuery/allOf/1/properties/pagination_depth", "x-version-added", "2.19"),
    # neural-search 2.19.0.0: RRFProcessor ("score-ranker-processor") is new in 2.19.
    (_PIPELINE, "/components/schemas/PhaseResultsProcessor/oneOf/1", "x-version-added", "2.19"),
    # neural-search 3.1.0.0 processor/factory/RRFProcessorFactory.java reads a top-level
    # combination.rank_constant; 2.19.x/3.0.0 ignore it (neural-search#1370) ...
    (_PIPELINE, "/components/schemas/ScoreRankerCombination/properties/rank_constant", "x-version-added", "3.1"),
    # ... and read combination.parameters.rank_constant (RRFNormalizationTechnique
    # SUPPORTED_PARAMS), which 3.1's RRFScoreCombinationTechnique refuses (SUPPORTED_PARAMS =
    # weights only).
    (_PIPELINE, "/components/schemas/ScoreRankerCombination/properties", "parameters", {
        "type": "object",
        "properties": {
            "rank_constant": {"type": "integer", "minimum": 1, "x-version-removed": "3.1"},
            "weights": {"type": "array", "items": {"type": "number"}, "x-version-added": "3.1"},
        },
        "additionalProperties": False,
    }),
    # neural-search 3.3.0.0 sparse/mapper/SparseVectorFieldMapper.java (CONTENT_TYPE
    # "sparse_vector", parameter "method") and sparse/common/SparseConstants.java / Seismic.java.
    (_MAPPING, "/components/schemas/Property/oneOf", "+", {"$ref": "#/components/schemas/SparseVectorProperty"}),
    (_MAPPING, "/components/schemas", "SparseVectorProperty", {
        "x-version-added": "3.3",
        "allOf": [
            {"$ref": "#/components/schemas/PropertyBase"},
            {"type": "object", "properties": {
                "type": {"type": "string", "enum": ["sparse_vector"]},
                "method": {"type": "object", "properties": {
                    "name": {"type": "string", "enum": ["seismic"]},
                    "parameters": _SEISMIC_PARAMETERS,
                }, "required": ["name"], "additionalProperties": False},
            }, "required": ["type"]},
        ],
    }),
    # neural-search 3.3.0.0 sparse/SparseSettings.java: index.sparse (IS_SPARSE_INDEX_SETTING).
    (_INDICES, "/components/schemas/IndexSettings/properties", "sparse", {"type": "boolean", "x-version-added": "3.3"}),
    # neural-search 3.3.0.0 sparse/query/SparseAnnQueryBuilder.java: method_parameters with
    # top_n, k, heap_factor, filter, parsed by NeuralSparseQueryBuilder.
    (_QUERY, "/components/schemas/NeuralSparseQuery/allOf/1/properties", "method_parameters", {
        "x-version-added": "3.3",
        "type": "object",
        "properties": {
            "top_n": {"type": "integer", "minimum": 1},
            "k": {"type": "integer", "minimum": 1},
            "heap_factor": {"type": "number", "exclusiveMinimum": 0},
            "filter": {"$ref": "#/components/schemas/QueryContainer"},
        },
        "additionalProperties": False,
    }),
]


@dataclass
class Operation:
    method: str
    path: str
    operation_id: str
    file: Path
    body_schema: dict[str, Any] | None


class OpenSearchSpec:
    def __init__(self, root: Path, strict: bool = False, version: str | None = None,
                 overlay: bool = True) -> None:
        self.root = root / "spec" if (root / "spec").is_dir() else root
        if not (self.root / "namespaces").is_dir():
            raise FileNotFoundError(f"no OpenSearch API spec under {root}")
        self.strict = strict
        self.version = version
        self.docs: dict[str, dict[str, Any]] = copy.deepcopy(_read_docs(str(self.root)))
        if overlay:
            self._apply_overlay()
        if version:
            wanted = _version(version)
            for doc in self.docs.values():
                _prune_versions(doc, wanted, doc)
        if strict:
            self._close_objects()
        self.registry = Registry().with_resources(
            (uri, Resource.from_contents(doc, default_specification=DRAFT202012))
            for uri, doc in self.docs.items()
        )

    @classmethod
    @lru_cache(maxsize=8)
    def load(cls, root: str | None = None, strict: bool = False, version: str | None = None,
             overlay: bool = True) -> OpenSearchSpec:
        return cls(Path(root) if root else DEFAULT_SPEC, strict=strict, version=version, overlay=overlay)

    def _apply_overlay(self) -> None:
        for file, pointer, key, value in OVERLAY:
            target = _resolve_pointer(self.docs[(self.root / file).resolve().as_uri()], pointer)
            if key == "+":
                target.append(copy.deepcopy(value))
            else:
                target[key] = copy.deepcopy(value)

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
                # the branches of a mixin (an allOf member) are mixins too: TermsAggregationFields
                # is allOf [its properties, anyOf [{field}, {script}]]
                for item in value:
                    self._close(uri, item, in_all_of=in_all_of and key != "prefixItems", definition=False)
            elif key == "properties" and isinstance(value, dict):
                for item in value.values():
                    self._close(uri, item, in_all_of=False, definition=False)
            elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
                self._close(uri, value, in_all_of=False, definition=False)



@lru_cache(maxsize=1)
def _read_docs(root: str) -> dict[str, dict[str, Any]]:
    docs = {}
    for path in sorted(Path(root).rglob("*.yaml")):
        with open(path, encoding="utf-8") as fh:
            docs[path.resolve().as_uri()] = yaml.safe_load(fh)
    return docs


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text))[:3])


def _absent_in(schema: Any, wanted: tuple[int, ...], doc: Any = None) -> bool:
    if not isinstance(schema, dict):
        return False
    ref = schema.get("$ref", "")
    if doc is not None and ref.startswith("#/") and _absent_in(_resolve_pointer(doc, ref[1:]), wanted):
        return True  # a branch pointing at a schema of a later release
    added, removed = schema.get("x-version-added"), schema.get("x-version-removed")
    return bool((added and _version(added) > wanted) or (removed and _version(removed) <= wanted))


def _prune_versions(node: Any, wanted: tuple[int, ...], doc: Any) -> None:
    """Take out properties and oneOf/anyOf branches the release ``wanted`` does not have."""
    if isinstance(node, list):
        for item in node:
            _prune_versions(item, wanted, doc)
        return
    if not isinstance(node, dict):
        return
    props = node.get("properties")
    if isinstance(props, dict):
        for name in [n for n, sub in props.items() if _absent_in(sub, wanted, doc)]:
            del props[name]
    for key in ("oneOf", "anyOf"):
        if isinstance(node.get(key), list):
            node[key] = [b for b in node[key] if not _absent_in(b, wanted, doc)]
    for value in node.values():
        _prune_versions(value, wanted, doc)


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
        key = part.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def deep_copy(body: Any) -> Any:
    return copy.deepcopy(body)
