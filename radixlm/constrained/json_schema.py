"""JSON schema: limits and (lenient) meta-schema validation; the outlines backend's schema -> regex.

Runs in compile workers (all of it may be slow on a 64 KiB schema). schema_lower.py lowers the schema
for outlines; outlines-core's build_regex_from_schema converts the result, except what it does not
convert faithfully: those nodes become placeholder consts swapped for our own regexes (string
patterns and formats, numeric bounds, tuples, arrays with bounds, key-pattern objects, free values).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError

PARAM = "json_schema"
_DRAFTS = ("Draft7Validator", "Draft6Validator", "Draft4Validator", "Draft201909Validator", "Draft202012Validator")


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
    _check_meta_schema(schema)
    return schema


def _check_meta_schema(schema: dict[str, Any]) -> None:
    """Valid against the meta-schema of any draft: real schemas mix drafts (a draft-4 boolean
    exclusiveMinimum under no $schema, a draft-4 `id`); unknown keywords are fine. Drafts 4-7 are tried
    first: jsonschema checks them in well under a millisecond where 2020-12 ($dynamicRef) takes seconds
    on a 60 KB schema, and the lowering tolerates keywords of a later draft with a wrong shape."""
    import jsonschema

    for name in _DRAFTS:
        cls = getattr(jsonschema, name)
        if cls(cls.META_SCHEMA).is_valid(schema):
            return
    declared = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(declared(declared.META_SCHEMA).iter_errors(schema))
    where = "/".join(str(p) for p in error.absolute_path) or "(root)" if error else "(root)"
    message = error.message if error else "invalid"
    raise _err(f"not a valid JSON schema: {_short(message)} (at {_short(where)})") from None


def schema_to_regex(spec: str, options: GrammarOptions) -> str:
    """The regex a json_schema spec compiles to on the outlines backend, or GrammarError."""
    from radixlm.constrained.schema_lower import lower_schema
    from radixlm.constrained.schema_regex import lowered_to_regex

    return lowered_to_regex(lower_schema(spec, options, "outlines").schema, options)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
