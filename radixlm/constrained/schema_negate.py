"""`not` for lowered schemas, where the complement is again a lowered schema; and oneOf disjointness.

Runs in compile workers. negate() handles the simple forms real schemas use (`not: {type}`,
`not: {enum}`, `not: {required: [...]}`, `anyOf` of those) and returns None for the rest (the caller
then drops the `not` and reports it as an approximation).
"""

from __future__ import annotations

from typing import Any

from radixlm.constrained.schema_merge import NEVER, TYPES, any_of, canon, is_never

_ALL = [t for t in TYPES if t != "integer"]


def _complement(types: list[str]) -> list[str] | None:
    if "integer" in types and "number" not in types:
        return None  # "a number that is not an integer" has no type keyword
    return [t for t in _ALL if t not in types]


def negate(node: dict[str, Any]) -> dict[str, Any] | None:
    if not node:
        return dict(NEVER)
    if is_never(node):
        return {}
    if "anyOf" in node and len(node) == 1:
        from radixlm.constrained.schema_merge import Conflict, Merger

        parts = [negate(b) for b in node["anyOf"]]
        if any(p is None for p in parts):
            return None
        merger = Merger(lambda ref: {}, lambda note: None)
        out: dict[str, Any] = {}
        try:
            for p in parts:
                out = merger.merge(out, p, "not")  # type: ignore[arg-type]
        except Conflict:
            return dict(NEVER)
        return out
    types = node.get("type")
    rest = {k: v for k, v in node.items() if k != "type"}
    if not rest:
        other = _complement(types)
        return None if other is None else ({"type": other} if other else dict(NEVER))
    inner = _negate_constraint(rest)
    if inner is None:
        return None
    if types is None:
        return inner
    other = _complement(types)
    if other is None:
        return None
    return any_of(([{"type": other}] if other else []) + [{**inner, "type": types}])


def _negate_constraint(rest: dict[str, Any]) -> dict[str, Any] | None:
    """not(rest) for one typeless constraint (applies to the values it is about)."""
    if set(rest) == {"enum"}:
        return {"notEnum": rest["enum"]}
    if set(rest) == {"properties"} and len(rest["properties"]) == 1:
        (name, sub), = rest["properties"].items()
        neg = negate(sub)  # present with a value the subschema refuses
        return None if neg is None else {"required": [name], "properties": {name: neg}}
    if set(rest) == {"required"} and rest["required"]:
        return any_of([{"properties": {name: dict(NEVER)}} for name in rest["required"]])
    return None


def _type_set(node: dict[str, Any]) -> set[str] | None:
    if "enum" in node:
        return None
    types = node.get("type")
    if types is None:
        return None
    out = set(types)
    if "number" in out:
        out.add("integer")
    return out


def disjoint(branches: list[dict[str, Any]]) -> bool:
    """True when no value can match two branches (so oneOf == anyOf): by type or by distinct consts,
    also a const-valued property every branch requires (tagged unions)."""
    sets = [_type_set(b) for b in branches]
    if all(s is not None for s in sets):
        seen: set[str] = set()
        for s in sets:
            if seen & s:  # type: ignore[operator]
                break
            seen |= s  # type: ignore[operator]
        else:
            return True
    if all("enum" in b for b in branches):
        values = [canon(v) for b in branches for v in b["enum"]]
        return len(values) == len(set(values))
    return _tagged(branches)


def _tagged(branches: list[dict[str, Any]]) -> bool:
    common = None
    for b in branches:
        if b.get("type") != ["object"]:
            return False  # a non-object value would match every branch
        keys = {k for k in b.get("required", []) if "enum" in b.get("properties", {}).get(k, {})}
        common = keys if common is None else common & keys
    for key in common or ():
        values = [canon(v) for b in branches for v in b["properties"][key]["enum"]]
        if len(values) == len(set(values)):
            return True
    return False
