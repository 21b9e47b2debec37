"""Embeddings routes (an APIRouter): POST /v1/embeddings (OpenAI's shape) and POST /encode (SGLang's native one).

Runs in the HTTP process. An input is validated and tokenized like a /generate prompt (runtime/generate_input.py,
embed=True: a prefill with max_new_tokens 0) and goes through the same scheduler, batched with generation and
sharing the radix cache. The vector (the last prompt token's final hidden state, after the final norm,
L2-normalized; runtime/sampling/pooling.py) arrives as little-endian float32 bytes: OpenAI's base64 payload
is exactly those bytes, encoded.
"""

from __future__ import annotations

import base64
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlm.errors import InvalidRequestError
from radixlm.runtime.server.bodies import EmbeddingBody, EncodeBody, request_body
from radixlm.runtime.server.context import AppContext, Ctx, off_loop
from radixlm.runtime.server.errors import APIError
from radixlm.runtime.server.http_server import raise_for_errors, read_body, wait_results

router = APIRouter()

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
ENCODING_FORMATS = ("float", "base64")


@router.post("/v1/embeddings", openapi_extra=request_body(EmbeddingBody))
async def embeddings(request: Request, ctx: Ctx) -> Response:
    body = await read_body(request, EmbeddingBody)
    if body.model is not None and body.model != ctx.served_model_name:
        raise APIError(404, f"the model {body.model[:100]!r} does not exist", "model", "model_not_found")
    encoding = body.encoding_format or "float"
    if encoding not in ENCODING_FORMATS:
        raise APIError(400, "encoding_format must be 'float' or 'base64'", "encoding_format", "invalid_value")
    hidden = ctx.model_info["hidden_size"]
    if body.dimensions is not None and body.dimensions != hidden:
        raise APIError(400, f"dimensions must be the model's hidden size ({hidden}): this model's embeddings are "
                            "not trained to be truncated", "dimensions", "invalid_value")
    text, ids = _split_input(body.input)
    with input_errors("input"):
        results, _ = await _encode(request, ctx, text=text, input_ids=ids)
    if results is None:
        return Response(status_code=499)
    data = [{"object": "embedding", "index": i, "embedding": _vector(r["embedding"], encoding)}
            for i, r in enumerate(results)]
    prompt = sum(r["meta_info"]["prompt_tokens"] for r in results)
    cached = sum(r["meta_info"]["cached_tokens"] for r in results)
    usage = {"prompt_tokens": prompt, "total_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}
    return JSONResponse({"object": "list", "data": data, "model": ctx.served_model_name, "usage": usage})


@router.post("/encode", openapi_extra=request_body(EncodeBody))
async def encode(request: Request, ctx: Ctx) -> Response:
    body = await read_body(request, EncodeBody)
    with input_errors(None):
        results, is_batch = await _encode(request, ctx, text=body.text, input_ids=body.input_ids, rid=body.rid)
    if results is None:
        return Response(status_code=499)
    out = [{"embedding": _vector(r["embedding"], "float"), "meta_info": r["meta_info"]} for r in results]
    return JSONResponse(out if is_batch else out[0])


async def _encode(request: Request, ctx: AppContext, **fields: Any) -> tuple[list[dict[str, Any]] | None, bool]:
    """(every prompt's native result, with its "embedding" bytes, in order, or None if the client went away;
    whether the input was a batch)."""
    tm = ctx.tm
    tm.check_admission(1)
    prepared, is_batch = await off_loop(tm.prepare, request.state.namespace, embed=True, **fields)
    handle = tm.submit(prepared, False, request.state.request_id)
    results = await wait_results(request, tm, handle)
    if results is not None:
        raise_for_errors(handle)
    return results, is_batch


@contextmanager
def input_errors(param: str | None) -> Iterator[None]:
    """Validation errors of the prompts: under `param` (OpenAI names every one `input`), else as they are."""
    try:
        yield
    except InvalidRequestError as exc:
        raise APIError(400, str(exc), param or exc.param, exc.code) from None


def _split_input(value: Any) -> tuple[Any, Any]:
    """(text, input_ids) for the native request from an OpenAI `input`; an empty one is refused, as OpenAI does."""
    if isinstance(value, str):
        if not value:
            raise APIError(400, "input must not be an empty string", "input", "invalid_value")
        return value, None
    if not isinstance(value, list) or not value:
        raise APIError(400, "input must be a non-empty string, list of strings, token ids, or list of token-id lists",
                       "input", "invalid_value")
    if all(isinstance(v, int) for v in value):  # one prompt's token ids (its length: the context's limit)
        return None, value
    if len(value) > MAX_INPUTS:
        raise APIError(400, f"input must have at most {MAX_INPUTS} items", "input", "invalid_value")
    if all(isinstance(v, str) for v in value):
        if not all(value):
            raise APIError(400, "input must not contain an empty string", "input", "invalid_value")
        return value, None
    if all(isinstance(v, list) for v in value):
        if not all(value):
            raise APIError(400, "input must not contain an empty token list", "input", "invalid_value")
        return None, value
    raise APIError(400, "input must not mix strings, token ids and token lists", "input", "invalid_value")


def _vector(data: bytes | None, encoding: str) -> list[float] | str:
    if data is None:  # ended without a vector: aborted (/abort_request, a drain), not the client's mistake
        raise APIError(503, "the embedding request was aborted before it finished", None, "aborted")
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    return np.frombuffer(data, dtype="<f4").tolist()
