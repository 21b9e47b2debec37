"""Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (the tag is a special token, so it may be
missing from decoded text: a bare leading JSON array of calls is accepted too)."""

from __future__ import annotations

from radixlm.tools.parsers.base import ParsedCall, ToolFormat, call_object, decode_at

FORMAT = ToolFormat(name="mistral", trigger="[TOOL_CALLS]", open="[TOOL_CALLS][", call_open="", call_close="",
                    sep=", ", close="]")
_TAG = "[TOOL_CALLS]"


def parse(text: str) -> list[ParsedCall]:
    start = text.find(_TAG)
    if start < 0:
        start = len(text) - len(text.lstrip())
        if not text.startswith("[", start):
            return []
        pos = start
    else:
        pos = start + len(_TAG)
    got = decode_at(text, pos)
    if got is None or not isinstance(got[0], list) or not got[0]:
        return []
    end = got[1]
    body_start = text.index("[", pos) + 1
    calls, cursor, span_start = [], body_start, start
    for k in range(len(got[0])):
        one = call_object(text, cursor)
        if one is None:
            return []
        name, args, stop = one
        rest = text[stop:end].lstrip()
        cursor = end - len(rest) + (1 if rest.startswith(",") else 0)
        # Spans tile [tag, end of array): the separators and brackets belong to the calls.
        calls.append(ParsedCall(name, args, span_start, end if k == len(got[0]) - 1 else cursor))
        span_start = cursor
    return calls
