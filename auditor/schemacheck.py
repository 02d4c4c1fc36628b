"""A small JSON Schema (2020-12 subset) checker, so the report can be validated against
its shipped schema without a jsonschema dependency. Supports what report.schema.json
uses: type, enum, const, required, properties, additionalProperties, items, $ref into
$defs, minimum, anyOf, pattern."""

from __future__ import annotations

import re
from typing import Any

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def validate(data: Any, schema: dict) -> list[str]:
    errors: list[str] = []
    _check(data, schema, schema, "$", errors)
    return errors


def _type_ok(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES[name])


def _check(value: Any, node: dict, root: dict, where: str, errors: list[str]) -> None:
    if "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/$defs/"):
            errors.append(f"{where}: unsupported $ref {ref}")
            return
        node = root["$defs"][ref.split("/")[-1]]
    if "anyOf" in node:
        if not any(not validate_sub(value, alt, root) for alt in node["anyOf"]):
            errors.append(f"{where}: matches none of anyOf")
        return
    kinds = node.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        if not any(_type_ok(value, n) for n in names):
            errors.append(f"{where}: expected {'/'.join(names)}, got {type(value).__name__}")
            return
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{where}: {value!r} not in {node['enum']}")
    if "const" in node and value != node["const"]:
        errors.append(f"{where}: expected {node['const']!r}, got {value!r}")
    if "minimum" in node and isinstance(value, (int, float)) and value < node["minimum"]:
        errors.append(f"{where}: {value} < {node['minimum']}")
    if "pattern" in node and isinstance(value, str) and not re.search(node["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {node['pattern']}")
    if isinstance(value, dict):
        for key in node.get("required", []):
            if key not in value:
                errors.append(f"{where}: missing {key!r}")
        props = node.get("properties", {})
        extra = node.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], root, f"{where}.{key}", errors)
            elif extra is False:
                errors.append(f"{where}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                _check(item, extra, root, f"{where}.{key}", errors)
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _check(item, node["items"], root, f"{where}[{i}]", errors)


def validate_sub(value: Any, node: dict, root: dict) -> list[str]:
    errors: list[str] = []
    _check(value, node, root, "$", errors)
    return errors
