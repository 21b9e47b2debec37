"""Neutral types of one forward pass, shared by the scheduler (which builds them) and the model (which runs them).

Runs in the scheduler process. A step is one flat batch of new tokens: request i contributes
`num_new[i]` tokens starting at sequence position `start[i]` (its kv_len before the step). Decode rows
are the case num_new == 1; a mixed step simply has both kinds of rows. This module imports neither
scheduler/ nor model/, so the model never depends on scheduler code (the scheduler drives the model).

Host-to-device copies (`to_device`) do not synchronise the host with the device. A plain `.to("cuda")` (or
`torch.tensor(list, device="cuda")`) from ordinary pageable memory is, in PyTorch, a cudaMemcpyAsync
followed by cudaStreamSynchronize: the host waits for every kernel queued before it. A copy from pinned
memory with non_blocking=True is queued like a kernel instead, so the host can go on planning while the
device works (SGLang stages its per-step inputs the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

ReqT = TypeVar("ReqT")


@dataclass
class AttentionMetadata:
    req_to_token: torch.Tensor  # int64 [max_requests, max_context]
    req_pool_indices: torch.Tensor  # int64 [B]
    seq_lens: torch.Tensor  # int64 [B]  KV length after this step (prefix + new)
    prefix_lens: torch.Tensor  # int64 [B] tokens already in the pool before this step
    extend_lens: torch.Tensor  # int64 [B] new tokens this step (decode: 1)
    extend_start_loc: torch.Tensor  # int64 [B] exclusive cumsum of extend_lens
    out_cache_loc: torch.Tensor  # int64 [T] slots of the new tokens
    is_decode: bool  # every request contributes exactly one token
    sm_scale: float
    # Host copies, so the torch backend can plan without device syncs.
    seq_lens_list: list[int]
    prefix_lens_list: list[int]
    extend_lens_list: list[int]
    extend_start_loc_list: list[int]
    # Backend-private values derived from the fields above, computed by the first layer and reused by
    # every other layer of the same forward (e.g. the padded slot block of the decode rows).
    plan_cache: dict = field(default_factory=dict)


@dataclass
class PlannedRow(Generic[ReqT]):
    req: ReqT  # the scheduler's Req: only the scheduler side reads it
    start: int  # sequence position of the first new token (= kv_len before the step)
    num_new: int
    # Speculative decoding: proposed tokens that follow the request's sequence; they are the row's last
    # len(draft) tokens, verified from the logits at every position of the row (runtime/speculative/).
    draft: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.num_new


@dataclass
class ForwardBatch(Generic[ReqT]):
    rows: list[PlannedRow[ReqT]]
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    meta: AttentionMetadata

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def token_index(self, row_idx: int, seq_pos: int) -> int:
        """Index in the flat token dim of sequence position seq_pos of row row_idx."""
        row = self.rows[row_idx]
        return self.meta.extend_start_loc_list[row_idx] + (seq_pos - row.start)


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` (a CPU tensor the caller no longer writes to) on `device`, without a host sync on CUDA.

    The pinned staging copy comes from PyTorch's caching host allocator, which records an event on the
    copy's stream, so the staging block is not reused before the device has read it. On other devices
    this is a plain `.to(device)` (a no-op on CPU)."""
    device = torch.device(device)
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
