"""Turn a native /generate-style input (single or batch, text or ids) into validated TokenizedGenerateReqs.

Runs where requests enter: the in-process Engine, and the server's tokenizer manager. This is the one
place sampling params are validated: every client mistake raises InvalidRequestError naming the field,
before anything reaches the scheduler, and the message carries the checked SamplingParams Struct, which
the scheduler and the detokenizer use as they are.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from radixlm.errors import ContextLengthError, InvalidRequestError
from radixlm.runtime.messages import TokenizedGenerateReq
from radixlm.sampling_params import MAX_TOP_LOGPROBS, SamplingParams, SamplingParamsIn


@dataclass(frozen=True)
class InputLimits:
    vocab_size: int
    context_len: int
    max_total_tokens: int
    max_prompt_chars: int = 1 << 20  # characters sent to the tokenizer are capped before tokenizing


@dataclass
class PreparedReq:
    """One prompt of the input, validated; n > 1 is expanded later into n scheduler requests."""

    index: int
    msg: TokenizedGenerateReq
    params: SamplingParams
    return_text_in_logprobs: bool


def prepare_generate(tokenizer, limits: InputLimits, *, text: Any = None, input_ids: Any = None,
                     sampling_params: Any = None, return_logprob: Any = False, logprob_start_len: Any = -1,
                     top_logprobs_num: Any = 0, token_ids_logprob: Any = None,
                     return_text_in_logprobs: bool = False, stream: bool = False, rid: Any = None,
                     namespace: str = "", embed: bool = False) -> tuple[list[PreparedReq], bool]:
    """Returns (prepared requests, is_batch). embed: embedding requests (prefill only, max_new_tokens 0)."""
    if embed:
        sampling_params = {"max_new_tokens": 0}
    prompts, is_batch = _prompts(tokenizer, limits, text, input_ids)
    count = len(prompts)
    params_list = _per_item(sampling_params, count, "sampling_params")
    logprob_flags = _per_item(return_logprob, count, "return_logprob")
    starts = _per_item(logprob_start_len, count, "logprob_start_len")
    tops = _per_item(top_logprobs_num, count, "top_logprobs_num")
    rids = _per_item(rid, count, "rid") if rid is not None else [None] * count
    out = []
    for i, ids in enumerate(prompts):
        params = _params(params_list[i])
        params.verify_vocab(limits.vocab_size)
        _check_lengths(ids, params, limits)
        msg = TokenizedGenerateReq(
            rid=str(rids[i]) if rids[i] is not None else uuid.uuid4().hex,
            input_ids=ids, sampling_params=params, namespace=namespace,
            return_logprob=_bool(logprob_flags[i], "return_logprob"),
            logprob_start_len=_int(starts[i], "logprob_start_len", -1, len(ids)),
            top_logprobs_num=_int(tops[i], "top_logprobs_num", 0, MAX_TOP_LOGPROBS),
            token_ids_logprob=_token_ids(token_ids_logprob, limits.vocab_size),
            stream=bool(stream), embed=embed)
        out.append(PreparedReq(i, msg, params, bool(return_text_in_logprobs)))
    return out, is_batch


def _params(value: Any) -> SamplingParams:
    """A decoded HTTP body's SamplingParamsIn, or a Python dict (Engine, frontend; None = defaults)."""
    if isinstance(value, SamplingParamsIn):
        return value.to_params()
    return SamplingParams.from_dict(value)


def _prompts(tokenizer, limits: InputLimits, text: Any, input_ids: Any) -> tuple[list[list[int]], bool]:
    if (text is None) == (input_ids is None):
        raise InvalidRequestError("exactly one of text or input_ids is required", param="text")
    if text is not None:
        is_batch = isinstance(text, list)
        texts = text if is_batch else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise InvalidRequestError("text must be a string or a non-empty list of strings", param="text")
        for t in texts:
            if len(t) > limits.max_prompt_chars:
                raise ContextLengthError("prompt text is too long", param="text")
        prompts = [list(tokenizer(t).input_ids) for t in texts]
    else:
        if not isinstance(input_ids, list) or not input_ids:
            raise InvalidRequestError("input_ids must be a non-empty list", param="input_ids")
        is_batch = isinstance(input_ids[0], list)
        prompts = input_ids if is_batch else [input_ids]
        for ids in prompts:
            _check_ids(ids, limits.vocab_size)
    for ids in prompts:
        if not ids:
            raise InvalidRequestError("the prompt is empty", param="text" if text is not None else "input_ids")
    return [list(p) for p in prompts], is_batch


def _check_ids(ids: Any, vocab_size: int) -> None:
    if not isinstance(ids, list):
        raise InvalidRequestError("input_ids must be a list of integers", param="input_ids")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidRequestError("input_ids must be integers", param="input_ids")
        if not 0 <= t < vocab_size:
            raise InvalidRequestError(f"token id {t} is outside the vocabulary", param="input_ids")


def _check_lengths(ids: list[int], params: SamplingParams, limits: InputLimits) -> None:
    need = len(ids) + params.max_new_tokens
    what = f"prompt ({len(ids)} tokens)" + (f" + max_new_tokens ({params.max_new_tokens})" if params.max_new_tokens
                                            else "")  # 0: an embedding or scoring request
    if need > limits.context_len:
        raise ContextLengthError(f"{what} exceeds the context length ({limits.context_len})", param="max_new_tokens")
    if need > limits.max_total_tokens:
        raise ContextLengthError(
            f"prompt + max_new_tokens ({need}) exceeds the KV cache capacity ({limits.max_total_tokens})",
            param="max_new_tokens")


def _per_item(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list) and name != "token_ids_logprob":
        if len(value) != count:
            raise InvalidRequestError(f"{name} has {len(value)} items for {count} prompts", param=name)
        return value
    return [value] * count


def _bool(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be a boolean", param=name)
    return value


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if value is None:
        return lo if lo >= 0 else -1
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer", param=name)
    if value != -1 or lo >= 0:
        if not lo <= value <= hi:
            raise InvalidRequestError(f"{name} must be in [{lo}, {hi}]", param=name)
    return value


def _token_ids(value: Any, vocab_size: int) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"token_ids_logprob must be a list of at most {MAX_TOP_LOGPROBS} ids",
                                  param="token_ids_logprob")
    _check_ids(value, vocab_size)
    return list(value)
