"""A schema lowered for outlines (schema_lower.py) -> the regex outlines-core's Index is built from.

Runs in compile workers. outlines-core's build_regex_from_schema converts the structure; what it does
not convert faithfully becomes a placeholder const (a unique literal) swapped for our own regex after:
string patterns (already in its dialect) and formats, numeric bounds, tuples with a tail or bounds, and
free values (it would nest them 2 levels deep, a regex whose DFA takes ~15 s to build).
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import INVALID_GRAMMAR, GrammarError
from radixlm.constrained.formats import FORMAT_REGEXES
from radixlm.constrained.number_range import bounded_number_regex

FREE_FORM_DEPTH = 1  # free objects / arrays hold flat values (one level: 0.3 s to build)
_SCALARS = ("string", "number", "boolean", "null")


def _err(message: str) -> GrammarError:
    return GrammarError("json_schema", INVALID_GRAMMAR, message)


class _Prep:
    def __init__(self, options: GrammarOptions):
        self.options = options
        self.nonce = "RADIXLM" + secrets.token_hex(6)
        self.placeholders: dict[str, str] = {}  # placeholder const -> regex

    def ws(self) -> str:
        ws = self.options.effective_whitespace
        return "[ ]?" if ws is None else ws

    def placeholder(self, regex: str) -> dict[str, Any]:
        name = f"{self.nonce}N{len(self.placeholders)}"
        self.placeholders[name] = regex
        return {"const": name}

    def sub_regex(self, node: dict[str, Any]) -> str:
        return _build(json.dumps(node), self.options)

    def run(self, node: dict[str, Any]) -> dict[str, Any]:
        if not node:  # any JSON value; containers hold scalars only (a union of deeper ones takes ~5 s)
            return {"anyOf": [{"type": t} for t in _SCALARS] + [{"type": t, "depth": 0} for t in ("object", "array")]}
        if "anyOf" in node:
            return {"anyOf": [self.run(b) for b in node["anyOf"]]}
        if "enum" in node or "const" in node:
            return node
        kind = node.get("type")
        if kind == "string":
            return self._string(node)
        if kind in ("integer", "number"):
            return self._number(node)
        if kind == "object":
            return self._object(node)
        if kind == "array":
            return self._array(node)
        return node

    def _string(self, node: dict[str, Any]) -> dict[str, Any]:
        if "pattern" in node:
            return self.placeholder('"(?:' + node["pattern"] + ')"')
        if "format" in node:
            return self.placeholder('"(?:' + FORMAT_REGEXES[node["format"]] + ')"')
        return node

    def _number(self, node: dict[str, Any]) -> dict[str, Any]:
        keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        if not any(k in node for k in keys):
            return {"type": node["type"]}
        integer = node["type"] == "integer"
        lo, lo_excl = _bound(node, "minimum", "exclusiveMinimum", True, integer)
        hi, hi_excl = _bound(node, "maximum", "exclusiveMaximum", False, integer)
        regex = bounded_number_regex(lo, lo_excl, hi, hi_excl, integer)
        if regex is None:
            raise _err("numeric bounds admit no value")
        return self.placeholder(regex)

    def _object(self, node: dict[str, Any]) -> dict[str, Any]:
        if "properties" in node:  # only the listed properties are generated (in the schema's order)
            out = {"type": "object", "properties": {k: self.run(v) for k, v in node["properties"].items()}}
            if node.get("required"):
                out["required"] = node["required"]
            return out
        extra = node.get("additionalProperties")
        if not any(k in node for k in ("patternProperties", "propertyNames", "minProperties", "maxProperties")):
            if extra is False:
                return {"const": {}}
            if extra:
                return {"type": "object", "additionalProperties": self.run(extra)}
            return {"type": "object", "depth": FREE_FORM_DEPTH}
        return self.placeholder(self._map_regex(node))

    def _map_regex(self, node: dict[str, Any]) -> str:
        """`{"key": value, ...}` from key patterns and the free-key schema, with a count range."""
        names = node.get("propertyNames", {})
        free_key = _key_regex(names)
        entries = [(f"(?:{pattern})", sub) for pattern, sub in node.get("patternProperties", {}).items()]
        extra = node.get("additionalProperties", {})
        if extra is not False and free_key is not None:
            entries.append((free_key, extra if extra is not None else {}))
        ws = self.ws()
        alts = [f'"{key}"{ws}:{ws}(?:{self.sub_regex(self.run(sub))})' for key, sub in entries]
        if not alts:
            return r"\{" + ws + r"\}"
        entry = "(?:" + "|".join(alts) + ")"
        lo, hi = node.get("minProperties", 0), node.get("maxProperties")
        more = f"(?:{ws},{ws}{entry}){{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}"
        body = entry + more if lo > 0 else f"(?:{entry}{more})?"
        if hi == 0:
            body = ""
        return r"\{" + ws + body + ws + r"\}"

    def _array(self, node: dict[str, Any]) -> dict[str, Any]:
        prefix = node.get("prefixItems", [])
        lo, hi = node.get("minItems", 0), node.get("maxItems")
        items = node.get("items")
        if not prefix and items is None and lo == 0 and hi is None:
            return {"type": "array", "depth": FREE_FORM_DEPTH}
        if not prefix:
            out = {"type": "array", "items": self.run(items or {})}
            out.update({k: node[k] for k in ("minItems", "maxItems") if k in node})
            return out
        return self.placeholder(self._tuple_regex([self.sub_regex(self.run(p)) for p in prefix],
                                                  self.sub_regex(self.run(items or {})), lo, hi))

    def _tuple_regex(self, prefix: list[str], rest: str, lo: int, hi: int | None) -> str:
        """`[p0, p1, ..., rest, rest...]` with lo <= length <= hi (hi None: unbounded)."""
        ws, sep = self.ws(), f"{self.ws()},{self.ws()}"
        n = len(prefix)
        alts = [""] if lo == 0 else []
        for k in range(max(lo, 1), min(n, hi if hi is not None else n) + 1):
            alts.append(sep.join(f"(?:{p})" for p in prefix[:k]))
        if hi is None or hi > n:
            tail_lo = max(lo - n, 1)
            tail_hi = "" if hi is None else str(hi - n)
            alts.append(sep.join(f"(?:{p})" for p in prefix) + f"(?:{sep}(?:{rest})){{{tail_lo},{tail_hi}}}")
        if not alts:
            raise _err("array bounds admit no value")
        return rf"\[{ws}(?:" + "|".join(alts) + rf"){ws}\]"


def _key_regex(names: dict[str, Any]) -> str | None:
    """The JSON-encoded key (between the quotes) that propertyNames allows."""
    from radixlm.constrained.ecma_regex import FREE_JSON_CHARS
    from radixlm.constrained.specs import escape_literal

    if "pattern" in names:
        return f"(?:{names['pattern']})"
    values = names.get("enum", [names["const"]] if "const" in names else None)
    if values is not None:
        keys = [json.dumps(v, ensure_ascii=False)[1:-1] for v in values if isinstance(v, str)]
        return "(?:" + "|".join(escape_literal(k) for k in keys) + ")" if keys else None
    return FREE_JSON_CHARS


def _bound(node: dict[str, Any], incl: str, excl: str, lower: bool, integer: bool) -> tuple[int | None, bool]:
    """The bound as (integer value, exclusive?); schema_emit.py already made number bounds integral."""
    for key, is_excl in ((excl, True), (incl, False)):
        if key in node:
            value = node[key]
            if not float(value).is_integer():  # integers: the next integer inwards, inclusive
                return (math.ceil(value) if lower else math.floor(value)), False
            return int(value), is_excl
    return None, False


def _build(text: str, options: GrammarOptions) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    ws = options.effective_whitespace
    try:
        return build_regex_from_schema(text, ws) if ws is not None else build_regex_from_schema(text)
    except (ValueError, TypeError) as e:
        message = str(e)
        raise _err(f"cannot convert schema: {message[:200]}") from None


def lowered_to_regex(schema: dict[str, Any], options: GrammarOptions) -> str:
    prep = _Prep(options)
    regex = _build(json.dumps(prep.run(schema)), options)
    for name in reversed(list(prep.placeholders)):  # outer placeholders hold inner ones
        regex = regex.replace(f'"{name}"', f"(?:{prep.placeholders[name]})")
    return regex
