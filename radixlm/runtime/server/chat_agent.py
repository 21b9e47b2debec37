"""The agent layer of /v1/chat/completions: tool calling (tools/) and reasoning separation (reasoning.py)
applied to one request: its prompt, its sampling params, and its finished or streamed choices.

Runs in the HTTP process. A request with neither tools nor a reasoning parser passes through unchanged.
Nothing here runs unbounded work on the event loop: schemas go into grammars unlowered (the compile worker
lowers them) and output checks run in check workers, awaited through the request handle (settle).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Iterator

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.check_pool import check_blocking, shared_checker
from radixlm.constrained.validate import JsonCheck
from radixlm.runtime.server.reasoning import PARSERS, ReasoningParser, ReasoningStream
from radixlm.tools.grammar import deferred_parameters
from radixlm.tools.plan import GRAMMAR_BACKEND, ToolPlan, plan_tools
from radixlm.tools.spec import ToolSpec


class ChatAgent:
    def __init__(self, obj: dict[str, Any], tokenizer: Any, config: Any, grammar_config: Any):
        self._backend = grammar_config.grammar_backend
        self._options = GrammarOptions(whitespace_pattern=grammar_config.constrained_json_whitespace_pattern)
        self.tools: ToolPlan | None = plan_tools(obj, tokenizer, config.tool_call_parser, self._backend,
                                                 self._options)
        name = config.reasoning_parser
        self.reasoning: ReasoningParser | None = PARSERS[name] if name else None
        self._schema: str | None = None  # response_format schema this layer validates (see sampling_params)
        # (schema, text) -> JsonCheck run by settle(); shared with the tool plan, which reads it too.
        self._checks: dict[tuple[str, str], JsonCheck] = self.tools.checks if self.tools is not None else {}
        if self.tools is not None or self.reasoning is not None:
            shared_checker()  # its check workers start now, so they are warm when the output is checked

    def render(self, messages: list[dict[str, Any]], tools: Any) -> tuple[list[dict[str, Any]], Any]:
        return self.tools.render(messages) if self.tools is not None else (messages, tools)

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.tools is not None:
            params = self.tools.sampling_params(params)
        if self.reasoning is None or self._backend != GRAMMAR_BACKEND:
            return params  # on other backends a constraint covers the whole output (thinking included)
        if params.get("json_schema") is not None:  # the schema applies to the content after the thought
            self._schema = params.pop("json_schema")
            body = deferred_parameters(ToolSpec("response_format", "", json.loads(self._schema)), "response_format")
            params["ebnf"] = "start: " + body + "\n"  # lowered by the compile worker, under its deadline
        if params.get("ebnf") is not None and (self.tools is not None or self._schema is not None):
            params["ebnf"] = self.reasoning.wrap_grammar(params["ebnf"])
        return params

    # ---- finished choices ------------------------------------------------------------------------
    def finish_choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        message, reason = dict(choice["message"]), choice["finish_reason"]
        text = message["content"]
        if self.reasoning is not None:
            thought, text = self.reasoning.split(text)
            if thought is not None:
                message["reasoning_content"] = thought
        message["content"] = text
        if self.tools is not None:
            tool_message, reason = self.tools.message(text, reason)
            message.update(tool_message)
        choice = {**choice, "message": message, "finish_reason": reason}
        return self._details(choice, message.get("content") or "")

    def settler(self) -> Callable[[str], Awaitable[None]] | None:
        """What the request handle awaits with each finished output (None: this request checks nothing)."""
        return self.settle if self.tools is not None or self._schema is not None else None

    async def settle(self, text: str) -> None:
        """Run the checks a finished output will need (tool-call arguments, response_format content) in the
        check workers, awaited here: the event loop serves other requests meanwhile, and the finishing code
        below finds the results instead of waiting for them."""
        content = self.reasoning.split(text)[1] if self.reasoning is not None else text
        jobs = self.tools.check_jobs(content) if self.tools is not None else []
        if self._schema is not None:
            jobs.append((self._schema, content))
        for schema, value in jobs:
            if (schema, value) not in self._checks:
                self._checks[(schema, value)] = await shared_checker().check_async(schema, value, True)

    def _details(self, choice: dict[str, Any], content: str) -> dict[str, Any]:
        if self._schema is not None:
            complete = choice["finish_reason"] != "length"
            check = self._checks.get((self._schema, content)) if complete else None
            check = check or check_blocking(self._schema, content, complete)
            choice["finish_details"] = {"json_schema_valid": check.valid,
                                        **({"json_schema_error": check.error} if check.error else {})}
        return choice

    def passthrough(self) -> bool:
        return self.tools is None and self.reasoning is None

    def stream(self) -> "ChoiceStream":
        return ChoiceStream(self)


class ChoiceStream:
    """One streamed choice: cumulative output text -> OpenAI chat deltas."""

    def __init__(self, agent: ChatAgent):
        self.agent = agent
        self._thought = ReasoningStream(agent.reasoning) if agent.reasoning is not None else None
        self._tools = agent.tools.stream() if agent.tools is not None else None
        self._sent = 0
        self.content = ""

    def feed(self, text: str, finished: bool) -> Iterator[dict[str, Any]]:
        content = text
        if self._thought is not None:
            thought, content = self._thought.feed(text, finished)
            if thought:
                yield {"reasoning_content": thought}
        self.content = content
        if self._tools is None:
            if len(content) > self._sent:
                yield {"content": content[self._sent:]}
                self._sent = len(content)
            return
        yield from self._tools.feed(content)
        if finished:
            yield from self._tools.finish(content)

    def finish_reason(self, reason: str | None) -> str | None:
        if self._tools is not None and self._tools.num_calls and reason == "stop":
            return "tool_calls"
        return reason

    def details(self, choice: dict[str, Any]) -> dict[str, Any]:
        return self.agent._details(choice, self.content)
