"""Pure-ASGI middleware, outermost first: request id + access log, API-key auth, body-size limit.

Runs in the HTTP process. Pure ASGI (not BaseHTTPMiddleware) so streaming responses and client
disconnects pass through untouched. Each layer answers with the error envelope itself, so even a
401 or a 413 carries X-Request-Id.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from typing import Any, Awaitable, Callable

from radixlm.runtime.server.errors import error_bytes

logger = logging.getLogger("radixlm.server.access")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CLIENT_RID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Routes that need no key even when keys are configured: exact raw path, nothing normalised, so
# tricks like //health, /Health or /health/../generate do not match (they need a key like any route).
AUTH_ALLOWLIST = frozenset({"/health"})


def namespace_for_key(key: str) -> str:
    """The radix-cache namespace of a tenant: derived from its key, never chosen by a client."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


async def send_error(send: Send, status: int, message: str, code: str | None, request_id: str = "") -> None:
    body = error_bytes(status, message, None, code)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


_LOGGED_ERROR_BYTES = 4096


def _error_reason(body: bytes) -> str:
    """` code=... error="..."` from an error envelope, for the access log line ("" if there is none)."""
    if not body:
        return ""
    try:
        err = json.loads(body)["error"]
        return f" code={err.get('code')} error={json.dumps(err.get('message'))}"
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


class RequestIdMiddleware:
    """Every response gets X-Request-Id (the client's, if well-formed, else a new one); one log line per
    request with its id, so scheduler-side logs (which name the rid) can be joined to it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = _header(scope, b"x-request-id")
        request_id = given if given and _CLIENT_RID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = [0]
        error_body = bytearray()  # of an error response (its first bytes): the reason goes into the log line
        start = time.perf_counter()

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                # Exactly one id: an inner middleware's own error response may already carry it.
                others = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message["headers"] = [*others, (b"x-request-id", request_id.encode())]
            elif message["type"] == "http.response.body" and status[0] >= 400:
                error_body.extend(message.get("body", b"")[: _LOGGED_ERROR_BYTES - len(error_body)])
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            logger.info("request_id=%s method=%s path=%s status=%d duration_ms=%.1f%s", request_id,
                        scope.get("method"), scope.get("path"), status[0], 1000 * (time.perf_counter() - start),
                        _error_reason(bytes(error_body)))


class AuthMiddleware:
    """Key check on every route but the allowlist (`Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`
    when no bearer is given); sets state.namespace, state.is_admin and state.is_operator."""

    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...], admin_api_key: str | None,
                 public_paths: frozenset[str] = frozenset()):
        self.app = app
        # Also without a key: static page shells that hold no data (the dashboard's; they ask for the key).
        self.allowlist = AUTH_ALLOWLIST | public_paths
        self.keys = [(k.encode(), namespace_for_key(k)) for k in api_keys]
        self.admin_key = admin_api_key.encode() if admin_api_key else None

    def _identify(self, scope: Scope) -> tuple[bool, str, bool]:
        """(authenticated, namespace, is_admin) for the request's key."""
        auth = _header(scope, b"authorization") or ""
        given = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
        given = given or (_header(scope, b"x-api-key") or "").strip().encode()
        if not given:
            return False, "", False
        # Compare against every key (no early exit) so timing does not reveal which prefix matched.
        namespace, found = "", False
        for key, ns in self.keys:
            if hmac.compare_digest(given, key):
                namespace, found = ns, True
        is_admin = self.admin_key is not None and hmac.compare_digest(given, self.admin_key)
        return found or is_admin, namespace, is_admin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        ok, namespace, is_admin = self._identify(scope)
        state["namespace"], state["is_admin"] = namespace, is_admin
        # Server-wide actions (flush the shared cache, abort every tenant's requests): the admin key; on an
        # open server anyone; with SGLang's single --api-key and no admin key, that key (no other tenant).
        single_tenant = len(self.keys) == 1 and self.admin_key is None
        state["is_operator"] = is_admin or not self.keys or (single_tenant and ok)
        raw_path = scope.get("raw_path", b"").split(b"?")[0].decode("latin-1")
        needs_key = bool(self.keys) and raw_path not in self.allowlist
        if needs_key and not ok:
            return await send_error(send, 401, "missing or invalid API key", "invalid_api_key",
                                    state.get("request_id", ""))
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Reject bodies over the limit before buffering them whole: by Content-Length up front, and for
    chunked bodies as soon as the running total passes the limit. The accepted body is replayed."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        rid = scope.get("state", {}).get("request_id", "")
        length = _header(scope, b"content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > self.limit):
            code = "body_too_large" if length.strip().isdigit() else "invalid_content_length"
            return await send_error(send, 413 if code == "body_too_large" else 400, "request body too large"
                                    if code == "body_too_large" else "bad Content-Length", code, rid)
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.limit:
                return await send_error(send, 413, "request body too large", "body_too_large", rid)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # afterwards: wait for the disconnect, as the server would

        await self.app(scope, replay, send)
