"""The chat pipeline's output -> OpenAI Responses output items, stream events and response objects.

Runs in the HTTP process. One builder for both paths: a stream feeds it the chat deltas of
chat_agent.ChoiceStream as they come (reasoning_content, content, tool_calls), a finished request the
deltas of its finished message at once; either way it builds the output items (reasoning, message,
function_call, in that order) and the typed events that announce them, numbered by sequence_number.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from radixlm.runtime.server.errors import APIError


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _new_item(kind: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant", "content": []}
    return {"type": "reasoning", "id": new_id("rs"), "status": "in_progress", "summary": [], "content": []}


def _part(item: dict[str, Any], text: str) -> dict[str, Any]:
    return _output_text(text) if item["type"] == "message" else {"type": "reasoning_text", "text": text}


def usage(meta: dict[str, Any], reasoning_tokens: int = 0) -> dict[str, Any]:
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": meta["cached_tokens"],
                                                             "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt + completion}


def message_deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished chat message as the deltas a stream of it would have sent."""
    out: list[dict[str, Any]] = []
    if message.get("reasoning_content") is not None:
        out.append({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        out.append({"content": message["content"]})
    calls = [{"index": k, **call} for k, call in enumerate(message.get("tool_calls") or [])]
    return out + [{"tool_calls": [call]} for call in calls]


class OutputBuilder:
    """Chat deltas -> output items and their stream events. `response` is the response object being built
    (status in_progress; its `output` fills in at finish)."""

    def __init__(self, response: dict[str, Any]):
        self.response = response
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._text = ""  # the open item's text (or arguments) so far
        self.thought = ""  # all reasoning text (for usage's reasoning_tokens)
        self._seq = 0

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    def opening(self) -> list[dict[str, Any]]:
        return [self.event("response.created", response=self.response),
                self.event("response.in_progress", response=self.response)]

    # ---- deltas ----------------------------------------------------------------------------------------
    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if delta.get("reasoning_content"):
            out += self._text_delta("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            out += self._text_delta("message", delta["content"])
        for call in delta.get("tool_calls") or []:
            out += self._call_delta(call)
        return out

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.items) - 1}

    def _start(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.close("completed")
        self._open, self._text = item, ""
        self.items.append(item)
        out.append(self.event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)))
        if item["type"] != "function_call":
            out.append(self.event("response.content_part.added", **self._where(), content_index=0,
                                  part=_part(item, "")))
        return out

    def _text_delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        out = [] if self._open is not None and self._open["type"] == kind else self._start(_new_item(kind))
        self._text += text
        if kind == "reasoning":
            self.thought += text
        if kind == "message":
            return out + [self.event("response.output_text.delta", **self._where(), content_index=0, delta=text,
                                     logprobs=[])]
        return out + [self.event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)]

    def _call_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        fn = call.get("function") or {}
        if call.get("id") is not None:  # a new call opens (OpenAI's streamed tool_calls shape)
            out = self._start({"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
                               "name": fn.get("name") or "", "arguments": "", "status": "in_progress"})
        if fn.get("arguments") and self._open is not None and self._open["type"] == "function_call":
            self._text += fn["arguments"]
            out.append(self.event("response.function_call_arguments.delta", **self._where(),
                                  delta=fn["arguments"]))
        return out

    # ---- the end -----------------------------------------------------------------------------------------
    def close(self, status: str) -> list[dict[str, Any]]:
        """Finish the open item (its done events); `status` is completed, or incomplete for a cut output."""
        item, text = self._open, self._text
        if item is None:
            return []
        where, self._open = self._where(), None
        item["status"] = status
        if item["type"] == "function_call":
            item["arguments"] = text
            done = [self.event("response.function_call_arguments.done", **where, arguments=text)]
        else:
            item["content"] = [_part(item, text)]
            kind = "output_text" if item["type"] == "message" else "reasoning_text"
            extra = {"logprobs": []} if kind == "output_text" else {}
            done = [self.event(f"response.{kind}.done", **where, content_index=0, text=text, **extra),
                    self.event("response.content_part.done", **where, content_index=0, part=item["content"][0])]
        return done + [self.event("response.output_item.done", output_index=where["output_index"], item=item)]

    def finish(self, finish_reason: str | None, meta: dict[str, Any], reasoning_tokens: int = 0
               ) -> list[dict[str, Any]]:
        """The last events: the open item closed (an empty message when nothing was said), then
        response.completed, or response.incomplete when the output was cut at max_output_tokens."""
        cut = finish_reason == "length"
        out: list[dict[str, Any]] = []
        if not any(i["type"] in ("message", "function_call") for i in self.items):
            out += self._start(_new_item("message"))
        out += self.close("incomplete" if cut else "completed")
        self.response.update(status="incomplete" if cut else "completed", output=self.items,
                             usage=usage(meta, reasoning_tokens), completed_at=int(time.time()),
                             incomplete_details={"reason": "max_output_tokens"} if cut else None)
        return out + [self.event("response.incomplete" if cut else "response.completed", response=self.response)]

    def fail(self, err: APIError) -> list[dict[str, Any]]:
        """A request the scheduler failed mid-stream: the error event, then response.failed."""
        self.response.update(status="failed", output=self.items, error={"code": "server_error",
                                                                        "message": err.message})
        return [self.event("error", code=err.code, message=err.message, param=err.param),
                self.event("response.failed", response=self.response)]


def response_object(model: str, echo: dict[str, Any]) -> dict[str, Any]:
    """A new response, in progress (OpenAI's field set; `echo` holds the request's own fields)."""
    return {"id": new_id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": model, "output": [], "error": None, "incomplete_details": None, "usage": None,
            "completed_at": None, **echo}
