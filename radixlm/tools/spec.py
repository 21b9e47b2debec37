"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat request -> a validated ToolRequest.

Runs in the HTTP process. Every malformed field is an OpenAI-style 400 naming the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from radixlm.errors import InvalidRequestError

MODES = ("auto", "none", "required", "named")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # OpenAI's function-name rule (plus . and :)
MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[ToolSpec, ...]
    mode: str  # one of MODES
    named: str | None  # the forced function when mode == "named"
    parallel: bool

    def callable_tools(self) -> tuple[ToolSpec, ...]:
        """The tools the model may call in this request (one for a named choice, none for `none`)."""
        if self.mode == "none":
            return ()
        if self.mode == "named":
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools

    def by_name(self) -> dict[str, ToolSpec]:
        return {t.name: t for t in self.tools}


def _fail(message: str, param: str = "tools") -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _tool(i: int, item: Any) -> ToolSpec:
    if not isinstance(item, dict) or item.get("type", "function") != "function":
        raise _fail(f"tools[{i}] must be an object with type 'function'")
    fn = item.get("function")
    if not isinstance(fn, dict):
        raise _fail(f"tools[{i}].function must be an object")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(f"tools[{i}].function.name must match {_NAME.pattern}")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise _fail(f"tools[{i}].function.description must be a string")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise _fail(f"tools[{i}].function.parameters must be a JSON-schema object")
    return ToolSpec(name, description, params)


def _choice(choice: Any, names: set[str]) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if names else "none"), None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise _fail("tool_choice must be auto, none, required or a function object", "tool_choice")
        if choice != "none" and not names:
            raise _fail(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _fail("tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    if name not in names:
        raise _fail(f"tool_choice names the function {name[:64]!r}, which is not in tools", "tool_choice")
    return "named", name


def parse_tool_request(obj: dict[str, Any]) -> ToolRequest | None:
    """None when the request has no tools and no tool_choice (plain chat)."""
    raw, choice = obj.get("tools"), obj.get("tool_choice")
    if raw is None and choice is None:
        return None
    if raw is None:
        raw = []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise _fail(f"tools must be a list of at most {MAX_TOOLS} functions")
    tools = tuple(_tool(i, item) for i, item in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise _fail("tools: function names must be unique")
    mode, named = _choice(choice, set(names))
    parallel = obj.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _fail("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    return ToolRequest(tools, mode, named, parallel)


def schema_text(tool: ToolSpec) -> str:
    return json.dumps(tool.parameters)
