"""A tool request -> the llguidance Lark grammar (the `ebnf` kind) that makes every call well-formed.

Runs in the HTTP process (pure text building; the scheduler's compile workers compile it). Each call is
the family's literal wrapper around `%json {parameters}`, so the arguments always match the tool's schema
(lowered exactly as for response_format, by the compile worker under its deadline: constrained/deferred_json.py);
the function name is a literal of the
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
from radixlm.sampling_params import MAX_STOP_STRINGS
from radixlm.tools.parsers.base import ToolFormat
from radixlm.tools.spec import ToolRequest, ToolSpec

# Lark's regex `.` excludes newlines; text before a call may hold any character.
_TEXT = r"TEXT: /(.|\n)*/"


def lowered_parameters(tool: ToolSpec, options: GrammarOptions, listed_only: bool = False) -> dict[str, Any]:
    """The tool's parameter schema as the llguidance backend compiles response_format schemas; 400 if bad.
    listed_only (tool calls): an object listing `properties` takes only those, so no undeclared argument
    (a handler's `f(**args)` fails on one; OpenAI's strict mode and xgrammar do the same). Lowering can take
    exponential time: grammars sent to a server use deferred_parameters, which the compile worker lowers."""
    from radixlm.constrained.deferred_json import CANONICAL
    from radixlm.constrained.llguidance_compile import external_ref
    from radixlm.constrained.schema_lower import lower_schema

    try:
        schema = dict(lower_schema(json.dumps(tool.parameters), options, "llguidance", listed_only).schema)
    except GrammarError as e:
        raise InvalidRequestError(f"tools: function {tool.name!r}: {e.message}", param="tools", code=e.code) from None
    ref = external_ref(schema)
    if ref is not None:
        raise InvalidRequestError(f"tools: function {tool.name!r}: external $ref '{ref[:100]}' is not supported",
                                  param="tools", code="invalid_grammar")
    schema["x-guidance"] = CANONICAL
    return schema


def deferred_parameters(tool: ToolSpec, param: str = "tools", listed_only: bool = False) -> str:
    """Lark `%json` for the tool's arguments, lowered (as lowered_parameters does) by the compile worker,
    under its deadline: not on the HTTP process's threads."""
    from radixlm.constrained.deferred_json import deferred

    where = f"function {tool.name!r}: " if param == "tools" else ""
    return deferred(tool.parameters, param, where, listed_only)


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
        body = deferred_parameters(tool, listed_only=True)
        rules.append(f'call_body_{i}: {literal(head)} {body} "}}" {literal(fmt.call_close, specials)}')
        names.append(f"call_body_{i}")
    rules.append("call_body: " + " | ".join(names))
    rules.append(f"call: {literal(fmt.call_open, specials)} call_body")
    return rules


def trailer_stop(fmt: ToolFormat) -> str | None:
    r"""The stop_regex that ends a call group where the model, after a call, writes anything but another
    call: whitespace, then a character that cannot start the next call's tag (the text is trimmed; the
    calls stand). Only families whose calls end in a tag holding a raw newline (hermes: `\n</tool_call>`):
    canonical JSON has no raw newline, so the tag cannot occur inside arguments."""
    if "\n" not in fmt.call_close:
        return None
    return rf"(?<={_escaped(fmt.call_close)})[ \t\r\n]*[^ \t\r\n{_escaped(_next_call_start(fmt))}]"


def with_trailer_stop(params: dict[str, Any], fmt: ToolFormat) -> dict[str, Any]:
    """{"stop_regex": the request's own + trailer_stop} for a constrained tool request ({} if none)."""
    stop = trailer_stop(fmt)
    if stop is None:
        return {}
    own = params.get("stop_regex") or []
    own = [own] if isinstance(own, str) else list(own)
    if len(own) >= MAX_STOP_STRINGS:
        raise InvalidRequestError(f"at most {MAX_STOP_STRINGS - 1} stop regexes with tools (the tool-call "
                                  "grammar adds one)", param="stop_regex")
    return {"stop_regex": [*own, stop]}


def _next_call_start(fmt: ToolFormat) -> str:
    return (fmt.sep + fmt.call_open).strip()[:1]


def _escaped(text: str) -> str:
    r"""re.escape, with a newline written as \n (a stop_regex and a Lark regex both read it)."""
    return re.escape(text).replace("\\\n", "\\n")


def _trailer_lexeme(fmt: ToolFormat) -> str:
    """Lark for what trailer_stop matches (then any text), or bare whitespace before EOS."""
    first = _escaped(_next_call_start(fmt))
    return rf"TRAILER: /[ \t\r\n]+|[ \t\r\n]*[^ \t\r\n{first}](.|\n)*/"


def _group_tail(req: ToolRequest, fmt: ToolFormat, specials: list[str]) -> str:
    more = f"({literal(fmt.sep, specials)} call)*" if req.parallel else ""
    trailer = " TRAILER?" if trailer_stop(fmt) else ""
    return f"{more} {literal(fmt.close, specials)}{trailer}".strip()


def tool_grammar(req: ToolRequest, fmt: ToolFormat, options: GrammarOptions, special_tokens: Iterable[str] = ()
                 ) -> str | None:
    """The Lark grammar for this request, or None when nothing is constrained (tool_choice none)."""
    if req.mode == "none" or not req.callable_tools():
        return None
    specials = list(special_tokens)
    lines = ["%llguidance {}", *_call_rules(req, fmt, options, specials)]
    tail = _group_tail(req, fmt, specials)
    if trailer_stop(fmt):
        lines.append(_trailer_lexeme(fmt))
    if req.mode == "auto":
        rest = fmt.group_open[len(fmt.trigger):]
        lines += ["start: TEXT | trigger group_rest",
                  f"trigger[lazy]: TEXT {literal(fmt.trigger, specials)}",
                  f"group_rest: {literal(rest, specials)} call_body {tail}", _TEXT]
    else:
        lines += [f"start: {literal(fmt.open, specials)} call {tail}"]
    return "\n".join(lines) + "\n"
