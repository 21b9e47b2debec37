"""Every message that crosses a process boundary: typed msgspec structs, encoded with msgpack. Never pickle.

Used by the HTTP/tokenizer process, the scheduler process and the detokenizer process; the in-process
Engine passes the same structs without encoding them.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec

# A logprob entry: [logprob | None, token_id]; text is attached later by the detokenizer if asked.
LogprobEntry = tuple[Optional[float], int]
TopLogprobs = Optional[list[tuple[float, int]]]


class TokenizedGenerateReq(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams.to_dict(), already validated
    namespace: str = ""  # radix-cache namespace decided by the server (tenant), never by the client
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    stream: bool = False


class AbortReq(msgspec.Struct, tag=True):
    rid: str = ""
    abort_all: bool = False


class FlushCacheReq(msgspec.Struct, tag=True):
    pass


class TokenOut(msgspec.Struct):
    """What one step produced for one request; token and logprob lists hold only the new part."""

    rid: str
    new_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish: Optional[dict[str, Any]] = None  # FinishReason.to_json() when finished
    output_logprobs: list[LogprobEntry] = []
    output_top_logprobs: list[TopLogprobs] = []
    output_ids_logprobs: list[TopLogprobs] = []
    input_logprobs: list[LogprobEntry] = []
    input_top_logprobs: list[TopLogprobs] = []
    input_ids_logprobs: list[TopLogprobs] = []
    num_jump_forward_tokens: int = 0


class BatchTokenOut(msgspec.Struct, tag=True):
    outputs: list[TokenOut]


_ENCODER = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _ENCODER.encode(msg)
