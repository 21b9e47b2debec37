"""OpenAI /v1 request -> native sampling params, and native results -> OpenAI response objects.

Runs in the HTTP process. Pure functions over dicts, so the conversion is tested without a server.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from radixlm.constrained.schema_lower import LISTED_ONLY_KEYWORD
from radixlm.errors import InvalidRequestError
from radixlm.runtime.server.bodies import PASSTHROUGH, OpenAIBody
from radixlm.sampling_params import MAX_TOP_LOGPROBS

# OpenAI field -> native sampling key; extensions (wire-protocol.md, bodies.PASSTHROUGH) keep their names.
_RENAMED = {"seed": "sampling_seed", "min_tokens": "min_new_tokens"}
# Native param name in an error -> the /v1 name the client actually sent.
OPENAI_PARAM_NAMES = {"max_new_tokens": "max_tokens", "sampling_seed": "seed", "min_new_tokens": "min_tokens"}


def sampling_params(body: OpenAIBody, max_tokens: Any, least: int = 1) -> dict[str, Any]:
    """The native sampling_params of a decoded /v1 body (types already checked; values are checked with
    every native request's, in generate_input.py). least: the smallest max_tokens allowed (0: /v1/completions
    with echo, which then returns the prompt's logprobs alone, as vLLM does)."""
    if max_tokens < least:
        raise InvalidRequestError(f"max_tokens must be an integer >= {least}", param="max_tokens")
    params: dict[str, Any] = {"max_new_tokens": max_tokens}
    for key in PASSTHROUGH:
        if getattr(body, key) is not None:
            params[key] = getattr(body, key)
    for key, native in _RENAMED.items():
        if getattr(body, key) is not None:
            params[native] = getattr(body, key)
    params.update(_response_format(body.response_format))
    return params


def _response_format(fmt: Any) -> dict[str, Any]:
    if fmt is None:
        return {}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequestError("response_format.type must be text, json_object or json_schema",
                                  param="response_format")
    if fmt["type"] == "text":
        return {}
    if fmt["type"] == "json_object":
        return {"json_schema": json.dumps({"type": "object"})}
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidRequestError("response_format.json_schema.schema must be an object", param="response_format")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise InvalidRequestError("response_format.json_schema.strict must be a boolean", param="response_format")
    if spec.get("strict") is True:  # OpenAI's strict mode: an object that lists properties takes only those
        return {"json_schema": json.dumps({**spec["schema"], LISTED_ONLY_KEYWORD: True})}
    return {"json_schema": json.dumps(spec["schema"])}


def strict_schema(fmt: dict[str, Any] | None) -> str | None:
    """The schema text of a `response_format` with `json_schema.strict: true`, else None."""
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        spec = fmt["json_schema"]
        if spec.get("strict") is True and isinstance(spec.get("schema"), dict):
            return json.dumps(spec["schema"])
    return None


def check_strict(schema: str, backend: str, options: Any) -> None:
    """OpenAI strict mode: refuse (400, naming the keyword) a schema the grammar would enforce only
    approximately on this backend; non-strict requests get the best-effort grammar (outputs still validated).
    Lowering is pure CPU work on a size-limited schema: callers run it off the event loop."""
    from radixlm.constrained.errors import GrammarError
    from radixlm.constrained.schema_lower import lower_schema

    try:
        lowered = lower_schema(schema, options, backend, listed_only=True)
    except GrammarError as e:
        raise InvalidRequestError(e.message, param="response_format", code=e.code) from None
    if lowered.approximations:
        raise InvalidRequestError(
            f"strict mode: {lowered.approximations[0]} cannot be enforced exactly while decoding (with "
            f"the {backend} grammar backend); send strict: false to decode it best-effort (the finished output "
            "is still validated, see finish_details)", param="response_format", code="invalid_grammar")


def check_logprobs_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}]", param=name)
    return value


def finish_reason(meta: dict[str, Any]) -> tuple[str | None, Any]:
    finish = meta.get("finish_reason")
    if not finish:
        return None, None
    return finish["type"], finish.get("matched")


def finish_details(meta: dict[str, Any]) -> dict[str, Any] | None:
    """For json_schema / json_object requests: whether the finished output validated (the native
    meta_info's json_schema_valid / json_schema_error), else None."""
    if "json_schema_valid" not in meta:
        return None
    details = {"json_schema_valid": meta["json_schema_valid"]}
    if "json_schema_error" in meta:
        details["json_schema_error"] = meta["json_schema_error"]
    return details


def with_finish_details(choice: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The choice with `finish_details` added when the request had a schema (other choices keep their shape)."""
    details = finish_details(meta)
    if details is not None:
        choice["finish_details"] = details
    return choice


def usage(results: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Prompt and cached tokens count once per prompt (not per n child), completion tokens per choice."""
    firsts = results[::n]
    prompt = sum(r["meta_info"]["prompt_tokens"] for r in firsts)
    completion = sum(r["meta_info"]["completion_tokens"] for r in results)
    cached = sum(r["meta_info"]["cached_tokens"] for r in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def envelope(kind: str, model: str, choices: list[dict[str, Any]], rid: str | None = None) -> dict[str, Any]:
    prefix = "cmpl-" if kind == "text_completion" else "chatcmpl-"
    return {"id": rid or prefix + uuid.uuid4().hex, "object": kind, "created": int(time.time()), "model": model,
            "choices": choices}


# ---- logprobs -------------------------------------------------------------------------------------
def completion_logprobs(entries: list[list], tops: list | None, text_start: int) -> dict[str, Any]:
    """Native [logprob, id, text] entries -> the completions `logprobs` object."""
    tokens, offsets, offset = [], [], text_start
    for entry in entries:
        tokens.append(entry[2] or "")
        offsets.append(offset)
        offset += len(entry[2] or "")
    top = None if tops is None else [None if t is None else {e[2]: e[0] for e in t} for t in tops]
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries], "top_logprobs": top,
            "text_offset": offsets}


def chat_logprobs(entries: list[list], tops: list | None) -> dict[str, Any]:
    def item(e: list) -> dict[str, Any]:
        text = e[2] or ""
        return {"token": text, "logprob": e[0], "bytes": list(text.encode("utf-8"))}

    content = []
    for i, entry in enumerate(entries):
        top = tops[i] if tops is not None and i < len(tops) and tops[i] is not None else []
        content.append({**item(entry), "top_logprobs": [item(t) for t in top]})
    return {"content": content}


def completion_choice(index: int, result: dict[str, Any], logprobs: bool, echo_text: str | None) -> dict[str, Any]:
    meta = result["meta_info"]
    reason, matched = finish_reason(meta)
    text = (echo_text or "") + result["text"]
    lp = None
    if logprobs:
        entries = list(meta.get("output_token_logprobs", []))
        tops = meta.get("output_top_logprobs")
        if echo_text is not None:
            entries = list(meta.get("input_token_logprobs", [])) + entries
            tops = None if tops is None else list(meta.get("input_top_logprobs", [])) + tops
        lp = completion_logprobs(entries, tops, 0)
    return with_finish_details({"index": index, "text": text, "logprobs": lp, "finish_reason": reason,
                                "matched_stop": matched}, meta)


def chat_choice(index: int, result: dict[str, Any], logprobs: bool) -> dict[str, Any]:
    meta = result["meta_info"]
    reason, matched = finish_reason(meta)
    lp = chat_logprobs(meta.get("output_token_logprobs", []), meta.get("output_top_logprobs")) if logprobs else None
    return with_finish_details({"index": index, "message": {"role": "assistant", "content": result["text"]},
                                "logprobs": lp, "finish_reason": reason, "matched_stop": matched}, meta)
