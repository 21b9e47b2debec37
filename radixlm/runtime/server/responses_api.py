"""OpenAI's Responses API (an APIRouter): POST /v1/responses, GET and DELETE /v1/responses/{id}.

Runs in the HTTP process. A request is translated into the chat pipeline's ChatBody (responses_format.py)
and runs through openai_api.submit_chat: the same chat template, tool-call grammar, response_format
grammar and reasoning parser as /v1/chat/completions. Its output comes back as Responses items and typed
stream events (responses_output.py). Stored responses (responses_store.py) are per tenant.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, AsyncIterator, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.errors import InvalidRequestError
from radixlm.runtime.server import openai_format as fmt
from radixlm.runtime.server.bodies import ResponsesBody, request_body
from radixlm.runtime.server.context import AppContext, Ctx, off_loop
from radixlm.runtime.server.errors import APIError, from_invalid, from_request_error
from radixlm.runtime.server.http_server import Events, open_stream, raise_for_errors, read_body, wait_results
from radixlm.runtime.server.openai_api import ChatRun, check_model, submit_chat
from radixlm.runtime.server.responses_format import ChatPlan, chat_plan
from radixlm.runtime.server.responses_output import OutputBuilder, message_deltas, response_object
from radixlm.runtime.server.responses_store import ResponseStore, StoredResponse

router = APIRouter()

# Chat names in errors from the shared pipeline -> the Responses names the client sent.
_PARAMS = {"messages": "input", "response_format": "text.format", "json_schema": "text.format",
           "max_tokens": "max_output_tokens"}


def response_store(request: Request) -> ResponseStore:
    return request.app.state.responses_store


@contextmanager
def _responses_params() -> Iterator[None]:
    """Errors of the chat pipeline under the Responses field names."""
    try:
        yield
    except InvalidRequestError as exc:
        raise _renamed(from_invalid(exc)) from None
    except APIError as exc:
        raise _renamed(exc) from None


def _renamed(exc: APIError) -> APIError:
    param = _PARAMS.get(exc.param or "", exc.param)
    message = exc.message
    if exc.param and message.startswith(exc.param):  # "messages[2].content: ..." -> "input[2].content: ..."
        message = f"{param}{message[len(exc.param):]}".replace("text.format.json_schema.", "text.format.", 1)
    return APIError(exc.status, message, param, exc.code)


def _history(request: Request, body: ResponsesBody) -> list[dict[str, Any]]:
    if body.previous_response_id is None:
        return []
    stored = response_store(request).get(request.state.namespace, body.previous_response_id)
    if stored is None:
        raise APIError(400, f"Previous response with id {body.previous_response_id[:100]!r} not found.",
                       "previous_response_id", "previous_response_not_found")
    return stored.items


async def _reasoning_tokens(ctx: AppContext, thought: str) -> int:
    """The thought's length in tokens (re-tokenized: the output's ids are not split by the parser)."""
    if not thought:
        return 0
    return len((await off_loop(ctx.tm.tokenizer, thought, add_special_tokens=False)).input_ids)


def _store(request: Request, plan: ChatPlan, builder: OutputBuilder) -> None:
    if plan.echo["store"]:
        entry = StoredResponse(builder.response, plan.items + builder.items)
        response_store(request).put(request.state.namespace, entry)


@router.post("/v1/responses", openapi_extra=request_body(ResponsesBody))
async def create_response(request: Request, ctx: Ctx) -> Response:
    body = await read_body(request, ResponsesBody)
    check_model(body, ctx.served_model_name)
    with _responses_params():
        plan = chat_plan(body, _history(request, body))
        run = await submit_chat(request, ctx, plan.chat)
    builder = OutputBuilder(response_object(ctx.served_model_name, plan.echo))
    if plan.chat.stream:
        with _responses_params():  # a request the scheduler refuses (a grammar that does not compile)
            events = await open_stream(request, ctx.tm, run.handle)
        if events is None:
            return Response(status_code=499)
        return StreamingResponse(_sse_events(request, ctx, plan, run, builder, events),
                                 media_type="text/event-stream")
    results = await wait_results(request, ctx.tm, run.handle)
    if results is None:
        return Response(status_code=499)
    with _responses_params():
        raise_for_errors(run.handle)
    choice = run.agent.finish_choice(fmt.chat_choice(0, results[0], False))
    for delta in message_deltas(choice["message"]):
        builder.feed(delta)
    builder.finish(choice["finish_reason"], results[0]["meta_info"], await _reasoning_tokens(ctx, builder.thought))
    _store(request, plan, builder)
    return JSONResponse(builder.response)


def _sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _sse_events(request: Request, ctx: AppContext, plan: ChatPlan, run: ChatRun, builder: OutputBuilder,
                      events: Events) -> AsyncIterator[bytes]:
    """The typed event stream; the request is aborted when the client stops reading early."""
    stream = run.agent.stream()
    try:
        for event in builder.opening():
            yield _sse(event)
        async for _, out in events:
            if out.error is not None:
                for event in builder.fail(from_request_error(out.error)):
                    yield _sse(event)
                return
            if out.payload is None:
                continue
            for delta in stream.feed(out.payload["text"], out.finished):
                for event in builder.feed(delta):
                    yield _sse(event)
            if out.finished:
                meta = out.payload["meta_info"]
                reason = stream.finish_reason(fmt.finish_reason(meta)[0])
                reasoning = await _reasoning_tokens(ctx, builder.thought)
                for event in builder.finish(reason, meta, reasoning):
                    yield _sse(event)
                _store(request, plan, builder)
    finally:
        if not run.handle.finished:
            ctx.tm.abort(run.handle)


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id {response_id[:100]!r} not found.", None, "response_not_found")


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Response:
    stored = response_store(request).get(request.state.namespace, response_id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    if not response_store(request).delete(request.state.namespace, response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
