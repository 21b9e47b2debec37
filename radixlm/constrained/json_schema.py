"""JSON schema -> regex: limits, meta-schema validation, keyword checks, local $ref inlining, bounds.

Runs in compile workers (all of it may be slow on a 64 KiB schema). outlines-core's
build_regex_from_schema does the conversion; this module only lets through schemas it converts
faithfully, so every output of the grammar validates against the schema:
  * unknown / unsupported keywords are refused by name (never silently ignored);
  * local $refs are inlined here (outlines-core drops properties past a small ref depth), recursive
    and external ones are refused (nothing is ever fetched);
  * `type: [..]` becomes anyOf; numeric bounds become placeholder consts swapped for our own regexes.
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError
from radixlm.constrained.formats import FORMAT_REGEXES
from radixlm.constrained.number_range import bounded_number_regex

PARAM = "json_schema"
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly", "$defs", "definitions"})
SUPPORTED = frozenset({"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                       "minItems", "maxItems", "enum", "const", "anyOf", "allOf", "$ref", "minLength",
                       "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                       "exclusiveMaximum"})
FORMATS = frozenset(FORMAT_REGEXES)
MAX_INLINED_NODES = 20_000  # inlining a DAG of $refs can grow a schema exponentially
MAX_BOUND = 10**15
FREE_FORM_DEPTH = 1


def _err(message: str, code: str = INVALID_GRAMMAR) -> GrammarError:
    return GrammarError(PARAM, code, message)


def json_depth(text: str) -> int:
    """Bracket nesting depth of a JSON text, counted without parsing (json.loads recurses)."""
    depth = best = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def load_schema(spec: str, options: GrammarOptions) -> dict[str, Any]:
    """Size, depth, JSON syntax and meta-schema checks; returns the parsed schema."""
    if len(spec.encode("utf-8")) > options.max_schema_bytes:
        raise _err(f"schema larger than {options.max_schema_bytes} bytes", GRAMMAR_TOO_LARGE)
    if json_depth(spec) > options.max_schema_depth:
        raise _err(f"schema nesting deeper than {options.max_schema_depth}", GRAMMAR_TOO_LARGE)
    try:
        schema = json.loads(spec)
    except ValueError as e:
        raise _err(f"schema is not valid JSON ({e.msg} at position {e.pos})") from None
    if not isinstance(schema, dict):
        raise _err("schema must be a JSON object")
    import jsonschema

    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise _err(f"not a valid JSON schema: {_short(e.message)} (at {_short(where)})") from None
    return schema


class _Normalizer:
    """Rewrites a schema into the subset outlines-core converts exactly (see module docstring)."""

    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.nodes = 0
        self.nonce = "RADIXLM" + secrets.token_hex(6)
        self.placeholders: dict[str, str] = {}  # placeholder const -> regex

    def run(self, node: Any, path: str, refs: tuple[str, ...]) -> Any:
        self.nodes += 1
        if self.nodes > MAX_INLINED_NODES:
            raise _err(f"schema expands to more than {MAX_INLINED_NODES} nodes", GRAMMAR_TOO_LARGE)
        if node is True:
            return {}
        if not isinstance(node, dict):
            raise _err(f"unsupported schema at {path}: only objects and `true` are supported")
        for key in node:
            if key not in SUPPORTED and key not in ANNOTATIONS:
                raise _err(f"unsupported keyword '{key}' at {path}")
        if "$ref" in node:
            return self._ref(node, path, refs)
        out = {k: v for k, v in node.items() if k not in ANNOTATIONS}
        if "allOf" in out:
            if len(out["allOf"]) != 1 or len(out) != 1:
                raise _err(f"keyword 'allOf' at {path} is only supported alone with a single schema")
            return self.run(out["allOf"][0], f"{path}/allOf/0", refs)
        if isinstance(out.get("type"), list):
            return self._type_list(out, path, refs)
        if out.get("additionalProperties") is True:
            del out["additionalProperties"]  # the default
        if not out:  # any JSON value; containers hold scalars only (a union of deeper ones takes ~5 s)
            return {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null")]
                    + [{"type": t, "depth": 0} for t in ("object", "array")]}
        if out.get("type") in ("object", "array") and not {"properties", "items", "prefixItems",
                                                         "additionalProperties"} & set(out):
            # Free-form objects / arrays: outlines-core nests them 2 levels deep by default, a regex
            # whose DFA takes ~15 s to build; one level (values may be flat objects/arrays) takes 0.3 s.
            out["depth"] = FREE_FORM_DEPTH
        self._check_combinations(out, path)
        self._recurse(out, path, refs)
        if out.get("type") == "string" and not ("enum" in out or "const" in out):
            if "format" in out:
                return self._placeholder('"(?:' + FORMAT_REGEXES[out["format"]] + ')"')
            if "pattern" in out:
                return self._placeholder('"(?:' + _strip_anchors(out["pattern"]) + ')"')
        return self._bounds(out, path)

    def _placeholder(self, regex: str) -> dict[str, Any]:
        """A const that outlines-core turns into a unique literal, swapped for `regex` afterwards."""
        placeholder = f"{self.nonce}N{len(self.placeholders)}"
        self.placeholders[placeholder] = regex
        return {"const": placeholder}

    def _ref(self, node: dict[str, Any], path: str, refs: tuple[str, ...]) -> Any:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _err(f"external $ref '{ref}' at {path} is not supported (only local '#/...' refs)")
        if ref in refs:
            raise _err(f"recursive $ref '{ref}' at {path} is not supported")
        others = [k for k in node if k not in ANNOTATIONS and k != "$ref"]
        if others:
            raise _err(f"keyword '{others[0]}' next to $ref at {path} is not supported")
        target: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise _err(f"$ref '{ref}' at {path} does not resolve")
            target = target[part]
        return self.run(target, ref, refs + (ref,))

    def _type_list(self, node: dict[str, Any], path: str, refs: tuple[str, ...]) -> Any:
        if not node["type"]:
            raise _err(f"empty 'type' list at {path}")
        branches = [{**node, "type": t} for t in node["type"]]
        return self.run({"anyOf": branches}, path, refs)

    def _check_combinations(self, node: dict[str, Any], path: str) -> None:
        # outlines-core picks ONE of these per schema object and ignores the rest.
        picked = [k for k in ("properties", "anyOf", "prefixItems", "enum", "const") if k in node]
        if len(picked) > 1:
            raise _err(f"keyword '{picked[1]}' together with '{picked[0]}' at {path} is not supported")
        if "anyOf" in node and len(node) > 1:  # the branches alone would be generated
            other = next(k for k in node if k != "anyOf")
            raise _err(f"keyword '{other}' together with 'anyOf' at {path} is not supported")
        if node.get("type") == "string" and ("minLength" in node or "maxLength" in node):
            for k in ("pattern", "format"):
                if k in node:
                    raise _err(f"keyword '{k}' together with minLength/maxLength at {path} is not supported")
        if "pattern" in node and "format" in node:
            raise _err(f"keyword 'pattern' together with 'format' at {path} is not supported")
        if "format" in node and node["format"] not in FORMATS:
            raise _err(f"unsupported format '{node['format']}' at {path} (supported: {sorted(FORMATS)})")
        if isinstance(node.get("items"), list):
            raise _err(f"keyword 'items' as a list at {path} is not supported (use prefixItems)")
        if "prefixItems" in node:
            n = len(node["prefixItems"])
            if node.get("minItems", 0) > n or node.get("maxItems", n) < n or "items" in node:
                raise _err(f"keyword 'prefixItems' with items/minItems/maxItems at {path} is not supported")
        required = node.get("required", [])
        missing = [r for r in required if r not in node.get("properties", {})]
        if missing:
            raise _err(f"required property '{missing[0]}' at {path} is not in 'properties'")

    def _recurse(self, node: dict[str, Any], path: str, refs: tuple[str, ...]) -> None:
        if "properties" in node:
            node["properties"] = {k: self.run(v, f"{path}/properties/{k}", refs)
                                  for k, v in node["properties"].items()}
            node.pop("additionalProperties", None)  # only listed properties are generated
        for key in ("anyOf", "prefixItems"):
            if key in node:
                node[key] = [self.run(v, f"{path}/{key}/{i}", refs) for i, v in enumerate(node[key])]
        if isinstance(node.get("items"), (dict, bool)):
            node["items"] = self.run(node["items"], f"{path}/items", refs)
        extra = node.get("additionalProperties")
        if extra is False and node.get("type") == "object":
            node.clear()
            node["const"] = {}  # no properties and none allowed: only `{}`
        elif isinstance(extra, dict):
            node["additionalProperties"] = self.run(extra, f"{path}/additionalProperties", refs)

    def _bounds(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        if not any(k in node for k in keys) or "enum" in node or "const" in node:
            return node
        kind = node.get("type")
        if kind not in ("integer", "number"):
            raise _err(f"numeric bounds at {path} need type integer or number")
        lo, lo_excl = _bound(node, "minimum", "exclusiveMinimum", max, kind, path)
        hi, hi_excl = _bound(node, "maximum", "exclusiveMaximum", min, kind, path)
        regex = bounded_number_regex(lo, lo_excl, hi, hi_excl, kind == "integer")
        if regex is None:
            raise _err(f"numeric bounds at {path} admit no value")
        return self._placeholder(regex)


def _strip_anchors(pattern: str) -> str:
    """JSON Schema patterns search; we generate full matches, which satisfy `^...$` either way."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    return pattern


def _bound(node: dict[str, Any], incl: str, excl: str, pick: Any, kind: str, path: str) -> tuple[int | None, bool]:
    """The tighter of the inclusive / exclusive bound as (integer value, exclusive?)."""
    cands = []
    for key, is_excl in ((incl, False), (excl, True)):
        if key not in node:
            continue
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) > MAX_BOUND:
            raise _err(f"keyword '{key}' at {path} must be a number within ±{MAX_BOUND}")
        if not float(value).is_integer():
            if kind == "number":
                raise _err(f"non-integer '{key}' on a number at {path} is not supported")
            # Integers: a fractional bound is the same as the next integer inwards, inclusive.
            value, is_excl = (math.ceil(value) if pick is max else math.floor(value)), False
        cands.append((int(value), is_excl))
    if not cands:
        return None, False
    # max for lower bounds, min for upper; on a tie the exclusive one is tighter.
    best = pick(cands, key=lambda c: (c[0], c[1] if pick is max else not c[1]))
    return best


def schema_to_regex(spec: str, options: GrammarOptions) -> str:
    """The regex a json_schema spec compiles to, or GrammarError."""
    schema = load_schema(spec, options)
    norm = _Normalizer(schema)
    normalized = norm.run(schema, "#", ())
    from outlines_core.json_schema import build_regex_from_schema

    try:
        ws = options.effective_whitespace
        text = json.dumps(normalized)
        regex = build_regex_from_schema(text, ws) if ws is not None else build_regex_from_schema(text)
    except (ValueError, TypeError) as e:
        raise _err(f"cannot convert schema: {_short(str(e))}") from None
    for placeholder, sub in norm.placeholders.items():
        regex = regex.replace(f'"{placeholder}"', f"(?:{sub})")
    return regex


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
