"""OpenAI-compatible routes (an APIRouter): /v1/models, /v1/completions, /v1/chat/completions (wire-protocol.md).

Runs in the HTTP process. Bodies decode with msgspec into server/bodies.py's CompletionBody / ChatBody
(unknown top-level fields are ignored, as OpenAI clients send many). Each request is translated to a
native request (same validation, same tokenizer manager, same detokenizer path as /generate) and the
native results are reshaped with openai_format.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.constrained.base import GrammarOptions
from radixlm.errors import ContextLengthError, InvalidRequestError
from radixlm.runtime.server import openai_format as fmt
from radixlm.runtime.server.chat_agent import ChatAgent
from radixlm.runtime.server.chat_agent_stream import agent_chat_choices
from radixlm.runtime.server.chat_prompt import chat_input_ids, normalize_messages
from radixlm.runtime.server.context import AppContext, Ctx, off_loop
from radixlm.runtime.server.errors import APIError, from_request_error
from radixlm.runtime.server.bodies import ChatBody, CompletionBody, OpenAIBody, request_body
from radixlm.runtime.server.http_server import (SSE_DONE, Events, open_stream, raise_for_errors, read_body, sse,
                                                stream_error, wait_results)
from radixlm.runtime.server.tokenizer_manager import RequestHandle, TokenizerManager

router = APIRouter()


@contextmanager
def openai_params() -> Iterator[None]:
    """Report validation errors under the /v1 field names the client used."""
    try:
        yield
    except InvalidRequestError as exc:
        param = fmt.OPENAI_PARAM_NAMES.get(exc.param or "", exc.param)
        message = str(exc).replace(f"{exc.param}:", f"{param}:", 1) if exc.param else str(exc)
        raise APIError(400, message, param, exc.code) from None


# SGLang's router (sglang-router / SGLang Model Gateway) forwards a request that names no model with this
# placeholder model id: it means "no model named", as an absent field does.
ROUTER_UNNAMED_MODEL = "unknown"


def check_model(body: Any, served: str) -> None:
    if body.model not in (None, ROUTER_UNNAMED_MODEL) and body.model != served:
        raise APIError(404, f"the model {body.model[:100]!r} does not exist", "model", "model_not_found")


def _include_usage(body: OpenAIBody) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _split_prompt(prompt: Any) -> tuple[Any, Any]:
    """(text, input_ids) for the native request from an OpenAI `prompt`."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return prompt, None
        ids = all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
        if ids or all(isinstance(p, list) for p in prompt):
            return None, prompt
    raise APIError(400, "prompt must be a string, a list of strings, or token ids", "prompt", "invalid_value")


def _model_card(ctx: AppContext) -> dict[str, Any]:
    return {"id": ctx.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "radixlm",
            "max_model_len": ctx.model_info["context_length"]}


@router.get("/v1/models")
async def list_models(ctx: Ctx) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(ctx)]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, ctx: Ctx) -> Response:
    if model_id != ctx.served_model_name:
        raise APIError(404, "the model does not exist", "model", "model_not_found")
    return JSONResponse(_model_card(ctx))


@router.post("/v1/completions", openapi_extra=request_body(CompletionBody))
async def completions(request: Request, ctx: Ctx) -> Response:
    tm, served = ctx.tm, ctx.served_model_name
    body = await read_body(request, CompletionBody)
    check_model(body, served)
    stream, echo, include_usage = bool(body.stream), bool(body.echo), _include_usage(body)
    text, ids = _split_prompt(body.prompt)
    tm.check_admission(1)
    with openai_params():
        logprobs = None if body.logprobs is None else fmt.check_logprobs_count(body.logprobs, "logprobs")
        # max_tokens 0 with echo scores the prompt (its logprobs alone); without echo it asks for nothing
        params = fmt.sampling_params(body, 16 if body.max_tokens is None else body.max_tokens, 0 if echo else 1)
        prepared, _ = await off_loop(tm.prepare, request.state.namespace, text=text, input_ids=ids,
                                     sampling_params=params, return_logprob=logprobs is not None,
                                     top_logprobs_num=logprobs or 0,
                                     logprob_start_len=0 if echo and logprobs is not None else -1,
                                     return_text_in_logprobs=True, stream=stream)
    await _check_strict(body, ctx)
    n = prepared[0].params.n
    handle = tm.submit(prepared, stream, request.state.request_id)
    if stream:
        events = await open_stream(request, tm, handle)
        if events is None:
            return Response(status_code=499)
        render = _completion_choices(logprobs is not None)
        return StreamingResponse(_sse_choices(tm, handle, events, "text_completion", served, n, include_usage,
                                              [], render), media_type="text/event-stream")
    results = await wait_results(request, tm, handle)
    if results is None:
        return Response(status_code=499)
    raise_for_errors(handle)
    echo_texts = await off_loop(_echo_texts, tm, prepared) if echo else None  # detokenizing: off the loop
    choices = [fmt.completion_choice(k, r, logprobs is not None, echo_texts[k // n] if echo_texts else None)
               for k, r in enumerate(results)]
    return JSONResponse({**fmt.envelope("text_completion", served, choices), "usage": fmt.usage(results, n)})


@dataclass(frozen=True)
class ChatRun:
    """A submitted chat request: its agent layer (tools, reasoning) and its handle, with n choices per prompt."""

    agent: ChatAgent
    handle: RequestHandle
    n: int


async def submit_chat(request: Request, ctx: AppContext, body: ChatBody) -> ChatRun:
    """Validate, render (chat template, tool prompt) and submit a decoded chat body: the one chat pipeline
    behind /v1/chat/completions and /v1/responses (which translates its requests into ChatBody)."""
    tm = ctx.tm
    stream, logprobs = bool(body.stream), bool(body.logprobs)
    tm.check_admission(1)
    with openai_params():
        # tools, reasoning; lowering the tools' schemas is CPU work: on the tokenizer thread, off the event loop
        agent = await off_loop(ChatAgent, body.tool_fields(), tm.tokenizer, ctx.config, ctx.grammar_config)
        messages, tools = agent.render(normalize_messages(body.messages, tm.limits.max_prompt_chars), body.tools)
        ids = await off_loop(chat_input_ids, tm.tokenizer, messages, tools)  # chat template + tokenize
        top = 0 if body.top_logprobs is None else fmt.check_logprobs_count(body.top_logprobs, "top_logprobs")
        params = agent.sampling_params(fmt.sampling_params(body, _chat_max_tokens(body, len(ids), tm)))
        prepared, _ = await off_loop(tm.prepare, request.state.namespace, input_ids=ids, sampling_params=params,
                                     return_logprob=logprobs, top_logprobs_num=top, return_text_in_logprobs=True,
                                     stream=stream)
    await _check_strict(body, ctx)
    handle = tm.submit(prepared, stream, request.state.request_id)
    handle.settle = agent.settler()  # output checks in workers, before the choices are built
    return ChatRun(agent, handle, prepared[0].params.n)


@router.post("/v1/chat/completions", openapi_extra=request_body(ChatBody))
async def chat_completions(request: Request, ctx: Ctx) -> Response:
    tm, served = ctx.tm, ctx.served_model_name
    body = await read_body(request, ChatBody)
    check_model(body, served)
    stream, include_usage, logprobs = bool(body.stream), _include_usage(body), bool(body.logprobs)
    run = await submit_chat(request, ctx, body)
    agent, handle, n = run.agent, run.handle, run.n
    if stream:
        events = await open_stream(request, tm, handle)
        if events is None:
            return Response(status_code=499)
        opening = [_chat_choice(i, {"role": "assistant", "content": ""}) for i in range(len(handle.rids))]
        render = _chat_choices(logprobs) if agent.passthrough() else agent_chat_choices(agent, logprobs)
        return StreamingResponse(_sse_choices(tm, handle, events, "chat.completion.chunk", served, n,
                                              include_usage, opening, render),
                                 media_type="text/event-stream")
    results = await wait_results(request, tm, handle)
    if results is None:
        return Response(status_code=499)
    raise_for_errors(handle)
    choices = [agent.finish_choice(fmt.chat_choice(k, r, logprobs)) for k, r in enumerate(results)]
    return JSONResponse({**fmt.envelope("chat.completion", served, choices), "usage": fmt.usage(results, n)})


async def _check_strict(body: OpenAIBody, ctx: AppContext) -> None:
    schema = fmt.strict_schema(body.response_format)
    if schema is None:
        return
    grammar = ctx.grammar_config
    options = GrammarOptions(whitespace_pattern=grammar.constrained_json_whitespace_pattern)
    await asyncio.to_thread(fmt.check_strict, schema, grammar.grammar_backend, options)


def _chat_max_tokens(body: ChatBody, prompt_len: int, tm: TokenizerManager) -> Any:
    for given in (body.max_completion_tokens, body.max_tokens):
        if given is not None:
            return given
    room = min(tm.limits.context_len, tm.limits.max_total_tokens) - prompt_len
    if room < 1:
        raise ContextLengthError("the messages fill the whole context", param="messages")
    return room


def _echo_texts(tm: TokenizerManager, prepared: list[Any]) -> list[str]:
    return [tm.tokenizer.decode(p.msg.input_ids) for p in prepared]


Render = Callable[[int, Any, dict[str, Any], str, int], Iterator[dict[str, Any]]]


async def _sse_choices(tm: TokenizerManager, handle: RequestHandle, events: Events, kind: str, model: str, n: int,
                       include_usage: bool, opening: list[dict[str, Any]], render: Render) -> AsyncIterator[bytes]:
    """The SSE loop both /v1 streams share: the opening choices, then render(index, output, meta_info, new
    text, length sent before) -> the choices each output adds; errors in the stream, the usage chunk and
    [DONE] at the end; the request is aborted when the client stops reading early."""
    rid = fmt.envelope(kind, model, [])["id"]
    sent: dict[int, str] = defaultdict(str)
    try:
        for choice in opening:
            yield sse(fmt.envelope(kind, model, [choice], rid))
        async for index, out in events:
            if out.error is not None:
                yield stream_error(from_request_error(out.error))
                continue
            if out.payload is None:
                continue
            text = out.payload["text"]
            offset = len(sent[index])
            for choice in render(index, out, out.payload["meta_info"], text[offset:], offset):
                yield sse(fmt.envelope(kind, model, [choice], rid))
            sent[index] = text
        if include_usage:
            results = [handle.results[r] for r in handle.rids]
            yield sse({**fmt.envelope(kind, model, [], rid), "usage": fmt.usage(results, n)})
        yield SSE_DONE
    finally:
        if not handle.finished:
            tm.abort(handle)


def _completion_choices(logprobs: bool) -> Render:
    def render(index: int, out: Any, meta: dict[str, Any], delta: str, offset: int) -> Iterator[dict[str, Any]]:
        lp = None
        if logprobs:
            lp = fmt.completion_logprobs(meta.get("output_token_logprobs", []), meta.get("output_top_logprobs"), offset)
        reason, matched = fmt.finish_reason(meta) if out.finished else (None, None)
        if delta or out.finished or (lp and lp["tokens"]):
            choice = {"index": index, "text": delta, "logprobs": lp, "finish_reason": reason, "matched_stop": matched}
            yield fmt.with_finish_details(choice, meta) if out.finished else choice
    return render


def _chat_choice(index: int, delta: dict[str, Any], reason: Any = None, matched: Any = None, lp: Any = None
                 ) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason, "matched_stop": matched}


def _chat_choices(logprobs: bool) -> Render:
    def render(index: int, out: Any, meta: dict[str, Any], delta: str, offset: int) -> Iterator[dict[str, Any]]:
        entries = meta.get("output_token_logprobs", [])
        lp = fmt.chat_logprobs(entries, meta.get("output_top_logprobs")) if logprobs and entries else None
        if delta or lp:
            yield _chat_choice(index, {"content": delta}, lp=lp)
        if out.finished:
            yield fmt.with_finish_details(_chat_choice(index, {}, *fmt.finish_reason(meta)), meta)
    return render
