"""Growing output text -> OpenAI streaming deltas: `content` before the calls, then for each call one delta
with its id and name and deltas that extend `function.arguments` (OpenAI's streaming shape).

Runs in the HTTP process. Only grammar-constrained calls stream their arguments as they grow: the grammar
guarantees the text after the trigger is a well-formed call, so nothing sent needs taking back. Calls of an
unconstrained request are held until the output ends and sent whole after the parser has accepted them.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Callable

from radixlm.tools.parsers.base import ParsedCall, ToolFormat, content_outside, decode_at


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _held_prefix(text: str, trigger: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of trigger (it may become the trigger)."""
    for k in range(min(len(trigger) - 1, len(text)), 0, -1):
        if text.endswith(trigger[:k]):
            return k
    return 0


class ToolStream:
    """Per choice: feed(text so far) -> delta dicts; finish(text, calls) -> the deltas still owed."""

    def __init__(self, fmt: ToolFormat, constrained: bool, accept: Callable[[str], list[ParsedCall]]):
        self._fmt, self._constrained, self._accept = fmt, constrained, accept
        self._head = re.compile(r'\{"name": "((?:[^"\\]|\\.)*)", "%s": ' % re.escape(fmt.args_key))
        self._sent_content = 0  # characters of text sent as content
        self._group = -1  # where the call group starts in text (-1: not seen yet)
        self._pos = 0  # where to look for the next call's head
        self._args_start = -1  # start of the open call's arguments (-1: none open)
        self._args_sent = 0
        self.num_calls = 0

    def feed(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._group < 0:
            found = text.find(self._fmt.trigger, self._sent_content)
            end = found if found >= 0 else len(text) - _held_prefix(text, self._fmt.trigger)
            if end > self._sent_content:
                out.append({"content": text[self._sent_content:end]})
                self._sent_content = end
            if found < 0:
                return out
            self._group = self._pos = found
        if self._constrained:
            out += self._calls(text)
        return out

    def _calls(self, text: str) -> list[dict[str, Any]]:
        out = []
        while True:
            if self._args_start < 0:
                m = self._head.search(text, self._pos)
                if m is None:
                    return out
                out.append(self._tool_delta({"id": call_id(), "type": "function",
                                             "function": {"name": m.group(1), "arguments": ""}}))
                self._args_start, self._args_sent = m.end(), m.end()
            got = decode_at(text, self._args_start)
            end = got[1] if got is not None else len(text)
            if end > self._args_sent:
                out.append(self._tool_delta({"function": {"arguments": text[self._args_sent:end]}}))
                self._args_sent = end
            if got is None:
                return out
            self._pos, self._args_start = end, -1
            self.num_calls += 1

    def _tool_delta(self, call: dict[str, Any]) -> dict[str, Any]:
        index = self.num_calls
        return {"tool_calls": [{"index": index, **call}]}

    def finish(self, text: str) -> list[dict[str, Any]]:
        """At the end of the output: an unconstrained request's calls (whole) and any content after them."""
        if self._group < 0:
            rest = text[self._sent_content:]
            return [{"content": rest}] if rest else []
        if self._constrained:
            if self._args_start >= 0:  # cut inside a call (max_tokens): it stays the partial call it is
                self.num_calls += 1
            return []
        calls = self._accept(text)
        out = [{"content": c} for c in [content_outside(text[self._group:], [
            ParsedCall(c.name, c.arguments, c.start - self._group, c.end - self._group) for c in calls
            if c.start >= self._group])] if c]
        for call in calls:
            out.append(self._tool_delta({"id": call_id(), "type": "function",
                                         "function": {"name": call.name, "arguments": call.arguments}}))
            self.num_calls += 1
        return out


def assemble_calls(deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A message's `tool_calls` from a stream's deltas: each call's arguments concatenated, as a client
    assembling the stream would have them."""
    calls: list[dict[str, Any]] = []
    for delta in deltas:
        for part in delta.get("tool_calls", ()):
            if part["index"] == len(calls):
                calls.append({"id": part["id"], "type": "function",
                              "function": {"name": part["function"]["name"], "arguments": ""}})
            calls[part["index"]]["function"]["arguments"] += part["function"].get("arguments", "")
    return calls
