"""The SGLang-native routes (docs/wire-protocol.md): /generate, health, cache and abort, model and server info, metrics.

Runs in the HTTP process. /generate's body is decoded by msgspec into server/bodies.py's GenerateBody;
validation and tokenization are runtime/generate_input.py's (shared with the Engine), run off the event
loop.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from radixlm import __version__ as VERSION
from radixlm.runtime.server.context import Ctx, off_loop
from radixlm.runtime.server.errors import APIError, error_response
from radixlm.runtime.server.bodies import GenerateBody, request_body
from radixlm.runtime.server.http_server import (check_bool, native_stream, open_stream, raise_for_errors, read_body,
                                                read_object, wait_results)

router = APIRouter()


@router.post("/generate", openapi_extra=request_body(GenerateBody))
async def generate(request: Request, ctx: Ctx) -> Response:
    tm = ctx.tm
    body = await read_body(request, GenerateBody)
    stream = bool(body.stream)
    tm.check_admission(1)
    prepared, is_batch = await off_loop(tm.prepare, request.state.namespace, stream=stream, **body.fields())
    handle = tm.submit(prepared, stream, request.state.request_id)
    if stream:
        events = await open_stream(request, tm, handle)
        if events is None:
            return Response(status_code=499)
        return StreamingResponse(native_stream(tm, handle, events), media_type="text/event-stream")
    results = await wait_results(request, tm, handle)
    if results is None:
        return Response(status_code=499)
    raise_for_errors(handle)
    return JSONResponse(results if is_batch or len(results) > 1 else results[0])


@router.get("/health")
async def health(ctx: Ctx) -> Response:
    tm = ctx.tm
    if tm.state != "ok":
        return error_response(503, f"server is {tm.state}", None, f"server_{tm.state}")
    return JSONResponse({})


@router.get("/health_generate")
async def health_generate(request: Request, ctx: Ctx) -> Response:
    tm = ctx.tm
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
    for handle in handles:
        raise_for_errors(handle)
    return JSONResponse({})


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request, ctx: Ctx) -> Response:
    tm = ctx.tm
    if not request.state.is_operator:  # the cache is shared: a flush costs every tenant its prefixes
        raise APIError(403, "flushing the cache needs the admin API key", None, "admin_only")
    resp = await tm.flush_cache()
    if not resp.ok:
        return error_response(400, "cannot flush the cache while requests are running", None, "busy")
    return JSONResponse({"message": "Cache flushed."})


@router.post("/abort_request")
async def abort_request(request: Request, ctx: Ctx) -> Response:
    tm = ctx.tm
    obj = await read_object(request)
    # A tenant acts on its own requests only; an operator (docs/server.md) on everyone's.
    scope = None if request.state.is_operator else request.state.namespace
    if check_bool(obj, "abort_all"):
        tm.abort_all(scope)
        return JSONResponse({})
    rid = obj.get("rid")
    if not isinstance(rid, str) or not rid:
        raise APIError(400, "rid must be a non-empty string", "rid", "invalid_type")
    return JSONResponse({"aborted": tm.abort_rid(rid, scope)})


@router.post("/concate_and_append_request")
async def concate_and_append(request: Request) -> Response:
    # SGLang's join("concate_and_append") asks the server to splice the forks' KV into dst_rid.
    # The radix cache makes that unnecessary: the frontend concatenates the texts and the next
    # request re-matches every cached prefix. We validate the body and acknowledge.
    obj = await read_object(request)
    src, dst = obj.get("src_rids"), obj.get("dst_rid")
    if not isinstance(src, list) or not all(isinstance(r, str) for r in src) or not isinstance(dst, str):
        raise APIError(400, "src_rids must be a list of strings and dst_rid a string", "src_rids", "invalid_type")
    return JSONResponse({"success": True})


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(ctx: Ctx) -> Response:
    tm = ctx.tm
    return JSONResponse({
        "model_path": ctx.model_info["model_path"], "tokenizer_path": ctx.tokenizer_path,
        "is_generation": True, "chat_template": getattr(tm.tokenizer, "chat_template", None),
        "served_model_name": ctx.served_model_name, "context_length": ctx.model_info["context_length"],
        "architectures": [ctx.model_info["architecture"]]})


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(ctx: Ctx) -> Response:
    tm = ctx.tm
    resp = await tm.control("scheduler", "server_info")  # --dp-size N: summed, per rank in dp_ranks
    # served_model_name: the name /v1/models lists (the flag's value, else the model directory's name).
    return JSONResponse({**ctx.server_args, **ctx.model_info, **resp.data, "version": VERSION,
                         "served_model_name": ctx.served_model_name,
                         "num_inflight_requests": len(tm.handles), "state": tm.state,
                         "dp_routing": tm.dispatch.stats()})


@router.get("/version")
async def version() -> Response:
    """vLLM's shape (SGLang reports the same in /get_server_info)."""
    return JSONResponse({"version": VERSION})


@router.get("/get_load")
async def get_load(ctx: Ctx) -> Response:
    """One entry per scheduler rank, in SGLang's shape: SGLang's router reads it for its load-aware policies."""
    pool = ctx.model_info["max_total_num_tokens"]
    resps = await ctx.tm.control_ranks("server_info")
    if not all(resp.ok for resp in resps):
        raise APIError(503, "a scheduler could not report its load", None, "unavailable")
    return JSONResponse([_rank_load(rank, resp.data, pool) for rank, resp in enumerate(resps)])


def _rank_load(rank: int, info: dict, pool: int) -> dict[str, int]:
    held = pool - info["num_free_tokens"] - info["num_evictable_tokens"]
    return {"dp_rank": rank, "num_reqs": info["num_running_reqs"] + info["num_waiting_reqs"],
            "num_waiting_reqs": info["num_waiting_reqs"], "num_tokens": held + info["num_waiting_tokens"]}


@router.get("/metrics")
async def metrics(ctx: Ctx) -> Response:
    tm = ctx.tm
    if not ctx.config.enable_metrics:
        raise APIError(404, "metrics are disabled (start the server with --enable-metrics)", None, "not_found")
    return Response(tm.metrics.render(), media_type=CONTENT_TYPE_LATEST)
