"""A tool request -> the llguidance Lark grammar (the `ebnf` kind) that makes every call well-formed.

Runs in the HTTP process (pure text building; the scheduler's compile workers compile it). Each call is
the family's literal wrapper around `%json {parameters}`, so the arguments always match the tool's schema
(lowered by radixlm.constrained exactly as for response_format); the function name is a literal of the
request's tools. `required` / named: the whole output is calls. `auto`: free text until the family's
trigger (an llguidance lazy lexeme: it ends the text at the trigger's first occurrence), then the rest of
the call group is constrained; after the last call only EOS is allowed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GrammarError
from radixlm.errors import InvalidRequestError
from radixlm.tools.parsers.base import ToolFormat
from radixlm.tools.spec import ToolRequest, ToolSpec

# Canonical JSON inside calls: the model cannot loop on whitespace, and json.dumps's separators match.
_JSON_STYLE = {"lenient": True, "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Lark's regex `.` excludes newlines; text before a call may hold any character.
_TEXT = r"TEXT: /(.|\n)*/"


def lowered_parameters(tool: ToolSpec, options: GrammarOptions) -> dict[str, Any]:
    """The tool's parameter schema as the llguidance backend compiles response_format schemas; 400 if bad."""
    from radixlm.constrained.llguidance_compile import external_ref
    from radixlm.constrained.schema_lower import lower_schema

    try:
        schema = dict(lower_schema(json.dumps(tool.parameters), options, "llguidance").schema)
    except GrammarError as e:
        raise InvalidRequestError(f"tools: function {tool.name!r}: {e.message}", param="tools", code=e.code) from None
    ref = external_ref(schema)
    if ref is not None:
        raise InvalidRequestError(f"tools: function {tool.name!r}: external $ref '{ref[:100]}' is not supported",
                                  param="tools", code="invalid_grammar")
    schema["x-guidance"] = _JSON_STYLE
    return schema


def literal(text: str, special_tokens: Iterable[str] = ()) -> str:
    """Lark for an exact text; special-token strings become token references (they are not bytes)."""
    specials = sorted((s for s in special_tokens if s and s in text), key=len, reverse=True)
    if not specials:
        return json.dumps(text) if text else ""
    pieces = re.split("(" + "|".join(re.escape(s) for s in specials) + ")", text)
    return " ".join(p if p in specials else json.dumps(p) for p in pieces if p)


def _call_rules(req: ToolRequest, fmt: ToolFormat, options: GrammarOptions, specials: list[str]) -> list[str]:
    """call_body_i: one call of tool i without call_open (auto's first call has its open in the trigger)."""
    rules, names = [], []
    for i, tool in enumerate(req.callable_tools()):
        head = '{"name": %s, "%s": ' % (json.dumps(tool.name), fmt.args_key)
        schema = json.dumps(lowered_parameters(tool, options))
        rules.append(f'call_body_{i}: {literal(head)} %json {schema} "}}" {literal(fmt.call_close, specials)}')
        names.append(f"call_body_{i}")
    rules.append("call_body: " + " | ".join(names))
    rules.append(f"call: {literal(fmt.call_open, specials)} call_body")
    return rules


def _group_tail(req: ToolRequest, fmt: ToolFormat, specials: list[str]) -> str:
    more = f"({literal(fmt.sep, specials)} call)*" if req.parallel else ""
    return f"{more} {literal(fmt.close, specials)}".strip()


def tool_grammar(req: ToolRequest, fmt: ToolFormat, options: GrammarOptions, special_tokens: Iterable[str] = ()
                 ) -> str | None:
    """The Lark grammar for this request, or None when nothing is constrained (tool_choice none)."""
    if req.mode == "none" or not req.callable_tools():
        return None
    specials = list(special_tokens)
    lines = ["%llguidance {}", *_call_rules(req, fmt, options, specials)]
    tail = _group_tail(req, fmt, specials)
    if req.mode == "auto":
        rest = fmt.group_open[len(fmt.trigger):]
        lines += ["start: TEXT | trigger group_rest",
                  f"trigger[lazy]: TEXT {literal(fmt.trigger, specials)}",
                  f"group_rest: {literal(rest, specials)} call_body {tail}", _TEXT]
    else:
        lines += [f"start: {literal(fmt.open, specials)} call {tail}"]
    return "\n".join(lines) + "\n"
