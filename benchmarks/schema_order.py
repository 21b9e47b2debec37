"""Serialize an instance the way the grammars expect a document (used by schema_corpus.py): each object's
keys in the order of its schema's `properties` (then the rest), `", "` / `": "` separators by default,
none in compact style."""

from __future__ import annotations

import json
import re
from typing import Any

ROOT_URI = "https://radixlm.invalid/schema.json"  # the base URI of a schema without $id


class _Orderer:
    """Rewrites an instance with each object's keys in its schema's `properties` order; subschemas are
    followed through $ref, properties / patternProperties / additionalProperties, items / prefixItems,
    and the allOf / anyOf / oneOf branches the value is valid against."""

    def __init__(self, schema: Any):
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT7, specification_with

        from benchmarks.schema_corpus import validator_for

        self.validator = validator_for(schema)
        spec = specification_with(schema.get("$schema", ""), default=DRAFT7) if isinstance(schema, dict) else DRAFT7
        resource = Resource(contents=schema, specification=spec)
        self.resolver = Registry().with_resource(ROOT_URI, resource).resolver(base_uri=ROOT_URI)

    def subschemas(self, schema: Any, resolver: Any, value: Any, depth: int = 0) -> list[tuple[dict, Any]]:
        """schema and every subschema that applies to value at the same place (with its resolver)."""
        if not isinstance(schema, dict) or depth > 16:
            return []
        out = [(schema, resolver)]
        ref = schema.get("$ref")
        if isinstance(ref, str):
            try:
                found = resolver.lookup(ref)
                out += self.subschemas(found.contents, found.resolver, value, depth + 1)
            except Exception:  # noqa: BLE001 - an unresolvable ref orders nothing
                pass
        for key in ("allOf", "anyOf", "oneOf"):
            for branch in schema.get(key, ()) if isinstance(schema.get(key), list) else ():
                if key == "allOf" or self._valid(branch, value):
                    out += self.subschemas(branch, resolver, value, depth + 1)
        for key in ("then", "else"):
            if isinstance(schema.get(key), dict) and self._valid(schema[key], value):
                out += self.subschemas(schema[key], resolver, value, depth + 1)
        return out

    def _valid(self, branch: Any, value: Any) -> bool:
        try:
            return self.validator.evolve(schema=branch).is_valid(value)
        except Exception:  # noqa: BLE001
            return False

    def order(self, value: Any, schema: Any, resolver: Any) -> Any:
        applied = self.subschemas(schema, resolver, value)
        if isinstance(value, dict):
            keys: list[str] = []
            for s, _ in applied:
                props = s.get("properties")
                if isinstance(props, dict):
                    keys += [k for k in props if k in value and k not in keys]
            keys += [k for k in value if k not in keys]
            return {k: self.order(value[k], *self._child_of_object(applied, k)) for k in keys}
        if isinstance(value, list):
            return [self.order(v, *self._child_of_array(applied, i)) for i, v in enumerate(value)]
        if isinstance(value, float) and value.is_integer() and any(_allows_integer(s) for s, _ in applied):
            return int(value)  # 1.0 is a JSON-Schema integer, but a model writes an integer as digits
        return value

    def _child_of_object(self, applied: list, key: str) -> tuple[dict, Any]:
        for s, r in applied:
            if isinstance(s.get("properties"), dict) and key in s["properties"]:
                return s["properties"][key], r
        for s, r in applied:
            for pattern, sub in (s.get("patternProperties") or {}).items():
                if _search(pattern, key):
                    return sub, r
        for s, r in applied:
            if isinstance(s.get("additionalProperties"), dict):
                return s["additionalProperties"], r
        return {}, applied[0][1] if applied else self.resolver

    def _child_of_array(self, applied: list, index: int) -> tuple[dict, Any]:
        for s, r in applied:
            tuple_items = s.get("prefixItems", s.get("items") if isinstance(s.get("items"), list) else None)
            if isinstance(tuple_items, list) and index < len(tuple_items):
                return tuple_items[index], r
            extra = s.get("items") if "prefixItems" in s else s.get("additionalItems")
            if isinstance(tuple_items, list) and isinstance(extra, dict):
                return extra, r
            if isinstance(s.get("items"), dict):
                return s["items"], r
        return {}, applied[0][1] if applied else self.resolver


def _allows_integer(schema: dict) -> bool:
    t = schema.get("type")
    return t == "integer" or (isinstance(t, list) and "integer" in t)


def _search(pattern: str, text: str) -> bool:
    try:
        import regress

        return regress.Regex(pattern, "u").find(text) is not None
    except Exception:  # noqa: BLE001
        try:
            return re.search(pattern, text) is not None
        except re.error:
            return False


def serialize(instance: Any, schema: Any, compact: bool = False) -> str:
    """The instance as a grammar-constrained model would write it (see the module docstring)."""
    orderer = _Orderer(schema)
    ordered = orderer.order(instance, schema, orderer.resolver)
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(ordered, ensure_ascii=False, separators=separators)
