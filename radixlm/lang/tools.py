"""Tools in the frontend: `gen(..., tools=[...], tool_choice=...)` on every backend.

Runs in the user's process. Text backends (in-process Engine, native HTTP) send the tool grammar as the
request's `ebnf` (the hermes call syntax, guaranteed by the llguidance backend exactly as on /v1) and parse
the output; the OpenAI backend passes `tools` / `tool_choice` to the server and reads `message.tool_calls`.
Either way the gen's meta_info carries `tool_calls`: [{"id", "name", "arguments": dict}]. A program runs
its own tool loop with them (docs/frontend.md-style example in docs/server.md, "Tool calling").
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.base import GrammarOptions


def _request(tools: Any, tool_choice: Any, parallel: bool = True) -> Any:
    from radixlm.tools.spec import parse_tool_request

    return parse_tool_request({"tools": list(tools), "tool_choice": tool_choice, "parallel_tool_calls": parallel})


def check_tools(tools: Any, tool_choice: Any) -> tuple[tuple[dict[str, Any], ...], Any]:
    """Validate at the program line (the same rules as /v1); returns (tools, tool_choice) as sent."""
    _request(tools, tool_choice)
    return tuple(tools), tool_choice


def tool_params(tools: Any, tool_choice: Any, stop_regex: Any = None) -> dict[str, Any]:
    """The native sampling params that make the gen's calls well-formed: the Lark grammar as `ebnf`, and the
    gen's own stop_regex plus the one that ends the calls where the model writes on past them ({} for
    tool_choice none)."""
    from radixlm.tools.grammar import tool_grammar, with_trailer_stop
    from radixlm.tools.parsers import hermes

    grammar = tool_grammar(_request(tools, tool_choice), hermes.FORMAT, GrammarOptions())
    if grammar is None:
        return {}
    return {"ebnf": grammar, **with_trailer_stop({"stop_regex": stop_regex}, hermes.FORMAT)}


def tools_prompt(tools: Any) -> str:
    """The default hermes-style tool prompt (put it in the system message of a text-backend program)."""
    from radixlm.tools.prompt import DEFAULT_TOOL_PROMPT
    from radixlm.tools.spec import parse_tool_request

    req = parse_tool_request({"tools": list(tools)})
    listing = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in req.tools)
    return DEFAULT_TOOL_PROMPT.format(tools=listing)


def parse_tool_calls(text: str, tools: Any, tool_choice: Any) -> list[dict[str, Any]]:
    """The calls in a text-backend output whose arguments validate (others stay text)."""
    from radixlm.constrained.validate import check_json_output
    from radixlm.tools.parsers import fallback
    from radixlm.tools.stream import call_id

    req = _request(tools, tool_choice)
    callable_tools = {t.name: t for t in req.callable_tools()}
    calls = []
    for call in fallback.parse(text):
        tool = callable_tools.get(call.name)
        if tool is not None and check_json_output(json.dumps(tool.parameters), call.arguments, True).valid:
            calls.append({"id": call_id(), "name": call.name, "arguments": json.loads(call.arguments)})
    return calls


def openai_tool_calls(message: Any) -> list[dict[str, Any]]:
    """An OpenAI client message's tool_calls in the frontend's shape (arguments as dicts)."""
    out = []
    for call in getattr(message, "tool_calls", None) or []:
        try:
            args = json.loads(call.function.arguments or "{}")
        except ValueError:
            continue
        out.append({"id": call.id, "name": call.function.name, "arguments": args})
    return out
