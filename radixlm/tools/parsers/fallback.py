"""For any model: the first family whose syntax finds a call in the text (hermes tags, mistral's array,
llama3's bare JSON); generation then uses the hermes syntax (the documented default prompt)."""

from __future__ import annotations

from radixlm.tools.parsers import hermes, llama3, mistral
from radixlm.tools.parsers.base import ParsedCall

FORMAT = hermes.FORMAT


def parse(text: str) -> list[ParsedCall]:
    for family in (hermes, mistral, llama3):
        calls = family.parse(text)
        if calls:
            return calls
    return []
