"""One chat request's tool handling: the prompt (template or default tool prompt), the grammar added to its
sampling params, and the finished / streamed outputs turned into OpenAI `tool_calls`.

Runs in the HTTP process. Grammar-guaranteed calls need the llguidance backend (its `%json` and lazy
triggers); on another backend `tool_choice: auto` runs unconstrained and is parsed afterwards (a call whose
arguments do not validate stays plain content), and `required` / a named tool are a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.check_pool import check_blocking
from radixlm.constrained.validate import JsonCheck
from radixlm.errors import InvalidRequestError
from radixlm.tools.grammar import tool_grammar, with_trailer_stop
from radixlm.tools.parsers.base import ParsedCall, Parser, ToolFormat, content_outside
from radixlm.tools.parsers.registry import resolve
from radixlm.tools.prompt import default_prompt_messages, template_has_tools
from radixlm.tools.spec import ToolRequest, parse_tool_request
from radixlm.tools.stream import ToolStream, assemble_calls, call_id

GRAMMAR_BACKEND = "llguidance"


@dataclass(frozen=True)
class ToolPlan:
    request: ToolRequest
    fmt: ToolFormat
    parser: Parser
    grammar: str | None  # the Lark grammar sent as the request's `ebnf` (None: unconstrained)
    native_template: bool  # the model's template renders tools itself
    special_trigger: bool  # the family's markers are special tokens: keep them in the decoded text
    # Checks already run, (schema, arguments) -> JsonCheck (ChatAgent.settle awaits them off the loop).
    checks: dict[tuple[str, str], JsonCheck] = field(default_factory=dict, compare=False)

    def render(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """(messages, tools for the template)."""
        shown = self.request.tools if self.request.mode != "none" else ()
        if self.native_template:
            return messages, [t.as_openai() for t in shown] or None
        return default_prompt_messages(messages, shown, self.fmt), None

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.grammar is None:
            return params
        if any(params.get(k) is not None for k in ("json_schema", "regex", "ebnf")):
            raise InvalidRequestError("response_format (or another grammar) cannot be combined with tools "
                                      f"under tool_choice {self.request.mode}", param="response_format")
        extra: dict[str, Any] = {"ebnf": self.grammar, **with_trailer_stop(params, self.fmt)}
        if self.special_trigger:
            extra["skip_special_tokens"] = False
        return {**params, **extra}

    def accepted_calls(self, text: str) -> list[ParsedCall]:
        """Calls of a callable tool whose arguments validate against its schema (others stay content)."""
        if self.request.mode == "none":
            return []
        tools = {t.name: t for t in self.request.callable_tools()}
        calls = []
        for call in self.parser(text):
            tool = tools.get(call.name)
            if tool is not None and self._valid(json.dumps(tool.parameters), call.arguments):
                calls.append(call)
        return calls if self.request.parallel else calls[:1]

    def check_jobs(self, text: str) -> list[tuple[str, str]]:
        """(schema, arguments) of each call in a finished text that accepted_calls will check."""
        if self.request.mode == "none":
            return []
        tools = {t.name: t for t in self.request.callable_tools()}
        return [(json.dumps(tools[c.name].parameters), c.arguments) for c in self.parser(text) if c.name in tools]

    def _valid(self, schema: str, arguments: str) -> bool:
        """Arguments valid for the schema (a result in `checks`, else checked now). A check that ran out of
        time (check_pool.py) passes only grammar-constrained calls (the grammar enforced the schema as far
        as it can)."""
        check = self.checks.get((schema, arguments)) or check_blocking(schema, arguments, True)
        return check.valid is True or (check.valid is None and self.grammar is not None)

    def message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """(the assistant message, finish_reason) of a finished output."""
        if self.grammar is not None and reason == "length" and self.fmt.trigger in text:
            return self._cut_message(text), reason
        calls = self.accepted_calls(text)
        if not calls:
            return {"role": "assistant", "content": text}, reason
        tool_calls = [{"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                      for c in calls]
        if self.grammar is not None:  # after the trigger everything is calls
            content = text[:max(text.find(self.fmt.trigger), 0)].strip() or None
        else:
            content = content_outside(text, calls) or None
        # A cut output (length) keeps its reason, as when streaming: the client sees it was cut.
        return ({"role": "assistant", "content": content, "tool_calls": tool_calls},
                "tool_calls" if reason == "stop" else reason)

    def _cut_message(self, text: str) -> dict[str, Any]:
        """Cut by max_tokens after the trigger: the calls as streaming sends them, the last one partial
        (its arguments as far as they got), and no markup in `content`."""
        stream = self.stream()
        calls = assemble_calls(stream.feed(text) + stream.finish(text))
        content = text[:text.find(self.fmt.trigger)].strip() or None
        return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}

    def stream(self) -> ToolStream:
        return ToolStream(self.fmt, self.grammar is not None, self.accepted_calls)


def _special_tokens(tokenizer: Any) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted({t.content for t in added.values() if getattr(t, "special", False)}
                  | set(getattr(tokenizer, "all_special_tokens", [])))


def plan_tools(obj: dict[str, Any], tokenizer: Any, parser_name: str, grammar_backend: str,
               options: GrammarOptions) -> ToolPlan | None:
    """None for a request without tools; InvalidRequestError (400) for bad tool fields."""
    request = parse_tool_request(obj)
    if request is None:
        return None
    template = getattr(tokenizer, "chat_template", None)
    fmt, parser = resolve(parser_name, template if isinstance(template, str) else None)
    specials = _special_tokens(tokenizer)
    grammar = None
    if grammar_backend == GRAMMAR_BACKEND:
        grammar = tool_grammar(request, fmt, options, specials)
        if grammar is not None and len(grammar.encode("utf-8")) > options.max_schema_bytes:
            raise InvalidRequestError(f"tools: their grammar is larger than {options.max_schema_bytes} bytes",
                                      param="tools", code="grammar_too_large")
    elif request.mode in ("required", "named"):
        raise InvalidRequestError(f"tool_choice {request.mode} needs the llguidance grammar backend (this server "
                                  f"runs {grammar_backend}; start it with --grammar-backend llguidance)",
                                  param="tool_choice", code="invalid_grammar")
    return ToolPlan(request, fmt, parser, grammar, template_has_tools(template if isinstance(template, str) else None),
                    any(s in fmt.group_open for s in specials))
