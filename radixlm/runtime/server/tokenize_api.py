"""The tokenizer routes in vLLM's shapes (an APIRouter): POST /tokenize, POST /detokenize, GET /tokenizer_info.

Runs in the HTTP process. Eval harnesses probe these (lm-evaluation-harness's `local-completions` uses the
server's tokenizer when /tokenizer_info and /tokenize answer), so a client needs no local copy of the
tokenizer. Chat messages are rendered exactly as /v1/chat/completions renders them (chat_prompt.py), so the
ids /tokenize returns are the ids a chat request would run. Errors are the OpenAI envelope (robustness.md).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlm.errors import ContextLengthError, InvalidRequestError
from radixlm.runtime.server.bodies import DetokenizeBody, TokenizeBody, request_body
from radixlm.runtime.server.chat_prompt import chat_input_ids, normalize_messages
from radixlm.runtime.server.context import Ctx, off_loop
from radixlm.runtime.server.errors import APIError
from radixlm.runtime.server.http_server import read_body
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

router = APIRouter()

# tokenizer_config.json keys that are file paths on the server, not configuration (vLLM drops the first two).
_PATH_KEYS = ("vocab_file", "merges_file", "tokenizer_file")


def _check_model(model: str | None, served: str) -> None:
    if model is not None and model != served:
        raise APIError(404, f"the model {model[:100]!r} does not exist", "model", "model_not_found")


def _tokenize(tm: TokenizerManager, body: TokenizeBody) -> list[int]:
    """The body's ids: its prompt tokenized, or its messages through the chat template."""
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequestError("exactly one of prompt or messages is required", param="prompt")
    if body.prompt is not None:
        if len(body.prompt) > tm.limits.max_prompt_chars:
            raise ContextLengthError("the prompt is too long", param="prompt")
        special = True if body.add_special_tokens is None else body.add_special_tokens
        return list(tm.tokenizer(body.prompt, add_special_tokens=special).input_ids)
    generation = True if body.add_generation_prompt is None else body.add_generation_prompt
    if generation and body.continue_final_message:
        raise InvalidRequestError("add_generation_prompt and continue_final_message cannot both be true",
                                  param="continue_final_message")
    messages = normalize_messages(body.messages, tm.limits.max_prompt_chars)
    ids = chat_input_ids(tm.tokenizer, messages, body.tools, add_generation_prompt=generation,
                         continue_final_message=bool(body.continue_final_message))
    return _bos(tm.tokenizer) + ids if body.add_special_tokens else ids


def _bos(tokenizer) -> list[int]:
    """What add_special_tokens puts before a text (a BOS, for tokenizers that add one), for chat messages."""
    plain = list(tokenizer("a", add_special_tokens=False).input_ids)
    marked = list(tokenizer("a", add_special_tokens=True).input_ids)
    return next((marked[:i] for i in range(len(marked) - len(plain) + 1) if marked[i : i + len(plain)] == plain), [])


@router.post("/tokenize", openapi_extra=request_body(TokenizeBody))
async def tokenize(request: Request, ctx: Ctx) -> Response:
    body = await read_body(request, TokenizeBody)
    _check_model(body.model, ctx.served_model_name)
    tm = ctx.tm
    ids = await off_loop(_tokenize, tm, body)
    strs = await off_loop(tm.tokenizer.convert_ids_to_tokens, ids) if body.return_token_strs else None
    return JSONResponse({"count": len(ids), "max_model_len": ctx.model_info["context_length"], "tokens": ids,
                         "token_strs": strs})


def _detokenize(tm: TokenizerManager, ids: list[int]) -> str:
    for t in ids:
        if not 0 <= t < tm.limits.vocab_size:
            raise InvalidRequestError(f"token id {t} is outside the vocabulary", param="tokens")
    return tm.tokenizer.decode(ids)


@router.post("/detokenize", openapi_extra=request_body(DetokenizeBody))
async def detokenize(request: Request, ctx: Ctx) -> Response:
    body = await read_body(request, DetokenizeBody)
    _check_model(body.model, ctx.served_model_name)
    return JSONResponse({"prompt": await off_loop(_detokenize, ctx.tm, body.tokens)})


def tokenizer_info(tokenizer) -> dict[str, Any]:
    """vLLM's /tokenizer_info: the tokenizer's configuration (tokenizer_config.json as loaded, file paths left
    out), its class, the special tokens and the chat template."""
    info = {k: _jsonable(v) for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items() if k not in _PATH_KEYS}
    for name in ("eos_token", "bos_token", "pad_token", "unk_token"):
        info.setdefault(name, _jsonable(getattr(tokenizer, name, None)))
    info.setdefault("model_max_length", tokenizer.model_max_length)
    info["tokenizer_class"] = type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    return info


def _jsonable(value: Any) -> Any:
    if hasattr(value, "content"):  # an AddedToken
        return value.content
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf / NaN
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@router.get("/tokenizer_info")
async def get_tokenizer_info(ctx: Ctx) -> Response:
    return JSONResponse(await off_loop(tokenizer_info, ctx.tm.tokenizer))
