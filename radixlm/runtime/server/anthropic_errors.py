"""Anthropic's error shape on the /v1/messages routes: {"type": "error", "error": {"type", "message"}}.

Runs in the HTTP process, as pure-ASGI middleware outside the auth and body-limit layers: every error those
layers, the body parser, the routes and the exception handlers answer on a /v1/messages path (401, 413,
400, 404, 405, 503 ...) is written in the envelope of docs/robustness.md first and rewritten here, status
and headers kept. Other paths and successful responses (streams included) pass through untouched.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.runtime.server.anthropic_format import error_body
from radixlm.runtime.server.middleware import ASGIApp, Receive, Scope, Send

PREFIX = "/v1/messages"


def is_messages_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def rewrite(status: int, body: bytes, request_id: str) -> bytes:
    """An error envelope's body in Anthropic's shape (a body that is not one keeps a generic message)."""
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = "request failed"
    return json.dumps(error_body(status, message, request_id)).encode()


class AnthropicErrorMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_messages_path(scope.get("path", "")):
            return await self.app(scope, receive, send)
        request_id = scope.get("state", {}).get("request_id", "")
        start: dict[str, Any] = {}
        body = bytearray()

        async def send_anthropic(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start.update(message)  # held until the body is whole (error bodies are small JSON)
                return
            if not start or message["type"] != "http.response.body":
                return await send(message)
            body.extend(message.get("body", b""))
            if message.get("more_body", False):
                return
            new = rewrite(start["status"], bytes(body), request_id)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(new)).encode())]})
            await send({"type": "http.response.body", "body": new})

        await self.app(scope, receive, send_anthropic)
