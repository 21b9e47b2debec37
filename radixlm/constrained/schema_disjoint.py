"""oneOf exclusivity: whether no value can match two branches of a lowered oneOf, so that enforcing it as
`anyOf` is exact (most real oneOfs are tagged unions: distinct types, consts, or required properties
that the other branch forbids or constrains to a different const).

Runs in compile workers. Every check is conservative: `apart` returns True only when it has proved that
no value matches both schemas; anything it cannot see through (a pattern it cannot evaluate, a `$ref`
still being expanded, depth past _MAX_DEPTH) counts as "may overlap", and the caller then reports the
oneOf as approximated (the finished output is validated against the original schema).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from radixlm.constrained.schema_merge import canon, is_never

Deref = Callable[[str], "dict[str, Any] | None"]  # may carry a `memo` dict (see Memo)


class Memo:
    """A deref with a memo of definition pairs already compared (a large schema compares the same
    pairs in many oneOfs). Only for definitions that no longer change."""

    def __init__(self, deref: Callable[[str], "dict[str, Any] | None"]):
        self.deref = deref
        self.memo: dict[tuple[str, str], bool] = {}

    def __call__(self, ref: str) -> "dict[str, Any] | None":
        return self.deref(ref)
_MAX_DEPTH = 6  # nested property checks (tagged unions need 1-2)
# Lowered `type` lists -> disjoint value kinds ("number" spans integers and non-integers).
_KINDS = {"null": {"null"}, "boolean": {"boolean"}, "object": {"object"}, "array": {"array"},
          "string": {"string"}, "integer": {"integer"}, "number": {"integer", "fraction"}}
_ALL_KINDS = frozenset().union(*_KINDS.values())


def disjoint(branches: list[dict[str, Any]], deref: Deref | None = None) -> bool:
    """True when no value can match two of the branches (so oneOf == anyOf)."""
    look = deref or (lambda ref: None)
    return all(apart(a, b, look) for i, a in enumerate(branches) for b in branches[i + 1:])


def _resolve(node: Any, deref: Deref) -> dict[str, Any] | None:
    """The node with `$ref`s followed (None: unknown, e.g. a definition still being expanded)."""
    for _ in range(_MAX_DEPTH):
        if node is True:
            return {}
        if not isinstance(node, dict):
            return None
        if "$ref" not in node:
            return node
        if len(node) > 1:
            return None  # a ref with siblings: not produced by the lowering, stay conservative
        node = deref(node["$ref"])
    return None


def apart(a: Any, b: Any, deref: Deref, depth: int = 0) -> bool:
    """True only if proved: no JSON value satisfies both lowered schemas a and b."""
    if depth > _MAX_DEPTH:
        return False
    memo = getattr(deref, "memo", None)  # two definitions: the same answer every time they meet
    if memo is not None and isinstance(a, dict) and isinstance(b, dict) and len(a) == len(b) == 1 \
            and "$ref" in a and "$ref" in b:
        key = (a["$ref"], b["$ref"])
        if key not in memo:
            memo[key] = False  # while it is being decided (a recursive pair): not proved
            memo[key] = _apart(a, b, deref, depth)
        return memo[key]
    return _apart(a, b, deref, depth)


def _apart(a: Any, b: Any, deref: Deref, depth: int) -> bool:
    a, b = _resolve(a, deref), _resolve(b, deref)
    if a is None or b is None:
        return False
    if is_never(a) or is_never(b):
        return True
    if not a or not b:
        return False
    for x, y in ((a, b), (b, a)):
        if "anyOf" in x:
            return all(apart({**{k: v for k, v in x.items() if k != "anyOf"}, **br} if len(x) > 1 else br,
                             y, deref, depth + 1) for br in x["anyOf"])
    for x, y in ((a, b), (b, a)):
        if isinstance(x.get("enum"), list):
            return all(excludes(y, v, deref, depth + 1) or excludes(x, v, deref, depth + 1) for v in x["enum"])
    common = _kinds(a) & _kinds(b)
    return all(_apart_within(kind, a, b, deref, depth) for kind in common)


def _kinds(node: dict[str, Any]) -> set[str]:
    types = node.get("type")
    if not isinstance(types, list):
        return set(_ALL_KINDS)
    return set().union(*(_KINDS.get(t, _ALL_KINDS) for t in types))


def _apart_within(kind: str, a: dict[str, Any], b: dict[str, Any], deref: Deref, depth: int) -> bool:
    """No value of this kind satisfies both (the keywords of other kinds do not apply to it)."""
    if kind == "object":
        return _objects_apart(a, b, deref, depth) or _objects_apart(b, a, deref, depth)
    if kind in ("integer", "fraction"):
        lo_a, hi_a = _interval(a)
        lo_b, hi_b = _interval(b)
        return max(lo_a, lo_b) > min(hi_a, hi_b)
    if kind == "string":
        return a.get("minLength", 0) > b.get("maxLength", math.inf) or \
            b.get("minLength", 0) > a.get("maxLength", math.inf)
    if kind == "array":
        return _arrays_apart(a, b, deref, depth)
    return False


def _interval(node: dict[str, Any]) -> tuple[float, float]:
    """A closed interval holding every number the node allows (exclusive bounds widened: conservative)."""
    lo = max((node[k] for k in ("minimum", "exclusiveMinimum") if _is_num(node.get(k))), default=-math.inf)
    hi = min((node[k] for k in ("maximum", "exclusiveMaximum") if _is_num(node.get(k))), default=math.inf)
    return lo, hi


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _objects_apart(a: dict[str, Any], b: dict[str, Any], deref: Deref, depth: int) -> bool:
    """A property a requires that b forbids, or whose value a and b constrain apart."""
    for name in a.get("required", []):
        if not isinstance(name, str):
            continue
        if _forbids(b, name):
            return True
        if apart(_property(a, name), _property(b, name), deref, depth + 1):
            return True
    return False


def _property(node: dict[str, Any], name: str) -> Any:
    """The schema a present property `name` must satisfy, as far as it is known ({}: unknown)."""
    props = node.get("properties", {})
    if name in props:
        return props[name]
    if node.get("patternProperties"):
        return {}
    extra = node.get("additionalProperties", {})
    return extra if isinstance(extra, dict) else {}


def _forbids(node: dict[str, Any], name: str) -> bool:
    props = node.get("properties", {})
    if name in props:
        return is_never(props[name])
    if any(_may_match(p, name) for p in node.get("patternProperties", {})):
        return False
    return is_never(node.get("additionalProperties", {}))


def _may_match(pattern: str, name: str) -> bool:
    """Whether an ECMA-262 pattern may match `name` (True when it cannot be evaluated)."""
    try:
        import regress

        return regress.Regex(pattern, "u").find(name) is not None
    except Exception:  # noqa: BLE001 - a pattern regress refuses: assume it may match
        return True


def _arrays_apart(a: dict[str, Any], b: dict[str, Any], deref: Deref, depth: int) -> bool:
    if a.get("minItems", 0) > b.get("maxItems", math.inf) or b.get("minItems", 0) > a.get("maxItems", math.inf):
        return True
    present = max(a.get("minItems", 0), b.get("minItems", 0))  # items every common value has
    for i in range(min(present, 8)):
        if apart(_item(a, i), _item(b, i), deref, depth + 1):
            return True
    return False


def _item(node: dict[str, Any], i: int) -> Any:
    prefix = node.get("prefixItems", [])
    return prefix[i] if i < len(prefix) else node.get("items", {})


def excludes(node: Any, value: Any, deref: Deref, depth: int = 0) -> bool:
    """True only if proved: `value` does not satisfy the lowered schema `node`."""
    node = _resolve(node, deref)
    if node is None or depth > _MAX_DEPTH:
        return False
    if is_never(node):
        return True
    if not node:
        return False
    if "anyOf" in node and len(node) == 1:
        return all(excludes(br, value, deref, depth + 1) for br in node["anyOf"])
    if isinstance(node.get("enum"), list) and canon(value) not in {canon(v) for v in node["enum"]}:
        return True
    if isinstance(node.get("notEnum"), list) and canon(value) in {canon(v) for v in node["notEnum"]}:
        return True
    kind = _kind_of(value)
    if kind not in _kinds(node):
        return True
    if kind == "object":
        if any(isinstance(r, str) and r not in value for r in node.get("required", [])):
            return True
        return any(_forbids(node, k) or excludes(_property(node, k), v, deref, depth + 1) for k, v in value.items())
    if kind in ("integer", "fraction"):
        lo, hi = _interval(node)
        return not lo <= value <= hi
    if kind == "string":
        return not node.get("minLength", 0) <= len(value) <= node.get("maxLength", math.inf)
    return False


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    return "integer" if float(value).is_integer() else "fraction"
