"""The FastAPI app: middleware, error handlers and the SGLang-native routes (wire-protocol.md).

Runs in the HTTP process. Request bodies are parsed here (not by FastAPI models) so that every client
mistake (NaN, invalid UTF-8, wrong top-level type, unknown sampling key) is a 400 in the error
envelope; validation and tokenization are runtime/generate_input.py's, shared with the Engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from radixlm.runtime.config import GrammarConfig, ServerConfig
from radixlm.runtime.server.errors import APIError, error_body, error_response, install_error_handlers
from radixlm.runtime.server.middleware import AuthMiddleware, BodyLimitMiddleware, RequestIdMiddleware
from radixlm.runtime.messages import StrOut
from radixlm.runtime.server.tokenizer_manager import RequestHandle, TokenizerManager

logger = logging.getLogger("radixlm.server")

_JSON_TYPES = ("application/json", "text/plain", "application/x-www-form-urlencoded")
_GENERATE_FIELDS = ("text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
                    "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs", "rid")
_VERSION = "0.1.0"


@dataclass(frozen=True)
class AppContext:
    tm: TokenizerManager
    config: ServerConfig
    model_info: dict[str, Any]  # from the scheduler's ready handshake
    tokenizer_path: str
    served_model_name: str
    server_args: dict[str, Any]
    grammar_config: GrammarConfig = field(default_factory=GrammarConfig)  # strict response_format checks


# ---- request parsing ------------------------------------------------------------------------------
def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, allow_empty: bool = False) -> Any:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype not in _JSON_TYPES and not ctype.endswith("+json"):
        raise APIError(400, "the body must be JSON (Content-Type: application/json)", None, "invalid_content_type")
    body = await request.body()
    if not body.strip():
        if allow_empty:
            return {}
        raise APIError(400, "the request body is empty", None, "invalid_json")
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


# Codes the scheduler may attach to an abort finish; anything else it attaches is the client's fault (400,
# e.g. a grammar that fails to compile), with the finish message as the error message.
SERVER_SIDE_CODES = {"queue_full": (503, "server overloaded: the waiting queue is full"),
                     "server_unhealthy": (503, "the server is unhealthy"),
                     "internal_error": (500, "internal server error")}


def result_error(result: dict[str, Any]) -> APIError | None:
    meta = result.get("meta_info", {})
    code = meta.get("error_code")
    if not code:
        return None
    if code in SERVER_SIDE_CODES:
        status, message = SERVER_SIDE_CODES[code]
        return APIError(status, message, None, code)
    message = meta.get("error_message") or (meta.get("finish_reason") or {}).get("message") or "invalid request"
    return APIError(400, message, meta.get("error_param"), code)


def raise_for_server_errors(results: list[dict[str, Any]]) -> None:
    for res in results:
        err = result_error(res)
        if err is not None:
            raise err


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
    err = result_error(item[1].payload) if item[1].payload else None
    if err is not None:
        tm.abort(handle)
        raise err

    async def chain() -> Events:
        yield item
        async for rest in events:
            yield rest

    return chain()


async def native_stream(tm: TokenizerManager, handle: RequestHandle, events: Events) -> AsyncIterator[bytes]:
    multi = len(handle.rids) > 1
    try:
        async for index, out in events:
            if out.payload is None:
                continue
            err = result_error(out.payload)
            if err is not None:
                yield stream_error(err)
                continue
            yield sse({**out.payload, "index": index} if multi else out.payload)
        yield SSE_DONE
    finally:  # also runs when Starlette cancels us on a client disconnect
        if not handle.finished:
            tm.abort(handle)


# ---- the app --------------------------------------------------------------------------------------
def create_app(ctx: AppContext) -> FastAPI:
    from radixlm.runtime.server.openai_api import install_openai_routes

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    install_error_handlers(app)
    _install_native_routes(app, ctx)
    install_openai_routes(app, ctx)
    from radixlm.runtime.server.admin import install_admin_routes

    install_admin_routes(app, ctx)
    # Outermost last: request id wraps auth wraps the body limit.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=ctx.config.max_body_bytes)
    app.add_middleware(AuthMiddleware, api_keys=ctx.config.api_keys, admin_api_key=ctx.config.admin_api_key)
    app.add_middleware(RequestIdMiddleware)
    return app


def _install_native_routes(app: FastAPI, ctx: AppContext) -> None:
    tm = ctx.tm

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        obj = await read_object(request)
        stream = check_bool(obj, "stream")
        fields = {k: obj.get(k) for k in _GENERATE_FIELDS}
        fields["return_text_in_logprobs"] = check_bool(obj, "return_text_in_logprobs")
        tm.check_admission(1)
        prepared, is_batch = tm.prepare(request.state.namespace, stream=stream, **fields)
        handle = tm.submit(prepared, stream, request.state.request_id)
        if stream:
            events = await open_stream(request, tm, handle)
            if events is None:
                return Response(status_code=499)
            return StreamingResponse(native_stream(tm, handle, events), media_type="text/event-stream")
        results = await wait_results(request, tm, handle)
        if results is None:
            return Response(status_code=499)
        raise_for_server_errors(results)
        return JSONResponse(results if is_batch or len(results) > 1 else results[0])

    @app.get("/health")
    async def health() -> Response:
        if tm.state != "ok":
            return error_response(503, f"server is {tm.state}", None, f"server_{tm.state}")
        return JSONResponse({})

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        tm.check_admission(tm.dp_size)
        handles = []  # one probe per scheduler rank (--dp-size): every rank must answer
        for rank in range(tm.dp_size):
            prepared, _ = tm.prepare("health", input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
            handles.append(tm.submit(prepared, False, rank=rank))
        try:
            results = await asyncio.wait_for(asyncio.gather(*(tm.wait(h) for h in handles)),
                                             ctx.config.health_generate_timeout)
        except asyncio.TimeoutError:
            for handle in handles:
                tm.abort(handle)
            return error_response(503, "the scheduler did not answer in time", None, "timeout")
        for result in results:
            raise_for_server_errors(result)
        return JSONResponse({})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        resp = await tm.flush_cache()
        if not resp.ok:
            return error_response(400, "cannot flush the cache while requests are running", None, "busy")
        return JSONResponse({"message": "Cache flushed."})

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        obj = await read_object(request)
        if check_bool(obj, "abort_all"):
            tm.abort_all()
            return JSONResponse({})
        rid = obj.get("rid")
        if not isinstance(rid, str) or not rid:
            raise APIError(400, "rid must be a non-empty string", "rid", "invalid_type")
        return JSONResponse({"aborted": tm.abort_rid(rid)})

    @app.post("/concate_and_append_request")
    async def concate_and_append(request: Request) -> Response:
        # SGLang's join("concate_and_append") asks the server to splice the forks' KV into dst_rid.
        # The radix cache makes that unnecessary: the frontend concatenates the texts and the next
        # request re-matches every cached prefix. We validate the body and acknowledge.
        obj = await read_object(request)
        src, dst = obj.get("src_rids"), obj.get("dst_rid")
        if not isinstance(src, list) or not all(isinstance(r, str) for r in src) or not isinstance(dst, str):
            raise APIError(400, "src_rids must be a list of strings and dst_rid a string", "src_rids", "invalid_type")
        return JSONResponse({"success": True})

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> Response:
        return JSONResponse({
            "model_path": ctx.model_info["model_path"], "tokenizer_path": ctx.tokenizer_path,
            "is_generation": True, "chat_template": getattr(tm.tokenizer, "chat_template", None),
            "served_model_name": ctx.served_model_name, "context_length": ctx.model_info["context_length"]})

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> Response:
        resp = await tm.control("scheduler", "server_info")  # --dp-size N: summed, per rank in dp_ranks
        return JSONResponse({**ctx.server_args, **ctx.model_info, **resp.data, "version": _VERSION,
                             "num_inflight_requests": len(tm.handles), "state": tm.state,
                             "dp_routing": tm.dispatch.stats()})

    @app.get("/metrics")
    async def metrics() -> Response:
        if not ctx.config.enable_metrics:
            raise APIError(404, "metrics are disabled (start the server with --enable-metrics)", None, "not_found")
        return Response(tm.metrics.render(), media_type=CONTENT_TYPE_LATEST)
