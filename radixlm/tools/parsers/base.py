"""What every tool-call family shares: its call syntax (ToolFormat, used by grammar.py and the prompt) and
the parsed-call type; JSON helpers that return raw text spans, so a call's `arguments` is exactly the text
the model wrote (streamed deltas then concatenate to the same string).

Runs in the HTTP process. Parsers never raise on model output: text that is not a well-formed call stays
plain content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")


@dataclass(frozen=True)
class ToolFormat:
    """A family's output syntax: open + call_open J call_close (sep call_open J call_close)* + close, where
    J = {"name": ..., args_key: {...}}. `trigger` starts a call group in free text (a prefix of
    open + call_open), the point after which tool_choice=auto constrains the rest."""

    name: str
    trigger: str
    open: str
    call_open: str
    call_close: str
    sep: str
    close: str
    args_key: str = "arguments"

    @property
    def group_open(self) -> str:
        return self.open + self.call_open


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object
    start: int  # the span of the whole call in the parsed text (content is what lies outside calls)
    end: int


Parser = Callable[[str], list[ParsedCall]]


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """(value, end) of the JSON value starting at pos (after whitespace), or None."""
    pos = _WS.match(text, pos).end()
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError:
        return None


def call_object(text: str, pos: int, keys: tuple[str, ...] = ("arguments", "parameters")
                ) -> tuple[str, str, int] | None:
    """(name, arguments text, end) of a {"name": str, "arguments"|"parameters": {...}} object at pos."""
    start = _WS.match(text, pos).end()
    got = decode_at(text, start)
    if got is None or not isinstance(got[0], dict) or not isinstance(got[0].get("name"), str):
        return None
    obj, end = got
    key = next((k for k in keys if k in obj), None)
    if key is None:
        return None
    value = obj[key]
    if isinstance(value, str):  # some models stringify the arguments
        try:
            value_obj = json.loads(value)
        except ValueError:
            return None
        return (obj["name"], value, end) if isinstance(value_obj, dict) else None
    if not isinstance(value, dict):
        return None
    return obj["name"], _raw_value(text, start, end, key, value), end


def _raw_value(text: str, start: int, end: int, key: str, value: dict[str, Any]) -> str:
    """The model's own text of obj[key] within text[start:end] (re-serialized if it cannot be found)."""
    for m in re.finditer(r'"%s"\s*:\s*' % re.escape(key), text[start:end]):
        got = decode_at(text, start + m.end())
        if got is not None and got[0] == value:
            return text[start + m.end():got[1]]
    return json.dumps(value, ensure_ascii=False)


def content_outside(text: str, calls: list[ParsedCall]) -> str:
    """The text with every call's span removed (stripped), i.e. the message's plain content."""
    pieces, pos = [], 0
    for call in sorted(calls, key=lambda c: c.start):
        pieces.append(text[pos:call.start])
        pos = call.end
    pieces.append(text[pos:])
    return "".join(pieces).strip()
