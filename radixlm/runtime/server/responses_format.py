"""OpenAI Responses request -> the chat pipeline's ChatBody: input items -> chat messages, flat function tools
-> chat tools, `text.format` -> `response_format`, and the fields a response object echoes back.

Runs in the HTTP process. Pure functions over dicts (tested without a server). A conversation is a list of
Responses items (messages, function_call, function_call_output; reasoning items are skipped, as chat
templates drop earlier thoughts); a continuation (previous_response_id) is the stored items plus the new
input, rendered whole, so its prompt begins with the earlier prompt and reuses its radix-cache prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.errors import InvalidRequestError
from radixlm.runtime.server.bodies import ChatBody, ResponsesBody

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")
_SKIPPED_ITEMS = ("reasoning",)  # earlier thoughts: templates drop them from the history anyway
_UNSUPPORTED_FIELDS = {"background": "background mode is not supported on this server",
                       "conversation": "conversation objects are not supported on this server (use "
                                       "previous_response_id)",
                       "prompt": "prompt templates are not supported on this server"}
DEFAULT_TEXT = {"format": {"type": "text"}}


@dataclass(frozen=True)
class ChatPlan:
    """What one Responses request runs: the chat body, the conversation items so far (without
    instructions; stored with the output for a later previous_response_id), and the echoed fields."""

    chat: ChatBody
    items: list[dict[str, Any]]
    echo: dict[str, Any]


def _fail(message: str, param: str = "input", code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


# ---- input items -> chat messages ------------------------------------------------------------------
def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if value is None:
        return []
    return list(value)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{where} must be a string or a list of content parts")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise _fail(f"{where}[{k}]: content parts of type {str(kind)[:64]!r} are not supported (text only: "
                        "input_text, output_text)", code="unsupported_content_type")
        if not isinstance(part.get("text"), str):
            raise _fail(f"{where}[{k}].text must be a string")
        texts.append(part["text"])
    return "".join(texts)


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    role = _ROLES.get(role) if isinstance(role, str) else None  # a list or object is unhashable
    if role is None:
        raise _fail(f"{where}.role must be one of {', '.join(_ROLES)}")
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise _fail(f"{where}.{key} must be a string")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def _append_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """Calls after an assistant message belong to it (one assistant turn: its text, then its calls)."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last["tool_calls"] = [*last.get("tool_calls", []), call]
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def to_messages(items: list[dict[str, Any]], first_input: int = 0) -> list[dict[str, Any]]:
    """Responses items -> chat messages (chat_prompt.normalize_messages validates them further); errors
    name the position in `input` (items before first_input are the stored history)."""
    messages: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id -> function name, for the tool messages' `name`
    for i, item in enumerate(items):
        where = f"input[{i - first_input}]"
        if not isinstance(item, dict):
            raise _fail(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _tool_call(item, where)
            names[item["call_id"]] = item["name"]
            _append_call(messages, call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _fail(f"{where}.call_id must be a string")
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output,
                             **({"name": names[item["call_id"]]} if item["call_id"] in names else {})})
        elif kind not in _SKIPPED_ITEMS:
            raise _fail(f"{where}: items of type {str(kind)[:64]!r} are not supported (message, function_call, "
                        "function_call_output)", code="unsupported_item_type")
    return messages


# ---- tools, tool_choice, text.format ---------------------------------------------------------------
def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Flat Responses function tools -> chat tools; any other tool type is a 400 naming it."""
    if tools is None:
        return None
    other = sorted({str(t.get("type") if isinstance(t, dict) else type(t).__name__)[:64] for t in tools
                    if not isinstance(t, dict) or t.get("type") != "function"})
    if other:
        raise _fail(f"tools: unsupported tool types: {', '.join(other)} (this server runs function tools only)",
                    "tools", "unsupported_tool_type")
    return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            for t in tools]


def chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        raise _fail(f"tool_choice of type {str(choice.get('type'))[:64]!r} is not supported (auto, none, required "
                    "or {\"type\": \"function\", \"name\": ...})", "tool_choice", "unsupported_tool_choice")
    if not isinstance(choice.get("name"), str):
        raise _fail("tool_choice.name must be a string", "tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` -> the chat `response_format` (checked further by openai_format.sampling_params)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise _fail("text.format.type must be text, json_object or json_schema", "text.format")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
    return {"type": "json_schema", "json_schema": spec}


def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict", True)}


# ---- the whole request -----------------------------------------------------------------------------
def echo_fields(body: ResponsesBody) -> dict[str, Any]:
    """The request fields a response object repeats (OpenAI's defaults where the request left them out)."""
    return {"instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": body.reasoning or {},
            "store": body.store is not False, "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": body.text if body.text and body.text.get("format") else DEFAULT_TEXT,
            "tool_choice": body.tool_choice or "auto", "tools": [_echo_tool(t) for t in body.tools or []],
            "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": body.truncation or "disabled",
            "user": body.user, "background": False}


def chat_plan(body: ResponsesBody, history: list[dict[str, Any]]) -> ChatPlan:
    """The chat request of a Responses body continuing `history` (the items of previous_response_id)."""
    for name, why in _UNSUPPORTED_FIELDS.items():
        if getattr(body, name):
            raise _fail(f"{name}: {why}", name, "unsupported_parameter")
    new = input_items(body.input)
    if not new:
        raise _fail("input must be a non-empty string or list of items")
    items = history + new
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat = ChatBody(messages=system + to_messages(items, len(history)), tools=chat_tools(body.tools),
                    tool_choice=chat_tool_choice(body.tool_choice), parallel_tool_calls=body.parallel_tool_calls,
                    response_format=response_format(body.text), max_tokens=body.max_output_tokens,
                    temperature=body.temperature, top_p=body.top_p, seed=body.seed, stream=bool(body.stream))
    return ChatPlan(chat, items, echo_fields(body))
