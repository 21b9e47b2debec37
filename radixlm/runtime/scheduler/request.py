"""Req: one generation request as the scheduler tracks it.

Runs in the scheduler process. Counters, not phases: a request's state is derived from
kv_len (tokens whose K/V are in the pool), len(input_ids) and len(output_ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixlm.radix_cache.token_logprobs import TokenLogprobs
from radixlm.runtime.messages import FinishReason  # noqa: F401 - the scheduler's name for it
from radixlm.sampling_params import SamplingParams


@dataclass
class LogprobRequest:
    """What logprobs the client asked for (wire-protocol.md semantics)."""

    return_logprob: bool = False
    logprob_start_len: int = -1  # -1 = last prompt token only
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None


@dataclass
class LogprobAccumulator:
    # Each entry: (logprob | None, token_id); top lists: list of (logprob, token_id) or None.
    input_token: list[tuple[float | None, int]] = field(default_factory=list)
    input_top: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_ids_logprob: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_token: list[tuple[float, int]] = field(default_factory=list)
    output_top: list[list[tuple[float, int]]] = field(default_factory=list)
    output_ids_logprob: list[list[tuple[float, int]]] = field(default_factory=list)


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    namespace: str = ""
    logprob: LogprobRequest = field(default_factory=LogprobRequest)
    arrival: int = 0  # admission order (FCFS, tie-breaks)

    output_ids: list[int] = field(default_factory=list)
    row: int | None = None  # row in ReqToTokenTable while it holds KV
    kv_len: int = 0  # tokens (prompt + output) whose K/V are in the pool
    cached_len: int = 0  # prompt tokens served from the radix cache at (first) admission
    prefix_len: int = 0  # tree-matched tokens the policy saw (lpm ordering)
    last_node: Any = None  # locked radix node (lock handle) or None
    tree_len: int = 0  # leading slots of the row that belong to the (locked) radix tree
    input_logprobs_done: bool = False
    input_logprobs_sent: bool = False  # prompt logprobs are computed once, not again after retraction
    finish: FinishReason | None = None
    generator: torch.Generator | None = None
    logprobs: LogprobAccumulator = field(default_factory=LogprobAccumulator)
    # The prompt logprobs this request computed, one entry a prompt token, for the radix tree (prompt_logprobs.py)
    prompt_logprobs: TokenLogprobs | None = None
    num_retractions: int = 0
    grammar: Any = None  # per-request grammar matcher (constrained decoding), or None
    num_jump_forward_tokens: int = 0
    first_admitted: bool = False
    num_spec_proposed: int = 0  # speculative decoding: draft tokens verified for this request
    num_spec_accepted: int = 0  # ... and accepted
    embed: bool = False  # an embedding request: prefill only, pooled at its last prompt token
    embedding: bytes | None = None  # ... its vector once computed (little-endian float32)

    @property
    def max_new_tokens(self) -> int:
        return self.params.max_new_tokens

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def full_ids(self) -> list[int]:
        """The sequence whose K/V the request needs: prompt plus outputs so far."""
        return self.input_ids + self.output_ids

    def ids_between(self, start: int, end: int) -> list[int]:
        """full_ids()[start:end] without building the whole sequence (a decode step reads one token of it
        per request; full_ids() copies every prompt and output token each time)."""
        n = len(self.input_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return self.input_ids[start:end]
        return self.input_ids[start:] + self.output_ids[: end - n]

    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def remaining_prefill(self) -> int:
        """Tokens still to compute before this request can sample (the last sampled token never has K/V
        until the next decode step, which is why decode computes exactly one token)."""
        return self.seq_len() - self.kv_len

    def wants_input_logprobs(self) -> bool:
        return self.logprob.return_logprob

    def logprob_start(self) -> int:
        """First prompt position covered by input logprobs (wire protocol: -1 = last prompt token)."""
        start = self.logprob.logprob_start_len
        n = len(self.input_ids)
        return n - 1 if start < 0 else min(start, n - 1)
