"""Deferred schema lowering: Lark `%json` bodies that the compile worker lowers, not the process that wrote them.

Runs in any process that builds Lark text (the HTTP process for tools and response_format, SamplingParams for
structural_tag: `deferred`) and in compile workers (llguidance_compile.py: `expand`). Lowering a schema
(schema_lower.py) can take exponential time (an `allOf` of many `anyOf`s), so the text builders only wrap
the client's schema; the worker lowers it under the compile deadline, where it can be killed, and an error
names the request field the schema came from (`param`) and where in it (`where`).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import INVALID_GRAMMAR, GrammarError

_KEY = "x-radixlm-lower"
MARKER = '%json {"' + _KEY + '": '
# Canonical JSON (no free whitespace): the model cannot loop on spaces or newlines inside a value.
CANONICAL = {"lenient": True, "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def deferred(schema: Any, param: str, where: str = "", listed_only: bool = False) -> str:
    """Lark for one JSON value matching `schema` (canonical JSON), lowered later by the compile worker.
    listed_only: an object listing `properties` takes only those (tool arguments)."""
    job = {"param": param, "where": where, "listed_only": listed_only}
    return MARKER + json.dumps(job) + ", " + json.dumps({"schema": schema})[1:]


def deferred_param(lark: str) -> str | None:
    """The request field of the text's first deferred body (what a timeout names), or None."""
    start = lark.find(MARKER)
    if start < 0:
        return None
    try:
        job, _ = json.JSONDecoder().raw_decode(lark, start + len(MARKER))
    except ValueError:
        return None
    return str(job.get("param")) if isinstance(job, dict) and job.get("param") else None


def expand(lark: str, options: GrammarOptions) -> str:
    """The Lark text with every deferred body lowered (GrammarError naming its field if one cannot be)."""
    if MARKER not in lark:
        return lark
    decoder, pieces, pos = json.JSONDecoder(), [], 0
    while (start := lark.find(MARKER, pos)) >= 0:
        try:
            body, end = decoder.raw_decode(lark, start + len("%json "))
        except ValueError:
            raise GrammarError("ebnf", INVALID_GRAMMAR, "malformed deferred %json body") from None
        pieces += [lark[pos:start], "%json ", json.dumps(_lowered(body, options))]
        pos = end
    return "".join(pieces) + lark[pos:]


def _lowered(body: Any, options: GrammarOptions) -> dict[str, Any]:
    from radixlm.constrained.llguidance_compile import external_ref
    from radixlm.constrained.schema_lower import lower_schema

    job = body.get(_KEY) if isinstance(body, dict) else None
    if not isinstance(job, dict) or "schema" not in body:
        raise GrammarError("ebnf", INVALID_GRAMMAR, "malformed deferred %json body")
    param, where = str(job.get("param", "ebnf")), str(job.get("where", ""))
    try:
        schema = dict(lower_schema(json.dumps(body["schema"]), options, "llguidance",
                                   bool(job.get("listed_only"))).schema)
    except GrammarError as e:
        raise GrammarError(param, e.code, where + e.message) from None
    ref = external_ref(schema)
    if ref is not None:
        raise GrammarError(param, INVALID_GRAMMAR, f"{where}external $ref '{ref[:100]}' is not supported")
    schema["x-guidance"] = CANONICAL
    return schema
