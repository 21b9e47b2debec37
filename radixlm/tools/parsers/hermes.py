"""Hermes / Qwen2.5 / Qwen3 style: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one tag
per call (SGLang's `qwen25`; also the default prompt for templates without tool syntax)."""

from __future__ import annotations

from radixlm.tools.parsers.base import ParsedCall, ToolFormat, call_object

FORMAT = ToolFormat(name="hermes", trigger="<tool_call>", open="", call_open="<tool_call>\n",
                    call_close="\n</tool_call>", sep="\n", close="")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def parse(text: str) -> list[ParsedCall]:
    calls, pos = [], 0
    while (start := text.find(_OPEN, pos)) >= 0:
        got = call_object(text, start + len(_OPEN))
        if got is None:  # not a call: leave it as text and look for the next tag
            pos = start + len(_OPEN)
            continue
        name, args, end = got
        rest = text[end:].lstrip()
        if rest.startswith(_CLOSE):
            end = len(text) - len(rest) + len(_CLOSE)
        elif rest:  # something other than the closing tag follows the object: not a call
            pos = start + len(_OPEN)
            continue
        calls.append(ParsedCall(name, args, start, end))
        pos = end
    return calls
