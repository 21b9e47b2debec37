"""One-sided bounds on JSON numbers, decided on the text as it is generated: can this number prefix still
end inside the bound, and does this finished number lie inside it; and which bounds of a lowered schema
are handed over to be decided so.

Pure functions, used by llguidance_compile.py (compile workers: `hand_over`) and by number_layer.py in
the scheduler (`bound_at`, `feasible`, `within`). A finished number must satisfy the bound both as the
output validator reads it (`json.loads`, then Python's comparisons, as `jsonschema` does) and exactly.
"""

from __future__ import annotations

import json
import math
import re
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any

MARK = "x-radixlm-bound"  # the lowered schema's key for a bound the number layer enforces
LOWER = ("minimum", "exclusiveMinimum")
UPPER = ("maximum", "exclusiveMaximum")
_PREFIX = re.compile(rb"(-?)([0-9]*)(?:(\.)([0-9]*))?(?:([eE])([+-]?)([0-9]*))?")
_INF = Decimal("Infinity")
# Exponents as large as a Decimal can hold, and no traps: m * 10^k for any written k never raises.
_WIDE = Context(prec=64, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])
_MAX_EXPONENT_DIGITS = 17  # a longer exponent is beyond any bound's reach: read as 10^17

# (lowest, lowest reached, highest, highest reached): the values a prefix's completions can take.
Reach = tuple[Decimal, bool, Decimal, bool]


def one_sided(node: dict[str, Any]) -> dict[str, Any] | None:
    """The node's bounds when they are all lower or all upper ones (finite numbers), else None."""
    bound = {k: node[k] for k in LOWER + UPPER if k in node}
    if not bound or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                            for v in bound.values()):
        return None
    if set(bound) <= set(LOWER) or set(bound) <= set(UPPER):
        return bound
    return None


def hand_over(schema: Any) -> Any:
    """The lowered schema with each one-sided bound of a `number` below the root, reached through
    properties / additionalProperties / items / prefixItems (the steps bound_at follows), moved under
    MARK, where llguidance ignores it. Shared subtrees are copied, never changed in place."""
    done: dict[int, Any] = {}

    def visit(node: Any, root: bool) -> Any:
        if not isinstance(node, dict) or "anyOf" in node or "$ref" in node or "allOf" in node:
            return node
        if id(node) in done and not root:
            return done[id(node)]
        out = dict(node)
        if not root and node.get("type") == "number" and "multipleOf" not in node and one_sided(node):
            bound = one_sided(node)
            out = {k: v for k, v in node.items() if k not in bound}
            out[MARK] = bound
        if not node.get("patternProperties"):  # a key may match a pattern too: bound_at stops there
            if isinstance(node.get("properties"), dict):
                out["properties"] = {k: visit(v, False) for k, v in node["properties"].items()}
            if isinstance(node.get("additionalProperties"), dict):
                out["additionalProperties"] = visit(node["additionalProperties"], False)
        if isinstance(node.get("items"), dict):
            out["items"] = visit(node["items"], False)
        if isinstance(node.get("prefixItems"), list):
            out["prefixItems"] = [visit(v, False) for v in node["prefixItems"]]
        if not root:
            done[id(node)] = out  # the rewrite depends on the node only, not on the path to it
        return out

    return visit(schema, True)


def bound_at(schema: Any, path: tuple) -> dict | None:
    """The handed-over bound of the value at `path` (keys and indices from the root), or None."""
    node = schema
    for step in path:
        if not isinstance(node, dict) or "anyOf" in node or "$ref" in node or "allOf" in node:
            return None
        if isinstance(step, str):
            if node.get("patternProperties"):
                return None
            props = node.get("properties")
            node = props[step] if isinstance(props, dict) and step in props else node.get("additionalProperties")
        elif isinstance(step, int) and not isinstance(step, bool):
            prefix = node.get("prefixItems")
            node = prefix[step] if isinstance(prefix, list) and step < len(prefix) else node.get("items")
        else:
            return None
    bound = node.get(MARK) if isinstance(node, dict) else None
    return bound if isinstance(bound, dict) else None


def within(text: bytes, bound: dict[str, Any]) -> bool:
    """The finished number `text` satisfies every keyword of `bound`, both as the output validator reads it
    (`json.loads`: 5e-400 is 0.0) and exactly (5e-400 > 0): an output is never reported invalid, and
    never holds a value outside the bound."""
    try:
        read = json.loads(text)
    except ValueError:  # e.g. an integer past Python's 4300 digits: the validator could not read it either
        return False
    try:
        exact = Decimal(text.decode("ascii"))
    except InvalidOperation:  # an exponent past Decimal's range: the validator's reading decides alone
        exact = None
    return all(_holds(key, read, limit) and (exact is None or _holds(key, exact, Decimal(limit)))
               for key, limit in bound.items())


def _holds(key: str, value: Any, limit: Any) -> bool:
    if key == "minimum":
        return value >= limit
    if key == "exclusiveMinimum":
        return value > limit
    if key == "maximum":
        return value <= limit
    return value < limit


def feasible(prefix: bytes, bound: dict[str, Any]) -> bool:
    """Some JSON number that starts with `prefix` (itself a prefix of a JSON number) satisfies `bound`."""
    reach = _reach(prefix)
    if reach is None:
        return True
    lo, lo_in, hi, hi_in = reach
    for key, limit in bound.items():
        x = Decimal(limit)  # exact, floats included
        if key == "minimum" and not (hi > x or (hi == x and hi_in)):
            return False
        if key == "exclusiveMinimum" and not hi > x:
            return False
        if key == "maximum" and not (lo < x or (lo == x and lo_in)):
            return False
        if key == "exclusiveMaximum" and not lo < x:
            return False
    return True


def _reach(prefix: bytes) -> Reach | None:
    """Bounds of the values reachable from `prefix`. A mantissa may still take an exponent, so before the
    `e` any magnitude above zero is reachable (zero too while every digit so far is 0); after it, the
    mantissa is fixed and the exponent's digits so far bound it on one side."""
    m = _PREFIX.fullmatch(prefix)
    if m is None:
        return None
    sign, whole, dot, frac, e, esign, edigits = m.groups()
    digits = whole + (frac or b"")
    if not e:
        zero = not digits.strip(b"0")
        magnitude = (Decimal(0), zero, _INF, False)
    else:
        try:
            mantissa = Decimal((whole + b"." + (frac or b"0")).decode())
        except InvalidOperation:
            return None
        magnitude = _exponent_reach(mantissa, esign, edigits)
    if sign:
        lo, lo_in, hi, hi_in = magnitude
        return -hi, hi_in, -lo, lo_in
    return magnitude


def _exponent_reach(mantissa: Decimal, esign: bytes, edigits: bytes) -> Reach:
    """Magnitudes mantissa * 10^k over the exponents k that extend what was written after the `e`: with
    digits d written, |k| is d itself or any longer number starting with d (leading zeros are allowed,
    so after `e0` every |k| >= 0); with none yet, any |k| of the written sign (either sign when none)."""
    if mantissa == 0:
        return Decimal(0), True, Decimal(0), True
    if not edigits and not esign:
        return Decimal(0), False, _INF, False
    least = 10**_MAX_EXPONENT_DIGITS if len(edigits) > _MAX_EXPONENT_DIGITS else int(edigits or b"0")
    if esign == b"-":
        return Decimal(0), False, _WIDE.scaleb(mantissa, -least), True
    return _WIDE.scaleb(mantissa, least), True, _INF, False
