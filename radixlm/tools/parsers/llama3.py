"""Llama 3.1 / 3.2 JSON tool calls: `<|python_tag|>`? `{"name": ..., "parameters": {...}}` (`;`-separated
for parallel calls). The whole message is the calls; anything else is plain content."""

from __future__ import annotations

from radixlm.tools.parsers.base import ParsedCall, ToolFormat, call_object

FORMAT = ToolFormat(name="llama3", trigger="<|python_tag|>", open="<|python_tag|>", call_open="", call_close="",
                    sep=";", close="", args_key="parameters")
_TAG = "<|python_tag|>"


def parse(text: str) -> list[ParsedCall]:
    start = len(text) - len(text.lstrip())
    pos = start + len(_TAG) if text.startswith(_TAG, start) else start
    calls: list[ParsedCall] = []
    while True:
        got = call_object(text, pos)
        if got is None:
            return []
        name, args, end = got
        calls.append(ParsedCall(name, args, start if not calls else pos, end))
        rest = text[end:].lstrip()
        if not rest:
            calls[-1] = ParsedCall(name, args, calls[-1].start, len(text))
            return calls
        if not rest.startswith(";"):
            return []
        pos = len(text) - len(rest) + 1
        calls[-1] = ParsedCall(name, args, calls[-1].start, pos)  # the separator belongs to the calls
