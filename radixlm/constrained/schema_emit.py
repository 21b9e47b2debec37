"""Lowered schema -> the schema one grammar library compiles: one `type` per node, only keywords the
library enforces, patterns in its regex dialect, enums filtered by their siblings.

Runs in compile workers. Each keyword a target does not enforce is dropped (looser) and reported.
For outlines, `pattern` is already the regex for the JSON *encoding* of the string (ecma_regex.py).
"""

from __future__ import annotations

import math
import re
from typing import Any

from radixlm.constrained.ecma_regex import MAX_REPEAT, MAX_REPEAT_LAZY, translate_pattern
from radixlm.constrained.formats import FORMAT_REGEXES
from radixlm.constrained.schema_merge import NEVER, any_of, canon, is_never

_OBJ = ("properties", "required", "additionalProperties", "patternProperties", "propertyNames",
        "minProperties", "maxProperties")
_ARR = ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains")
_STR = ("minLength", "maxLength", "pattern", "format")
_NUM = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_BY_TYPE = {"object": _OBJ, "array": _ARR, "string": _STR, "number": _NUM, "integer": _NUM,
            "boolean": (), "null": ()}
MAX_BOUND = 10**15  # a bound past it only makes the outlines regex long
_ORDER = ("null", "boolean", "integer", "number", "string", "array", "object")

# What each library enforces exactly (measured by tests/constrained/test_keyword_cases.py).
_COMMON = {"properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
           "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
           "exclusiveMaximum"}
EXACT = {
    "outlines": frozenset(_COMMON),
    "xgrammar": frozenset(_COMMON | {"patternProperties", "propertyNames", "minProperties", "maxProperties",
                                     "multipleOf"}),
    "llguidance": frozenset(_COMMON | {"patternProperties", "minProperties", "maxProperties", "multipleOf"}),
}
FORMATS = {
    "outlines": frozenset(FORMAT_REGEXES),
    "xgrammar": frozenset({"date", "time", "date-time", "uuid", "email", "ipv4", "ipv6", "hostname", "uri",
                           "duration"}),
    "llguidance": frozenset({"date", "time", "date-time", "uuid", "email", "ipv4", "ipv6", "hostname", "uri",
                             "duration"}),
}


class _Emitter:
    def __init__(self, defs: dict[str, Any], target: str, listed_only: bool = False):
        self.defs, self.target, self.listed_only = defs, target, listed_only
        self.exact = EXACT[target]
        self.max_repeat = MAX_REPEAT_LAZY if target == "llguidance" else MAX_REPEAT
        self.notes: list[str] = []
        self.empty_enum = ""  # the first enum none of whose values its sibling keywords admit (for the 400)
        self._validators: dict[str, Any] = {}
        self._memo: dict[int, tuple[Any, dict[str, Any]]] = {}  # id -> (node, emitted)

    def emit(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        """A lowered node shared by many places (merges and $ref targets share subtrees) is emitted once;
        its approximations are reported at the first path (the output is never mutated afterwards)."""
        hit = self._memo.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        out = self._emit(node, path)
        self._memo[id(node)] = (node, out)  # keeping the node keeps its id unique
        return out

    def _emit(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        if not node or is_never(node):
            return dict(node)
        if "$ref" in node:
            return dict(node)
        if "anyOf" in node:
            return any_of([self.emit(b, f"{path}/anyOf/{i}") for i, b in enumerate(node["anyOf"])])
        if "enum" in node:
            return self._enum(node, path)
        if "notEnum" in node:
            self.notes.append(f"not enum at {path}")
        types = list(node.get("type") or _ORDER)
        if "number" in types and "integer" in types:
            types.remove("integer")
        if not node.get("type") and not any(k in node for t in types for k in _BY_TYPE[t]):
            return {}
        if not node.get("type") and self.target == "outlines":
            types = self._implied_type(node, types, path)
        branches = [self._typed(t, node, f"{path}") for t in sorted(types, key=_ORDER.index)]
        return any_of(branches)

    def _implied_type(self, node: dict[str, Any], types: list[str], path: str) -> list[str]:
        """A typeless schema with only object (or only array, ...) keywords: its author meant that type.
        The other types would be valid too, but their union with free containers makes a regex whose
        DFA takes seconds to build (most untyped real schemas are objects), so outlines narrows it."""
        used = [t for t in types if any(k in node for k in _BY_TYPE[t])]
        if len(used) != 1:
            return types
        self.notes.append(f"type '{used[0]}' assumed at {path} (a schema without `type`; outlines only)")
        return used

    def _enum(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        rest = {k: v for k, v in node.items() if k not in ("enum", "notEnum")}
        banned = {canon(v) for v in node.get("notEnum", [])}
        values = [v for v in node["enum"] if canon(v) not in banned and self._valid(v, rest)]
        if not values:
            self.empty_enum = self.empty_enum or path
            return dict(NEVER)
        if self.target == "xgrammar" and any(isinstance(v, (list, dict)) for v in values):
            return any_of([_structural(v) for v in values])  # its consts ignore the separators
        return {"const": values[0]} if len(values) == 1 else {"enum": values}

    def _valid(self, value: Any, schema: dict[str, Any]) -> bool:
        if not schema:
            return True
        import json

        import jsonschema

        key = json.dumps(schema, sort_keys=True)
        if key not in self._validators:
            full = {**schema, "$defs": self.defs} if self.defs else schema
            self._validators[key] = jsonschema.Draft202012Validator(full)
        try:
            return self._validators[key].is_valid(value)
        except Exception:  # a pattern Python cannot compile: keep the value (looser)
            return True

    def _typed(self, kind: str, node: dict[str, Any], path: str) -> dict[str, Any]:
        out: dict[str, Any] = {"type": kind}
        for key in _BY_TYPE[kind]:
            if key in node:
                out[key] = node[key]
        if kind == "object":
            return self._object(out, path)
        if kind == "array":
            return self._array(out, path)
        if kind == "string":
            return self._string(out, path)
        if kind in ("number", "integer"):
            return self._number(out, path)
        return out

    def _drop_inexact(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        for key in [k for k in out if k != "type" and k not in self.exact]:
            if not (key == "uniqueItems" and out[key] is False):
                self.notes.append(f"{key} at {path}")
            del out[key]
        return out

    def _object(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        extra = self.emit(out.get("additionalProperties", {}), f"{path}/additionalProperties")
        props = {k: self.emit(v, f"{path}/properties/{k}") for k, v in out.get("properties", {}).items()}
        required = list(dict.fromkeys(out.get("required", [])))
        for name in required:
            if name not in props:
                props[name] = extra if not out.get("patternProperties") else {}
        if any(is_never(props[name]) for name in required):
            return dict(NEVER)
        banned = [k for k, v in props.items() if is_never(v)]
        for name in banned:
            if self.target == "llguidance":
                props[name] = False
            else:
                del props[name]  # outlines and xgrammar (strict) only generate the listed properties
        if banned and not props and self.target != "llguidance" and not is_never(extra):
            self.notes.append(f"absent properties {banned} at {path} (a free object may hold them)")
        if self.listed_only and props and not extra and "patternProperties" not in out:
            extra = dict(NEVER)  # only the listed keys: a narrower set, every member valid
        out.pop("properties", None)
        out.pop("required", None)
        out.pop("additionalProperties", None)
        if props:
            out["properties"] = props
        if required:
            out["required"] = required
        if is_never(extra):
            out["additionalProperties"] = False
        elif extra:
            out["additionalProperties"] = extra
        if "patternProperties" in out and self.target == "xgrammar":
            self._xgrammar_patterns(out, path)
        if "patternProperties" in out:
            out["patternProperties"] = {self._key_pattern(p, path): self.emit(s, f"{path}/patternProperties")
                                        for p, s in out["patternProperties"].items()}
            if self.target == "llguidance" and len(out["patternProperties"]) > 1:
                # llguidance wants disjoint key patterns: any key may take any of the value schemas.
                self.notes.append(f"patternProperties at {path} (overlapping key patterns)")
                values = list(out.pop("patternProperties").values())
                if "additionalProperties" in out:
                    values.append(out["additionalProperties"] or {})
                out["additionalProperties"] = any_of(values)
        if is_never(out.get("propertyNames")):  # no name is allowed: only the empty object
            return dict(NEVER) if required else {"type": "object", "maxProperties": 0}
        if "propertyNames" in out:  # names are strings whatever the subschema says
            names = out["propertyNames"]
            names = {**names, "type": ["string"]} if names and "type" not in names and "anyOf" not in names else names
            out["propertyNames"] = self.emit(names, f"{path}/propertyNames")
        if self.target == "outlines":
            return self._outlines_object(out, path)
        if self.target == "xgrammar" and "properties" in out:  # strict: only the listed ones exist
            for key in [k for k in ("minProperties", "maxProperties") if k in out]:
                self.notes.append(f"{key} at {path}")
                del out[key]
        elif self.target == "xgrammar" and "additionalProperties" not in out:
            out["additionalProperties"] = True  # strict mode reads a missing one as false
        return self._drop_inexact(out, path)

    def _xgrammar_patterns(self, out: dict[str, Any], path: str) -> None:
        """xgrammar lets a key take the schema of one pattern it matches alone (a listed property's key too,
        measured on the JSON-Schema-Test-Suite), and reads a pattern's `false` as an error: where JSON Schema
        needs more, the lowering says so."""
        patterns = out["patternProperties"]
        if len(patterns) > 1:
            self.notes.append(f"patternProperties at {path} (several key patterns: a key may satisfy one only)")
        for pattern in [p for p, sub in patterns.items() if is_never(sub)]:
            self.notes.append(f"patternProperties at {path} (a key pattern no value may take, dropped)")
            del patterns[pattern]
        for name in out.get("properties", {}):
            if any(_may_match(pattern, name) for pattern in patterns):
                self.notes.append(f"patternProperties at {path} (property {name!r} matches a key pattern too)")
        if not patterns:
            del out["patternProperties"]

    def _outlines_object(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        """Without `properties`, schema_regex.py writes key/value objects itself: key patterns, key
        names, counts. Keys matching a pattern may also take the additionalProperties branch."""
        if "properties" in out:
            return self._drop_inexact(out, path)
        names = out.get("propertyNames")
        if names is not None and not (names.get("type") == "string" and set(names) <= {"type", "pattern"}
                                      or set(names) == {"enum"} or set(names) == {"const"}):
            self.notes.append(f"propertyNames at {path}")
            del out["propertyNames"]
        if out.get("patternProperties") and out.get("additionalProperties") is not False:
            self.notes.append(f"patternProperties next to additionalProperties at {path}")
        return out

    def _key_pattern(self, pattern: str, path: str) -> str:
        regex, dropped = translate_pattern(pattern, self.target == "outlines", self.target != "xgrammar",
                                           self.target == "llguidance", self.max_repeat)
        self.notes.extend(f"patternProperties at {path}: {d}" for d in dropped)
        return regex

    def _array(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        items = self.emit(out.pop("items", {}), f"{path}/items")
        prefix = [self.emit(s, f"{path}/prefixItems/{i}") for i, s in enumerate(out.pop("prefixItems", []))]
        for i, sub in enumerate(prefix):
            if is_never(sub):  # no i-th item: the array ends before it
                prefix, items = prefix[:i], dict(NEVER)
                break
        if is_never(items):
            out["maxItems"] = min(out.get("maxItems", len(prefix)), len(prefix))
            if self.target != "outlines":
                out["items"] = False
        elif items:
            out["items"] = items
        elif self.target == "xgrammar":
            out["items"] = True  # its strict mode reads a missing `items` as false
        if prefix:
            out["prefixItems"] = prefix
        if out.get("minItems", 0) > out.get("maxItems", math.inf):
            return dict(NEVER)
        if "contains" in out:
            out["contains"] = self.emit(out["contains"], f"{path}/contains")
        return self._drop_inexact(out, path)

    def _string(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        if out.get("minLength", 0) > out.get("maxLength", math.inf):
            return dict(NEVER)
        if "format" in out and out["format"] not in FORMATS[self.target]:
            self.notes.append(f"format '{out.pop('format')}' at {path}")
        elif "format" in out and self.target != "outlines":
            self.notes.append(f"format '{out['format']}' at {path} (the library's own check)")
        if "pattern" in out:
            if not isinstance(out["pattern"], str):
                out.pop("pattern")
            else:
                regex, dropped = translate_pattern(out["pattern"], self.target == "outlines",
                                                   self.target != "xgrammar", self.target == "llguidance",
                                                   self.max_repeat)
                self.notes.extend(f"pattern at {path}: {d}" for d in dropped)
                out["pattern"] = regex
        if self.target == "xgrammar" and "pattern" in out:  # it ignores lengths next to a pattern (its warning)
            for key in [k for k in ("minLength", "maxLength") if k in out]:
                self.notes.append(f"{key} at {path} (next to a pattern)")
                del out[key]
        if self.target == "outlines":  # one regex per string: pattern, else format, else lengths
            for key in ("pattern", "format"):
                if key in out:
                    for other in [k for k in _STR if k in out and k != key]:
                        self.notes.append(f"{other} at {path}")
                        del out[other]
        return self._drop_inexact(out, path)

    def _number(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        if self.target == "outlines" and out["type"] == "number":
            for key, rounding in (("minimum", math.floor), ("exclusiveMinimum", math.floor),
                                  ("maximum", math.ceil), ("exclusiveMaximum", math.ceil)):
                if key in out and not float(out[key]).is_integer():
                    self.notes.append(f"non-integer {key} at {path} (widened to an integer)")
                    out[key.replace("exclusiveM", "m")] = rounding(out.pop(key))
        for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if self.target == "outlines" and key in out and abs(out[key]) > MAX_BOUND:
                self.notes.append(f"{key} beyond ±{MAX_BOUND} at {path} (dropped)")
                del out[key]
        if self.target == "xgrammar" and "multipleOf" in out:
            # It enforces an integer multipleOf on integers only; every multiple of an integer is one (written
            # without a fraction here, a narrower but valid set). A fractional step cannot be written for it.
            if float(out["multipleOf"]).is_integer():
                out["type"] = "integer"
            else:
                self.notes.append(f"fractional multipleOf at {path}")
                del out["multipleOf"]
        if out.get("multipleOf") in (1, 1.0) and out["type"] == "integer":
            del out["multipleOf"]
        return self._drop_inexact(out, path)


def _may_match(pattern: str, name: str) -> bool:
    """Whether an ECMA key pattern may match a name (Python's regex reads most; unsure counts as yes)."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True


def _structural(value: Any) -> dict[str, Any]:
    """A container const as structure (so the library's whitespace applies); scalars stay consts."""
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: _structural(v) for k, v in value.items()},
                "required": list(value), "additionalProperties": False}
    if isinstance(value, list):
        return {"type": "array", "prefixItems": [_structural(v) for v in value], "items": False,
                "minItems": len(value), "maxItems": len(value)}
    return {"const": value}


def emit(lowered: dict[str, Any], defs: dict[str, Any], target: str, listed_only: bool = False
         ) -> tuple[dict[str, Any], list[str], str]:
    """(schema for the target, approximation notes, the first place whose enum lost every value or "").
    listed_only: an object with `properties` and no other key rule gets only those keys."""
    emitter = _Emitter(defs, target, listed_only)
    schema = emitter.emit(lowered, "#")
    if defs:
        out_defs = {name: emitter.emit(d, f"#/$defs/{name}") for name, d in defs.items()}
        out_defs = {k: (False if is_never(v) else v) for k, v in out_defs.items()}
        if is_never(schema):
            return schema, emitter.notes, emitter.empty_enum
        schema = {**schema, "$defs": out_defs} if "$ref" not in schema or len(schema) > 1 else \
            {"$ref": schema["$ref"], "$defs": out_defs}
    return schema, emitter.notes, emitter.empty_enum
