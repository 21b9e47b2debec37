"""--tool-call-parser names (SGLang's where it has them) -> (ToolFormat, parser); `auto` picks the family
from the chat template's own tool syntax and falls back to hermes (the default prompt's syntax)."""

from __future__ import annotations

from types import ModuleType

from radixlm.tools.parsers import fallback, hermes, llama3, mistral
from radixlm.tools.parsers.base import Parser, ToolFormat

FAMILIES: dict[str, ModuleType] = {"hermes": hermes, "qwen25": hermes, "qwen": hermes, "qwen3": hermes,
                                   "llama3": llama3, "mistral": mistral, "fallback": fallback}
CHOICES = ("auto", *FAMILIES)
# Marker in a chat template -> its family (checked in this order).
_TEMPLATE_MARKERS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3"))


def family_for(name: str, chat_template: str | None) -> str:
    if name != "auto":
        if name not in FAMILIES:
            raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(CHOICES)}")
        return name
    for marker, family in _TEMPLATE_MARKERS:
        if chat_template and marker in chat_template:
            return family
    return "fallback"


def resolve(name: str, chat_template: str | None) -> tuple[ToolFormat, Parser]:
    module = FAMILIES[family_for(name, chat_template)]
    return module.FORMAT, module.parse
