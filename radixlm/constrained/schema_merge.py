"""The conjunction of two lowered schemas (`allOf`, `$ref` with siblings, distributed `anyOf`).

Runs in compile workers. A lowered node is `{}` (any value), NEVER (no value), `{"$ref": key}`,
`{"anyOf": [...]}` alone, or a flat node of validation keywords (`type` a list when present, `const`
folded into `enum`). Where two constraints cannot be written as one (two different patterns or
formats), the first is kept and the other reported through `note`: looser, never stricter.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

NEVER: dict[str, Any] = {"not": {}}
TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
_LOWER = ("minimum", "minLength", "minItems", "minProperties", "minContains")  # the larger one wins
_UPPER = ("maximum", "maxLength", "maxItems", "maxProperties", "maxContains")  # the smaller one wins
_SCHEMA_KEYS = ("items", "propertyNames", "contains")
MAX_REF_MERGES = 12  # nested $refs one merge inlines (a recursive def merged with a copy never ends)


class Conflict(ValueError):
    """Two constraints admit no common value (conflicting consts, disjoint types, ...)."""


def is_never(node: Any) -> bool:
    return isinstance(node, dict) and node.get("not") == {} and len(node) == 1


def canon(value: Any) -> str:
    """A JSON value's identity for enum intersection (1 and 1.0 are equal in JSON Schema)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      default=str) if not isinstance(value, float) or not value.is_integer() else str(int(value))


def any_of(branches: list[dict[str, Any]]) -> dict[str, Any]:
    flat: list[dict[str, Any]] = []
    for b in branches:
        if "anyOf" in b and len(b) == 1:
            flat.extend(b["anyOf"])
        elif not is_never(b):
            flat.append(b)
    if any(b == {} for b in flat):
        return {}
    unique: list[dict[str, Any]] = []
    for b in flat:  # `in` compares dicts (sizes, then keys first): cheap, unlike serializing them
        if b not in unique:
            unique.append(b)
    if not unique:
        return dict(NEVER)
    return unique[0] if len(unique) == 1 else {"anyOf": unique}


def _types(a: list[str] | None, b: list[str] | None) -> list[str] | None:
    if a is None or b is None:
        return b if a is None else a
    out = [t for t in a if t in b or (t == "integer" and "number" in b)]
    out += [t for t in b if t == "integer" and "number" in a and t not in out]
    if not out:
        raise Conflict(f"type {a} and type {b} have no value in common")
    return out


def _number_bound(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], lower: bool) -> None:
    incl, excl = ("minimum", "exclusiveMinimum") if lower else ("maximum", "exclusiveMaximum")
    cands = [(v, False) for v in (a.get(incl), b.get(incl)) if v is not None]
    cands += [(v, True) for v in (a.get(excl), b.get(excl)) if v is not None]
    out.pop(incl, None), out.pop(excl, None)
    if not cands:
        return
    value, exclusive = (max if lower else min)(cands, key=lambda c: (c[0], c[1] == lower))
    out[excl if exclusive else incl] = value


_KIND_KEYS = {
    "object": ("properties", "required", "additionalProperties", "patternProperties", "propertyNames",
               "minProperties", "maxProperties"),
    "array": ("items", "prefixItems", "contains", "minItems", "maxItems", "uniqueItems", "minContains",
              "maxContains"),
}


def _drop_kind(out: dict[str, Any], kind: str, cause: Conflict) -> None:
    """The keywords of one type conflict: no value of that type matches, the others are unaffected by
    those keywords (an untyped `properties` holds for every string). Conflict if no type is left; it
    names the keyword and place that ruled the type out (`cause`)."""
    types = [t for t in (out.get("type") or TYPES) if t != kind]
    if not types:
        raise Conflict(f"{cause}; no {kind} matches both and no other type is allowed")
    out["type"] = types
    for key in _KIND_KEYS[kind]:
        out.pop(key, None)


class Merger:
    """merge(a, b): the conjunction. `deref` turns a `{"$ref": key}` into its lowered definition."""

    def __init__(self, deref: Callable[[str], dict[str, Any]], note: Callable[[str], None]):
        self.deref, self.note = deref, note
        self._ref_depth = 0  # $refs being inlined by the merge in progress

    def merge(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        if is_never(a) or is_never(b):
            return dict(NEVER)
        if not a or not b:
            return dict(b or a)
        if a == b:
            return a
        if "$ref" in a or "$ref" in b:
            if self._ref_depth >= MAX_REF_MERGES:  # a recursive def met a copy of itself: stop (looser)
                self.note(f"$ref merged at {path} past depth {MAX_REF_MERGES} (the other side dropped)")
                return dict(a if "$ref" in a else b)
            self._ref_depth += 1
            try:
                return self.merge(self.deref(a["$ref"]) if "$ref" in a else a,
                                  self.deref(b["$ref"]) if "$ref" in b else b, path)
            finally:
                self._ref_depth -= 1
        for x, y, x_first in ((a, b, True), (b, a, False)):
            if "anyOf" in x:
                branches = []
                for branch in x["anyOf"]:
                    try:  # a's properties stay first: they are generated in this order
                        branches.append(self.merge(branch, y, path) if x_first else self.merge(y, branch, path))
                    except Conflict:
                        continue
                if not branches:
                    raise Conflict(f"no branch of anyOf at {path} is compatible with its siblings")
                return any_of(branches)
        return self._flat(a, b, path)

    def _flat(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        out = {**a, **b}
        if "type" in a or "type" in b:
            out["type"] = _types(a.get("type"), b.get("type"))
        if "enum" in a and "enum" in b:
            keep = {canon(v) for v in b["enum"]}
            out["enum"] = [v for v in a["enum"] if canon(v) in keep]
            if not out["enum"]:
                raise Conflict(f"const/enum values at {path} have no value in common")
        if "notEnum" in a and "notEnum" in b:
            out["notEnum"] = a["notEnum"] + b["notEnum"]
        for key in _LOWER[1:]:
            if key in a and key in b:
                out[key] = max(a[key], b[key])
        for key in _UPPER[1:]:
            if key in a and key in b:
                out[key] = min(a[key], b[key])
        _number_bound(a, b, out, True)
        _number_bound(a, b, out, False)
        if "required" in a or "required" in b:
            out["required"] = list(dict.fromkeys(a.get("required", []) + b.get("required", [])))
        if a.get("uniqueItems") or b.get("uniqueItems"):
            out["uniqueItems"] = True
        self._multiple(a, b, out, path)
        for key in ("pattern", "format"):
            if key in a and key in b and a[key] != b[key]:
                out[key] = a[key]
                self.note(f"second {key} at {path}")
        for key in _SCHEMA_KEYS:
            if key in a and key in b:
                try:
                    out[key] = self.merge(a[key], b[key], f"{path}/{key}")
                except Conflict as e:
                    _drop_kind(out, "object" if key == "propertyNames" else "array", e)
        try:
            self._properties(a, b, out, path)
        except Conflict as e:
            _drop_kind(out, "object", e)
        try:
            self._prefix(a, b, out, path)
        except Conflict as e:
            _drop_kind(out, "array", e)
        return out

    def _multiple(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str) -> None:
        x, y = a.get("multipleOf"), b.get("multipleOf")
        if x is None or y is None:
            return
        if isinstance(x, int) and isinstance(y, int):
            out["multipleOf"] = x * y // math.gcd(x, y)
        elif (x / y).is_integer() or (y / x).is_integer():
            out["multipleOf"] = max(x, y)
        else:
            out["multipleOf"] = x
            self.note(f"second multipleOf at {path}")

    def _properties(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str) -> None:
        """Properties one side lists and the other does not meet the other's additionalProperties."""
        if not any(k in a or k in b for k in ("properties", "additionalProperties", "patternProperties")):
            return
        pa, pb = a.get("properties", {}), b.get("properties", {})
        props: dict[str, Any] = {}
        for name in list(pa) + [n for n in pb if n not in pa]:
            sa = pa.get(name, self._extra(a, name))
            sb = pb.get(name, self._extra(b, name))
            props[name] = self.merge(sa, sb, f"{path}/properties/{name}")
        if props:
            out["properties"] = props
        if "additionalProperties" in a and "additionalProperties" in b:
            out["additionalProperties"] = self.merge(a["additionalProperties"], b["additionalProperties"],
                                                     f"{path}/additionalProperties")
        if "patternProperties" in a and "patternProperties" in b:
            pats = dict(a["patternProperties"])
            for pat, sub in b["patternProperties"].items():
                pats[pat] = self.merge(pats[pat], sub, f"{path}/patternProperties") if pat in pats else sub
            out["patternProperties"] = pats

    @staticmethod
    def _extra(node: dict[str, Any], name: str) -> dict[str, Any]:
        """The schema `node` applies to a property it does not list (patternProperties are checked
        only for being present: a listed name matched by a pattern keeps just its own schema)."""
        if node.get("patternProperties"):
            return {}
        return node.get("additionalProperties", {})

    def _prefix(self, a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str) -> None:
        if "prefixItems" not in a and "prefixItems" not in b:
            return
        xa, xb = a.get("prefixItems", []), b.get("prefixItems", [])
        merged = []
        for i in range(max(len(xa), len(xb))):
            sa = xa[i] if i < len(xa) else a.get("items", {})
            sb = xb[i] if i < len(xb) else b.get("items", {})
            merged.append(self.merge(sa, sb, f"{path}/prefixItems/{i}"))
        out["prefixItems"] = merged
