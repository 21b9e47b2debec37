"""Reasoning separation (`--reasoning-parser`): the `<think>...</think>` block of Qwen3 / DeepSeek-R1 goes
to `message.reasoning_content` (and `delta.reasoning_content` when streaming), the rest stays `content`.

Runs in the HTTP process. qwen3: thinking only when the output opens with `<think>` (or closes a block
the template opened); deepseek-r1: the template opens the block, so text before `</think>` is reasoning
and an output cut before it is all reasoning. A grammar (tools, response_format on llguidance) applies
after the block: wrap_grammar lets the thought run free up to `</think>` (a lazy lexeme).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    starts_inside: bool  # the prompt already opened the block
    start: str = "<think>"
    end: str = "</think>"

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, content) of a finished output."""
        lead = len(text) - len(text.lstrip())
        opened = text.startswith(self.start, lead)
        close = text.find(self.end)
        if close >= 0 and (opened or self.starts_inside or self.start not in text[:close]):
            body = text[lead + len(self.start):close] if opened else text[:close]
            return body.strip(), text[close + len(self.end):].lstrip()
        if opened or self.starts_inside:
            return (text[lead + len(self.start):] if opened else text).strip(), ""
        return None, text

    def wrap_grammar(self, lark: str) -> str:
        """The grammar with a free thought block before it (optional for qwen3, required for deepseek-r1,
        whose prompt opened it)."""
        lines = lark.splitlines()
        k = next(i for i, line in enumerate(lines) if line.startswith("start:"))
        lines[k] = "answer:" + lines[k][len("start:"):]
        # qwen3: a thought must open with <think>, so text that does not is the constrained answer itself.
        opened = "thought" if self.starts_inside else f"{json.dumps(self.start)} thought"
        start = f"start: {opened} THOUGHT_WS answer" + ("" if self.starts_inside else " | answer")
        lines += [start, f'thought[lazy]: THOUGHT "{self.end}"', r"THOUGHT: /(.|\n)*/", r"THOUGHT_WS: /[ \n]*/"]
        return "\n".join(lines) + "\n"


PARSERS = {"qwen3": ReasoningParser("qwen3", starts_inside=False),
           "deepseek-r1": ReasoningParser("deepseek-r1", starts_inside=True)}


class ReasoningStream:
    """Per choice: feed(text so far) -> (reasoning delta, content text so far); partial tags are held back."""

    def __init__(self, parser: ReasoningParser):
        self._p = parser
        self._sent = 0  # characters of the reasoning sent
        self._content_from = -1  # where content starts in text (-1: still thinking or undecided)

    def feed(self, text: str, finished: bool = False) -> tuple[str, str]:
        if self._content_from >= 0:
            return "", text[self._content_from:].lstrip()
        p, lead = self._p, len(text) - len(text.lstrip())
        if not finished and self._sent == 0 and len(text.lstrip()) < len(p.start) and p.start.startswith(text.lstrip()):
            return "", ""  # may still become <think>
        opened = text.startswith(p.start, lead)
        if not (opened or p.starts_inside):
            self._content_from = 0
            return "", text
        body_from = lead + len(p.start) if opened else 0
        close = text.find(p.end, body_from)
        if close >= 0:
            self._content_from = close + len(p.end)
            return self._emit(text, body_from, close), text[self._content_from:].lstrip()
        held = 0 if finished else next((k for k in range(len(p.end) - 1, 0, -1) if text.endswith(p.end[:k])), 0)
        return self._emit(text, body_from, len(text) - held), ""

    def _emit(self, text: str, body_from: int, end: int) -> str:
        start = max(self._sent, body_from)
        if end <= start:
            return ""
        self._sent = end
        return text[start:end]
