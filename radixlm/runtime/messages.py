"""Every message that crosses a process boundary: typed msgspec structs, encoded with msgpack. Never pickle.

Used by the HTTP/tokenizer process, the scheduler process and the detokenizer process; the in-process
Engine passes the same structs without encoding them.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

import msgspec

from radixlm.sampling_params import SamplingParams

# A logprob entry: [logprob | None, token_id]; text is attached later by the detokenizer if asked.
LogprobEntry = tuple[Optional[float], int]
TopLogprobs = Optional[list[tuple[float, int]]]


# ---- how a request ends, and why it failed (typed, shared by every process and the Engine) ---------
class FinishReason(msgspec.Struct, omit_defaults=True):
    """Why a request finished: stop (matched: the stop string, stop_regex pattern or token id, None for
    eos), length (length: the max_new_tokens reached), abort (message)."""

    type: Literal["stop", "length", "abort"]
    matched: Union[int, str, None] = None
    length: Optional[int] = None
    message: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """The native meta_info.finish_reason shape (wire-protocol.md)."""
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


class RequestError(msgspec.Struct, omit_defaults=True):
    """A request the scheduler refused or failed (it then also finishes as an abort). Set where the failure
    happens, carried typed to the HTTP route, which answers `status` with the error envelope
    (robustness.md); the Engine raises it (engine.py)."""

    code: str  # e.g. invalid_grammar, grammar_too_large, queue_full, internal_error, server_unhealthy
    message: str  # what the client is told (no internals)
    param: Optional[str] = None
    status: int = 400  # 400: the client's mistake; 503: overloaded or unhealthy; 500: a server bug


class TokenizedGenerateReq(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams  # validated once where the request entered (generate_input.py)
    namespace: str = ""  # radix-cache namespace decided by the server (tenant), never by the client
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    stream: bool = False
    # An embedding request (/v1/embeddings, Engine.encode): prefill only, its output is the pooled vector.
    embed: bool = False


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
    finish: Optional[FinishReason] = None  # set when finished
    output_logprobs: list[LogprobEntry] = []
    output_top_logprobs: list[TopLogprobs] = []
    output_ids_logprobs: list[TopLogprobs] = []
    input_logprobs: list[LogprobEntry] = []
    input_top_logprobs: list[TopLogprobs] = []
    input_ids_logprobs: list[TopLogprobs] = []
    num_jump_forward_tokens: int = 0
    # Jump-forward may re-tokenize the tail: drop this many previously sent tokens before appending
    # new_ids (the decoded text still only grows).
    num_rollback: int = 0
    # Speculative decoding: draft tokens verified for this request so far, and how many were accepted.
    num_spec_proposed: int = 0
    num_spec_accepted: int = 0
    # A request that was refused or failed (e.g. its grammar did not compile); finish is then an abort.
    error: Optional[RequestError] = None
    # An embedding request's final output: the pooled vector as little-endian float32 bytes.
    embedding: Optional[bytes] = None


class BatchTokenOut(msgspec.Struct, tag=True):
    outputs: list[TokenOut]


_ENCODER = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _ENCODER.encode(msg)


# ---- server processes (HTTP/tokenizer manager <-> scheduler <-> detokenizer) -----------------------
# Tags keep the union decoders unambiguous: each receiving socket decodes exactly one Union below.


class GenerateReq(msgspec.Struct, tag=True):
    """A validated native request as it travels tokenizer manager -> scheduler -> detokenizer. The
    scheduler runs one request per child rid (n > 1: child i samples with seed + i) and forwards this
    message to the detokenizer on the same socket as its outputs, so the detokenizer always knows a
    request before its first output."""

    req: TokenizedGenerateReq
    child_rids: list[str]
    return_text_in_logprobs: bool = False


class ControlReq(msgspec.Struct, tag=True):
    """A management call answered by a ControlResp with the same req_id. kind: server_info |
    flush_cache | debug_check | dashboard_snapshot (scheduler), debug_state (detokenizer); shutdown (both;
    no answer)."""

    req_id: str
    kind: str


class ControlResp(msgspec.Struct, tag=True):
    req_id: str
    ok: bool
    data: dict[str, Any] = {}
    error: str = ""


class ProcessReady(msgspec.Struct, tag=True):
    """Ready handshake: sent once by a child after its start-up work (the scheduler: model loaded)."""

    process: str  # scheduler | detokenizer
    pid: int
    info: dict[str, Any] = {}
    dp_rank: int = 0  # which data-parallel scheduler (--dp-size); 0 for the detokenizer


class Heartbeat(msgspec.Struct, tag=True):
    """Sent by the scheduler loop between steps; the tokenizer manager's watchdog and gauges read it."""

    num_forward_steps: int
    num_running: int
    num_waiting: int
    num_free_tokens: int
    num_total_tokens: int
    num_cached_tokens: int  # tokens held by the radix tree (evictable or locked)
    num_evictable_tokens: int = 0
    num_locked_tokens: int = 0
    grammar_compile_seconds: list[float] = []  # compiles finished since the previous heartbeat
    dp_rank: int = 0  # which data-parallel scheduler sent it (--dp-size)


class StrOut(msgspec.Struct, omit_defaults=True):
    """Detokenizer -> tokenizer manager for one request. `payload` has the native response dict's shape.
    The final update carries the whole response. A streaming request's earlier updates are deltas
    (`delta`): `text` holds only the newly visible text and `output_ids` only the new ids (after dropping
    the last `num_rollback` ids sent, see TokenOut.num_rollback), so bytes per update do not grow with the
    output; the tokenizer manager reassembles the cumulative shape (server/stream_assembly.py). A
    non-streaming request's earlier updates carry None, so the tokenizer manager can still time first
    and later tokens. A refused or failed request's final update carries `error`: the route answers
    it with error.status (the payload is never inspected for errors)."""

    rid: str
    num_new_tokens: int
    finished: bool
    payload: Optional[dict[str, Any]] = None
    delta: bool = False
    num_rollback: int = 0
    # Speculative decoding: draft tokens verified for this request so far, and how many were accepted.
    num_spec_proposed: int = 0
    num_spec_accepted: int = 0
    error: Optional[RequestError] = None  # set on the final update of a refused or failed request


class BatchStrOut(msgspec.Struct, tag=True):
    outputs: list[StrOut]
