"""The tool fields of chat messages: assistant `tool_calls` and tool `tool_call_id` / `name`, validated.

Runs in the HTTP process (called by chat_prompt.normalize_messages, so plain chat keeps its shape).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.errors import InvalidRequestError


def _call(i: int, k: int, call: Any) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{k}]"
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequestError(f"{where}.function.name must be a string", param="messages")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise InvalidRequestError(f"{where}.function.arguments must be a JSON object text",
                                      param="messages") from None
    if not isinstance(args, dict):
        raise InvalidRequestError(f"{where}.function.arguments must be a JSON object", param="messages")
    call_id = call.get("id")
    return {"id": call_id if isinstance(call_id, str) else f"call_{i}_{k}", "type": "function",
            "function": {"name": fn["name"], "arguments": args}}


def tool_fields(msg: dict[str, Any], i: int) -> dict[str, Any]:
    """The message's tool fields with arguments as dicts (what HF chat templates expect), or {}."""
    out: dict[str, Any] = {}
    calls = msg.get("tool_calls")
    if calls is not None and msg.get("role") == "assistant":
        if not isinstance(calls, list):
            raise InvalidRequestError(f"messages[{i}].tool_calls must be a list", param="messages")
        if calls:
            out["tool_calls"] = [_call(i, k, c) for k, c in enumerate(calls)]
    if msg.get("role") == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(msg.get(key), str):
                out[key] = msg[key]
    return out
