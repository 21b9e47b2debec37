"""Validate a finished JSON-schema output with `jsonschema`, the reference validator.

Runs where responses are assembled: in the server, in check workers under a deadline (check_pool.py: a
hostile `pattern` can backtrack for minutes, a large schema's validator takes seconds to build); in the
Engine's user process, inline. The grammar enforces most of a schema while decoding, but some keywords
only approximately (`oneOf` exclusivity, `uniqueItems` on free values, look-around in `pattern`s, ...), and
an output cut by `max_new_tokens` is only a valid prefix. So every finished constrained output is checked
here, and a failure is reported instead of invalid JSON being returned as if it were valid.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock
from typing import Any

_MAX_CACHED = 64  # validators keyed by spec text: identical schemas are the common case in serving
_validators: OrderedDict[str, Any] = OrderedDict()
_lock = Lock()


@dataclass(frozen=True)
class JsonCheck:
    valid: bool | None  # None: unchecked (the check did not finish within its time budget, check_pool.py)
    error: str | None = None  # why not: "incomplete", "not JSON", the first schema violation, or "unchecked: ..."

    def to_json(self) -> bytes:
        return json.dumps({"valid": self.valid, "error": self.error}).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> "JsonCheck":
        d = json.loads(data)
        valid = d.get("valid")
        return cls(valid if isinstance(valid, bool) else None, d.get("error"))

    def to_meta(self) -> dict[str, Any]:
        """The meta_info fields (native API) for this check."""
        meta: dict[str, Any] = {"json_schema_valid": self.valid}
        if self.error is not None:
            meta["json_schema_error"] = self.error
        return meta


def check_json_output(spec: str, text: str, complete: bool) -> JsonCheck:
    """`complete` is False when the output was cut (finish reason `length`): a prefix, never valid."""
    if not complete:
        return JsonCheck(False, "incomplete: the output ended (max_new_tokens) before the JSON value was complete")
    try:
        value = json.loads(text)
    except ValueError as e:
        return JsonCheck(False, f"not JSON: {_short(str(e))}")
    validator = _validator(spec)
    if validator is None:  # the schema itself did not load (the grammar compiled, so this is unexpected)
        return JsonCheck(False, "the schema could not be loaded for validation")
    try:
        error = next(iter(validator.iter_errors(value)), None)
    except Exception as e:  # noqa: BLE001 - an unresolvable $ref or a validator bug must not fail the request
        return JsonCheck(False, f"validation failed: {_short(type(e).__name__ + ': ' + str(e))}")
    if error is None:
        return JsonCheck(True)
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return JsonCheck(False, f"{_short(error.message)} (at {_short(where)})")


def check_serialized(kind: str, spec: str, options: Any, payload: bytes) -> bytes:
    """Check-worker entry point (check_pool.py): spec is JSON {"schema", "text", "complete"}."""
    job = json.loads(spec)
    return check_json_output(str(job["schema"]), str(job["text"]), bool(job["complete"])).to_json()


def _validator(spec: str) -> Any:
    with _lock:
        if spec in _validators:
            _validators.move_to_end(spec)
            return _validators[spec]
    validator = _build(spec)
    with _lock:
        _validators[spec] = validator
        while len(_validators) > _MAX_CACHED:
            _validators.popitem(last=False)
    return validator


def _build(spec: str) -> Any:
    import jsonschema

    try:
        schema = json.loads(spec)
    except ValueError:
        return None
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict):
        return None
    from radixlm.constrained.schema_refs import rebase_bundled_refs

    draft = _draft_of(schema)
    # Refs the grammar resolved against the root of a bundled schema are read the same way here.
    schema = rebase_bundled_refs(schema, "id" if draft is jsonschema.Draft4Validator else "$id")
    cls = jsonschema.validators.extend(draft, {"pattern": _ecma_pattern})
    # The format checker asserts the formats jsonschema can check (date, email, ipv4, uuid, ...); formats it
    # cannot check pass. No retrieval of remote refs: `referencing` has none unless one is configured.
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _draft_of(schema: dict[str, Any]) -> Any:
    """The draft `$schema` names; without one, draft 7 if its meta-schema accepts the schema, else draft 4
    (a boolean `exclusiveMaximum`), else 2020-12. Draft 7 ignores later keywords and `$ref` siblings, so it
    never calls valid output invalid where the schema's author meant a later draft (the grammar enforces
    those keywords anyway); and its meta-schema check takes well under a millisecond, where 2020-12's
    ($dynamicRef) takes seconds on a large schema, and this runs where responses are assembled."""
    import jsonschema

    if "$schema" in schema:
        return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    for cls in (jsonschema.Draft7Validator, jsonschema.Draft4Validator):
        if cls(cls.META_SCHEMA).is_valid(schema):
            return cls
    return jsonschema.Draft202012Validator


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """`pattern` is an ECMA-262 regex (JSON Schema says so): `\\p{L}`, `\\cA`, `(?<n>)`, ... mean what they
    mean in JavaScript. regress is a real ECMA-262 engine; Python's re is a fallback for what it refuses."""
    import re

    import regress
    from jsonschema.exceptions import ValidationError

    if not isinstance(instance, str):
        return
    try:
        found = regress.Regex(pattern, "u").find(instance) is not None
    except Exception:  # noqa: BLE001 - a pattern regress refuses (rare): Python's dialect is close
        found = re.search(pattern, instance) is not None
    if not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
