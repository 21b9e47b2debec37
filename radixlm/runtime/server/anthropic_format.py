"""Anthropic's Messages API <-> the chat pipeline: a /v1/messages body becomes the ChatBody that
/v1/chat/completions runs (chat template, tool-call grammar, stop strings, sampling), and the chat
pipeline's finished choice or streamed deltas become Anthropic's message object or SSE events.

Runs in the HTTP process. Pure functions over dicts (and one event builder per stream), tested without
a server. Anthropic's shapes: system text, messages of content blocks (text, tool_use, tool_result),
tools with `input_schema`, tool_choice auto / any / tool / none; usage counts cache reads apart from
the (uncached) input tokens, as Anthropic's prompt caching reports them.
"""

from __future__ import annotations

import json
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import pydantic_core

from radixlm.errors import InvalidRequestError
from radixlm.runtime.server.bodies import ChatBody, MessagesBody, MessagesCountBody
from radixlm.runtime.server.errors import APIError

# Error type by HTTP status (Anthropic's names; 503 and 529 are both "overloaded").
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# Native / chat parameter names in an error -> the /v1/messages field the client sent.
_PARAM_NAMES = {"max_new_tokens": "max_tokens", "stop": "stop_sequences", "sampling_seed": "seed",
                "parallel_tool_calls": "tool_choice", "stop_regex": "stop_sequences"}
_UNSUPPORTED_BLOCKS = ("image", "document", "search_result", "container_upload")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "api_error")


def error_body(status: int, message: str, request_id: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type(status), "message": message}}
    if request_id:
        body["request_id"] = request_id
    return body


@contextmanager
def anthropic_params() -> Iterator[None]:
    """Validation errors name the /v1/messages field the client used (the status stays 400)."""
    try:
        yield
    except InvalidRequestError as exc:
        param, message = _PARAM_NAMES.get(exc.param or "", exc.param), str(exc)
        if exc.param in _PARAM_NAMES:  # the message names the native field first: name the client's instead
            message = re.sub(rf"(?<![\w.]){re.escape(exc.param)}(?!\w)", str(param), message, count=1)
        raise APIError(400, message, param, exc.code) from None


def _fail(message: str, param: str = "messages") -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


# ---- request: Anthropic -> chat ------------------------------------------------------------------
@dataclass(frozen=True)
class MessagesTurn:
    """A /v1/messages request as the chat pipeline runs it; prefill: a final assistant message's text, which
    the answer continues (it goes after the generation prompt and is not repeated in the answer)."""

    chat: ChatBody
    prefill: str


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _fail(f"{where}.content must be a string or a list of content blocks")
    return content


def _text(block: dict[str, Any], where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _fail(f"{where}.text must be a string")
    return block["text"]


def _unsupported(kind: Any, where: str) -> InvalidRequestError:
    if kind in _UNSUPPORTED_BLOCKS:
        return _fail(f"{where}: {kind} blocks are not supported (this server runs a text-only model)")
    return _fail(f"{where}: unsupported content block type {str(kind)[:40]!r}")


def system_text(system: Any) -> str:
    """`system`: a string or a list of text blocks (joined by blank lines)."""
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for k, block in enumerate(system):
        if block.get("type") != "text":
            raise _unsupported(block.get("type"), f"system[{k}]")
        texts.append(_text(block, f"system[{k}]"))
    return "\n\n".join(texts)


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise _fail(f"{where}.tool_use_id must be a string")
    content = block.get("content", "")
    texts = []
    for k, part in enumerate(_blocks(content, where)):
        if part.get("type") != "text":
            raise _unsupported(part.get("type"), f"{where}.content[{k}]")
        texts.append(_text(part, f"{where}.content[{k}]"))
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise _fail(f"{where}.is_error must be a boolean")
    text = "\n\n".join(texts)
    shown = f"Error: {text}" if block.get("is_error") else text  # the model learns the call failed
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": shown}


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Tool results first (as chat `tool` messages, right after the assistant's calls), then the text."""
    results, texts = [], []
    for k, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{k}]"
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_result":
            results.append(_tool_result(block, at))
        else:
            raise _unsupported(kind, at)
    return results + ([{"role": "user", "content": "\n\n".join(texts)}] if texts or not results else [])


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise _fail(f"{where}: a tool_use block needs a string id and name")
    if not isinstance(block.get("input", {}), dict):
        raise _fail(f"{where}.input must be an object")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": block.get("input", {})}}


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """Text blocks joined, tool_use blocks as tool_calls; earlier turns' thinking is not shown to the model."""
    texts, calls = [], []
    for k, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{k}]"
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind not in ("thinking", "redacted_thinking"):
            raise _unsupported(kind, at)
    return {"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})}


def chat_messages(body: MessagesCountBody) -> tuple[list[dict[str, Any]], str]:
    """(chat messages, prefill text): a final assistant message without tool calls is a prefill."""
    system = system_text(body.system)
    out = [{"role": "system", "content": system}] if system else []
    if not body.messages:
        raise _fail("messages must be a non-empty list")
    for i, msg in enumerate(body.messages):
        role, where = msg.get("role"), f"messages[{i}]"
        if role not in ("user", "assistant"):
            raise _fail(f"{where}.role must be user or assistant")
        blocks = _blocks(msg.get("content"), where)
        out += _user(blocks, where) if role == "user" else [_assistant(blocks, where)]
    last = out[-1]
    if last["role"] == "assistant" and "tool_calls" not in last:
        return out[:-1], last["content"]
    return out, ""


def _tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise _fail(f"tools[{i}]: tool type {str(tool.get('type'))[:40]!r} is not supported (custom tools only: "
                    "name, description, input_schema)", "tools")
    if not isinstance(tool.get("input_schema"), dict):
        raise _fail(f"tools[{i}].input_schema must be a JSON-schema object", "tools")
    return {"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description"),
                                             "parameters": tool["input_schema"]}}


def tool_fields(body: MessagesCountBody) -> dict[str, Any]:
    """ChatBody's tools / tool_choice / parallel_tool_calls (absent fields stay absent)."""
    out: dict[str, Any] = {}
    if body.tools is not None:
        out["tools"] = [_tool(i, t) for i, t in enumerate(body.tools)]
    choice = body.tool_choice
    if choice is None:
        return out
    kind = choice.get("type")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _fail("tool_choice.name must be a string", "tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif isinstance(kind, str) and kind in _TOOL_CHOICES:  # a list or object is unhashable
        out["tool_choice"] = _TOOL_CHOICES[kind]
    else:
        raise _fail("tool_choice.type must be auto, any, tool or none", "tool_choice")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise _fail("tool_choice.disable_parallel_tool_use must be a boolean", "tool_choice")
        out["parallel_tool_calls"] = not disable
    return out


def to_chat(body: MessagesCountBody) -> MessagesTurn:
    """The ChatBody of a /v1/messages (or count_tokens) body: its sampling fields too for a MessagesBody."""
    messages, prefill = chat_messages(body)
    sampling: dict[str, Any] = {}
    if isinstance(body, MessagesBody):
        sampling = {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
                    "top_k": body.top_k, "stop": body.stop_sequences, "seed": body.seed, "stream": body.stream}
    return MessagesTurn(ChatBody(messages=messages, **tool_fields(body), **sampling), prefill)


# ---- response: chat -> Anthropic -----------------------------------------------------------------
def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def usage(meta: dict[str, Any]) -> dict[str, Any]:
    """Anthropic counts input as uncached input + cache reads + cache writes: the radix cache's hits are the
    reads; nothing is billed as a cache write (the cache is automatic)."""
    prompt, cached = meta.get("prompt_tokens", 0), meta.get("cached_tokens", 0)
    return {"input_tokens": prompt - cached, "output_tokens": meta.get("completion_tokens", 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def stop_reason(reason: str | None, matched: Any, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat finish_reason (an aborted request ends its turn)."""
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if reason == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return "end_turn", None


def message(model: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
            usage_: dict[str, Any], msg_id: str | None = None) -> dict[str, Any]:
    return {"id": msg_id or message_id(), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage_}


def content_blocks(chat_message: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished chat message (content, tool_calls, reasoning_content) as Anthropic content blocks."""
    blocks: list[dict[str, Any]] = []
    if chat_message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": chat_message["reasoning_content"], "signature": ""})
    if chat_message.get("content"):
        blocks.append({"type": "text", "text": chat_message["content"]})
    for call in chat_message.get("tool_calls") or []:
        fn = call["function"]
        blocks.append({"type": "tool_use", "id": tool_use_id(), "name": fn["name"],
                       "input": _call_input(fn["arguments"])})
    return blocks


def _call_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as tool_use input. A call cut by max_tokens (stop_reason max_tokens) has only a prefix
    of its JSON: its block is kept, its input read as far as it goes, as the client reads a streamed call's
    input_json_delta pieces (JSON's partial mode, as the client's own parser)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = pydantic_core.from_json(arguments or "{}", allow_partial=True)
    return value if isinstance(value, dict) else {}


def finished_message(model: str, choice: dict[str, Any], meta: dict[str, Any],
                     stop_sequences: list[str] | None) -> dict[str, Any]:
    """The Anthropic message of a finished chat choice (after ChatAgent.finish_choice)."""
    stop = stop_reason(choice["finish_reason"], choice.get("matched_stop"), stop_sequences)
    return message(model, content_blocks(choice["message"]), stop, usage(meta))


# ---- streaming ------------------------------------------------------------------------------------
def sse_event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def sse_error(status: int, message: str) -> bytes:
    return sse_event("error", error_body(status, message))


class EventStream:
    """One streamed message: the chat pipeline's deltas ({"content"}, {"reasoning_content"}, {"tool_calls"})
    -> Anthropic's events, one content block per text run, thought or tool call. Whitespace at the end of
    text is held back until more text follows, so text before a tool call ends as the finished message's
    does (stripped)."""

    def __init__(self, model: str, stop_sequences: list[str] | None):
        self.model, self.stop_sequences = model, stop_sequences
        self.id = message_id()
        self._kind: str | None = None  # the open block's type
        self._index = -1
        self._held = ""  # trailing whitespace of the text so far
        self._called = False  # a tool call has started

    def start(self, meta: dict[str, Any]) -> list[bytes]:
        opening = message(self.model, [], (None, None), {**usage(meta), "output_tokens": 0}, self.id)
        return [sse_event("message_start", {"type": "message_start", "message": opening}),
                sse_event("ping", {"type": "ping"})]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._kind, self._index = block["type"], self._index + 1
        return out + [sse_event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                        "content_block": block})]

    def _close(self) -> list[bytes]:
        if self._kind is None:
            return []
        self._kind = None
        return [sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _text(self, text: str) -> list[bytes]:
        text, self._held = self._held + text, ""
        body = text.rstrip()
        self._held = text[len(body):]
        if not body:
            return []
        out = [] if self._kind == "text" else self._open({"type": "text", "text": ""})
        return out + [self._delta({"type": "text_delta", "text": body})]

    def _thought(self, text: str) -> list[bytes]:
        out = [] if self._kind == "thinking" else self._open({"type": "thinking", "thinking": "", "signature": ""})
        return out + [self._delta({"type": "thinking_delta", "thinking": text})]

    def _calls(self, calls: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        for call in calls:
            fn = call.get("function") or {}
            if call.get("id"):  # a new call: whitespace before it is dropped, as in the finished message
                self._held, self._called = "", True
                out += self._open({"type": "tool_use", "id": tool_use_id(), "name": fn.get("name"), "input": {}})
            if fn.get("arguments"):
                out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def feed(self, piece: dict[str, Any]) -> list[bytes]:
        if piece.get("reasoning_content"):
            return self._thought(piece["reasoning_content"])
        if piece.get("content"):
            return self._text(piece["content"])
        return self._calls(piece.get("tool_calls") or [])

    def _flush(self) -> list[bytes]:
        """The held whitespace, at the end of an output without tool calls (its finished message keeps it)."""
        held, self._held = self._held, ""
        if not held or self._called:
            return []
        out = [] if self._kind == "text" else self._open({"type": "text", "text": ""})
        return out + [self._delta({"type": "text_delta", "text": held})]

    def finish(self, reason: str | None, matched: Any, meta: dict[str, Any]) -> list[bytes]:
        out = self._flush()
        stop, sequence = stop_reason(reason, matched, self.stop_sequences)
        delta = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": sequence},
                 "usage": usage(meta)}
        return out + self._close() + [sse_event("message_delta", delta),
                                      sse_event("message_stop", {"type": "message_stop"})]
