"""`not` for lowered schemas, where the complement is again a lowered schema (oneOf exclusivity:
schema_disjoint.py).

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


def _conjunction(parts: list[dict[str, Any]]) -> dict[str, Any]:
    from radixlm.constrained.schema_merge import Conflict, Merger

    merger = Merger(lambda ref: {}, lambda note: None)
    out: dict[str, Any] = {}
    try:
        for p in parts:
            out = merger.merge(out, p, "not")
    except Conflict:
        return dict(NEVER)
    return out


def negate(node: dict[str, Any]) -> dict[str, Any] | None:
    if not node:
        return dict(NEVER)
    if is_never(node):
        return {}
    if "anyOf" in node and len(node) == 1:
        parts = [negate(b) for b in node["anyOf"]]
        if any(p is None for p in parts):
            return None
        return _conjunction(parts)  # type: ignore[arg-type]
    types = node.get("type")
    rest = {k: v for k, v in node.items() if k != "type"}
    if not rest:
        other = _complement(types)
        return None if other is None else ({"type": other} if other else dict(NEVER))
    inner = _negate_constraints(rest)
    if inner is None:
        return None
    if types is None:
        return inner
    other = _complement(types)
    if other is None:
        return None
    # not(types and rest) = another type, or one of these types that breaks rest
    return any_of(([{"type": other}] if other else []) + [_conjunction([{"type": types}, inner])])


def _negate_constraints(rest: dict[str, Any]) -> dict[str, Any] | None:
    """not(c1 and c2 and ...) = not(c1) or not(c2) or ... (De Morgan), each property on its own."""
    singles = [{key: value} for key, value in rest.items() if key != "properties"]
    singles += [{"properties": {name: sub}} for name, sub in rest.get("properties", {}).items()]
    negs = [_negate_constraint(c) for c in singles]
    if any(n is None for n in negs):
        return None
    return any_of(negs)  # type: ignore[arg-type]


def _negate_constraint(rest: dict[str, Any]) -> dict[str, Any] | None:
    """not(rest) for one typeless constraint. A keyword about one type holds for every value of the other
    types, so its negation is of that type (`not: {required: [a]}` is an object without `a`)."""
    if set(rest) == {"enum"}:
        return {"notEnum": rest["enum"]}
    if set(rest) == {"properties"} and len(rest["properties"]) == 1:
        (name, sub), = rest["properties"].items()
        neg = negate(sub)  # present with a value the subschema refuses
        return None if neg is None else {"type": ["object"], "required": [name], "properties": {name: neg}}
    if set(rest) == {"required"} and rest["required"]:
        return any_of([{"type": ["object"], "properties": {name: dict(NEVER)}} for name in rest["required"]])
    return None
