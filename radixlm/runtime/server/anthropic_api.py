"""Anthropic's Messages API (an APIRouter): POST /v1/messages (streamed or not) and
POST /v1/messages/count_tokens.

Runs in the HTTP process. A request is translated (anthropic_format.to_chat) into the ChatBody that
/v1/chat/completions runs, and goes through the same chat pipeline: ChatAgent (tool-call grammar,
reasoning), the model's chat template, the same validation, tokenizer manager and detokenizer path. The
finished choice, or the stream of chat deltas, comes back in Anthropic's shapes. Errors on these paths are
Anthropic's error objects (anthropic_errors.AnthropicErrorMiddleware rewrites every error envelope).
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.runtime.server import anthropic_format as af
from radixlm.runtime.server import openai_format as fmt
from radixlm.runtime.server.bodies import MessagesBody, MessagesCountBody, request_body
from radixlm.runtime.server.chat_agent import ChatAgent
from radixlm.runtime.server.chat_prompt import chat_input_ids, normalize_messages
from radixlm.runtime.server.context import AppContext, Ctx, off_loop
from radixlm.runtime.server.errors import APIError, from_request_error
from radixlm.runtime.server.http_server import Events, open_stream, raise_for_errors, read_body, wait_results
from radixlm.runtime.server.tokenizer_manager import RequestHandle, TokenizerManager

router = APIRouter()


def _check_model(model: str | None, served: str) -> None:
    if model is not None and model != served:
        raise APIError(404, f"model: {model[:100]!r} is not served here (this server serves {served!r})",
                       "model", "model_not_found")


def _prompt_ids(tm: TokenizerManager, agent: ChatAgent, turn: af.MessagesTurn) -> list[int]:
    """Chat template (with the tool prompt) and tokenization; a prefill's tokens follow the generation prompt.
    CPU work: called on the tokenizer thread."""
    chat = turn.chat
    messages, tools = agent.render(normalize_messages(chat.messages, tm.limits.max_prompt_chars), chat.tools)
    ids = chat_input_ids(tm.tokenizer, messages, tools)
    if turn.prefill:  # the client's text: its special-token strings stay text
        ids += tm.tokenizer(turn.prefill, add_special_tokens=False, split_special_tokens=True).input_ids
    return ids


async def _render(body: MessagesCountBody, ctx: AppContext) -> tuple[af.MessagesTurn, ChatAgent, list[int]]:
    turn = af.to_chat(body)
    tm = ctx.tm
    # Lowering the tools' schemas is CPU work too: on the tokenizer thread, off the event loop.
    agent = await off_loop(ChatAgent, turn.chat.tool_fields(), tm.tokenizer, ctx.config, ctx.grammar_config)
    return turn, agent, await off_loop(_prompt_ids, tm, agent, turn)


@router.post("/v1/messages", openapi_extra=request_body(MessagesBody))
async def create_message(request: Request, ctx: Ctx) -> Response:
    tm, served = ctx.tm, ctx.served_model_name
    body = await read_body(request, MessagesBody)
    _check_model(body.model, served)
    stream = bool(body.stream)
    tm.check_admission(1)
    with af.anthropic_params():
        turn, agent, ids = await _render(body, ctx)
        params = agent.sampling_params(fmt.sampling_params(turn.chat, body.max_tokens))
        prepared, _ = await off_loop(tm.prepare, request.state.namespace, input_ids=ids, sampling_params=params,
                                     stream=stream)
    handle = tm.submit(prepared, stream, request.state.request_id)
    handle.settle = agent.settler()  # output checks in workers, before the message is built
    if stream:
        events = await open_stream(request, tm, handle)
        if events is None:
            return Response(status_code=499)
        sse = _message_events(tm, handle, events, agent, af.EventStream(served, body.stop_sequences))
        return StreamingResponse(sse, media_type="text/event-stream")
    results = await wait_results(request, tm, handle)
    if results is None:
        return Response(status_code=499)
    raise_for_errors(handle)
    choice = agent.finish_choice(fmt.chat_choice(0, results[0], False))
    return JSONResponse(af.finished_message(served, choice, results[0]["meta_info"], body.stop_sequences))


@router.post("/v1/messages/count_tokens", openapi_extra=request_body(MessagesCountBody))
async def count_tokens(request: Request, ctx: Ctx) -> Response:
    body = await read_body(request, MessagesCountBody)
    _check_model(body.model, ctx.served_model_name)
    with af.anthropic_params():
        _, _, ids = await _render(body, ctx)
    return JSONResponse({"input_tokens": len(ids)})


async def _message_events(tm: TokenizerManager, handle: RequestHandle, events: Events, agent: ChatAgent,
                          out: af.EventStream) -> AsyncIterator[bytes]:
    """message_start and ping, the content blocks as the chat pipeline's deltas arrive, then message_delta
    and message_stop; an error mid-stream is an `error` event that ends the stream. The request is aborted
    when the client stops reading early."""
    choice, started = agent.stream(), False
    try:
        async for _, item in events:
            if item.error is not None:
                err = from_request_error(item.error)
                yield af.sse_error(err.status, err.message)
                return
            if item.payload is None:
                continue
            meta: dict[str, Any] = item.payload["meta_info"]
            if not started:
                started = True
                for event in out.start(meta):
                    yield event
            for piece in choice.feed(item.payload["text"], item.finished):
                for event in out.feed(piece):
                    yield event
            if item.finished:
                reason, matched = fmt.finish_reason(meta)
                for event in out.finish(choice.finish_reason(reason), matched, meta):
                    yield event
    finally:
        if not handle.finished:
            tm.abort(handle)
