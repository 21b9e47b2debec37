"""The FastAPI app (middleware, error handlers, the routers of native_api.py, openai_api.py and admin.py)
and what the routes share: body parsing, waiting for results, the streaming helpers.

Runs in the HTTP process. Request bodies are read here and decoded by msgspec into the Structs of
server/bodies.py (not by FastAPI models), so that every client mistake (NaN, invalid UTF-8, wrong
top-level type, a field of the wrong type, unknown sampling key) is a 400 in the error envelope; value
validation and tokenization are runtime/generate_input.py's, shared with the Engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, TypeVar

from fastapi import FastAPI, Request

from radixlm.runtime.messages import StrOut
from radixlm.runtime.server.bodies import decode_body
from radixlm.runtime.server.context import AppContext
from radixlm.runtime.server.errors import APIError, error_body, from_request_error, install_error_handlers
from radixlm.runtime.server.middleware import AuthMiddleware, BodyLimitMiddleware, RequestIdMiddleware
from radixlm.runtime.server.tokenizer_manager import RequestHandle, TokenizerManager

logger = logging.getLogger("radixlm.server")

_JSON_TYPES = ("application/json", "text/plain", "application/x-www-form-urlencoded")
T = TypeVar("T")


# ---- request parsing ------------------------------------------------------------------------------
def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


async def _raw_body(request: Request, allow_empty: bool = False) -> bytes:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype not in _JSON_TYPES and not ctype.endswith("+json"):
        raise APIError(400, "the body must be JSON (Content-Type: application/json)", None, "invalid_content_type")
    body = await request.body()
    if not body.strip() and not allow_empty:
        raise APIError(400, "the request body is empty", None, "invalid_json")
    return body


async def read_body(request: Request, body_type: type[T]) -> T:
    """A /generate or /v1 body decoded into its Struct (server/bodies.py maps every decode error)."""
    return decode_body(await _raw_body(request), body_type)


async def read_json(request: Request, allow_empty: bool = False) -> Any:
    """The small management bodies (abort, concate_and_append) as plain JSON."""
    body = await _raw_body(request, allow_empty)
    if not body.strip():
        return {}
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise APIError(400, "the body is not valid UTF-8", None, "invalid_json") from None
    except (ValueError, RecursionError):
        raise APIError(400, "the body is not valid JSON", None, "invalid_json") from None


async def read_object(request: Request, allow_empty: bool = False) -> dict[str, Any]:
    obj = await read_json(request, allow_empty)
    if not isinstance(obj, dict):
        raise APIError(400, "the body must be a JSON object", None, "invalid_json")
    return obj


def check_bool(obj: dict[str, Any], name: str) -> bool:
    value = obj.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be a boolean", name, "invalid_type")
    return value


# ---- waiting for results --------------------------------------------------------------------------
async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_results(request: Request, tm: TokenizerManager, handle: RequestHandle) -> list[dict[str, Any]] | None:
    """All results of a non-streaming request, or None if the client went away (request aborted)."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    waiter = asyncio.ensure_future(tm.wait(handle))
    try:
        done, _ = await asyncio.wait({watcher, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        tm.abort(handle)  # the client is gone: free the scheduler's KV now
        return None
    finally:
        for task in (watcher, waiter):
            task.cancel()
        if not handle.finished:
            tm.abort(handle)


def raise_for_errors(handle: RequestHandle) -> None:
    """A finished request that the scheduler refused or failed: its (first) error as the route's answer."""
    for rid in handle.rids:
        err = handle.errors.get(rid)
        if err is not None:
            raise from_request_error(err)


def stream_error(err: APIError) -> bytes:
    return sse(error_body(err.status, err.message, err.param, err.code))


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


Events = AsyncIterator[tuple[int, StrOut]]


async def open_stream(request: Request, tm: TokenizerManager, handle: RequestHandle) -> Events | None:
    """Streaming: hold the response headers until the first event, so a request the scheduler refuses
    (a grammar that does not compile, a full queue) still gets a real error status. Returns the events
    (the first one included), or None if the client went away meanwhile (the request is aborted)."""
    events = tm.events(handle)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    first = asyncio.ensure_future(events.__anext__())
    try:
        done, _ = await asyncio.wait({watcher, first}, return_when=asyncio.FIRST_COMPLETED)
        if first not in done:
            tm.abort(handle)
            return None
    finally:
        watcher.cancel()
        first.cancel()
    item = first.result()
    if item[1].error is not None:
        tm.abort(handle)
        raise from_request_error(item[1].error)

    async def chain() -> Events:
        yield item
        async for rest in events:
            yield rest

    return chain()


async def native_stream(tm: TokenizerManager, handle: RequestHandle, events: Events) -> AsyncIterator[bytes]:
    multi = len(handle.rids) > 1
    try:
        async for index, out in events:
            if out.error is not None:
                yield stream_error(from_request_error(out.error))
                continue
            if out.payload is None:
                continue
            yield sse({**out.payload, "index": index} if multi else out.payload)
        yield SSE_DONE
    finally:  # also runs when Starlette cancels us on a client disconnect
        if not handle.finished:
            tm.abort(handle)


# ---- the app --------------------------------------------------------------------------------------
def create_app(ctx: AppContext) -> FastAPI:
    # The route modules import this one's helpers, so they load here, once the helpers exist.
    from radixlm.runtime.server.admin import router as admin_router
    from radixlm.runtime.server.anthropic_api import router as anthropic_router
    from radixlm.runtime.server.anthropic_errors import AnthropicErrorMiddleware
    from radixlm.runtime.server.dashboard.hub import DashboardHub
    from radixlm.runtime.server.dashboard.programs import TraceStore
    from radixlm.runtime.server.dashboard.routes import PUBLIC_PATHS
    from radixlm.runtime.server.dashboard.routes import router as dashboard_router
    from radixlm.runtime.server.embeddings_api import router as embeddings_router
    from radixlm.runtime.server.native_api import VERSION
    from radixlm.runtime.server.native_api import router as native_router
    from radixlm.runtime.server.openai_api import router as openai_router
    from radixlm.runtime.server.openapi import install_docs
    from radixlm.runtime.server.tokenize_api import router as tokenize_router
    from radixlm.runtime.server.responses_api import router as responses_router
    from radixlm.runtime.server.responses_store import ResponseStore

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx  # what each route's `ctx: Ctx` parameter receives (server/context.py)
    install_error_handlers(app)
    app.state.dashboard = DashboardHub(ctx.tm)  # /dashboard (server/dashboard/)
    app.state.program_traces = TraceStore()
    app.state.responses_store = ResponseStore(ctx.config.max_stored_responses,
                                              ctx.config.max_stored_response_bytes)  # /v1/responses
    ctx.tm.listeners.append(app.state.dashboard.on_output)
    for router in (native_router, openai_router, embeddings_router, responses_router, anthropic_router,
                   admin_router, dashboard_router):
        app.include_router(router)
    app.include_router(tokenize_router)  # /tokenize, /detokenize, /tokenizer_info (vLLM's shapes)
    install_docs(app, VERSION)
    # Outermost last: request id wraps auth wraps the body limit.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=ctx.config.max_body_bytes)
    app.add_middleware(AuthMiddleware, api_keys=ctx.config.api_keys, admin_api_key=ctx.config.admin_api_key,
                       public_paths=PUBLIC_PATHS)
    app.add_middleware(AnthropicErrorMiddleware)  # /v1/messages*: every error above in Anthropic's shape
    app.add_middleware(RequestIdMiddleware)
    return app
