"""Kernel tests: Triton's CPU interpreter unless CUDA is present, plus a builder for paged ragged batches.

TRITON_INTERPRET must be set before any kernel is jitted (radixlm.kernels jits lazily at first launch,
so setting it here, before the tests run, is enough even if triton was imported earlier).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances: fp32 differs only by summation order; the interpreter truncates bf16."""
    return {"atol": 2e-4, "rtol": 2e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}


@dataclass
class PagedBatch:
    """A ragged batch over a paged KV pool, laid out exactly as the scheduler lays it out."""

    q: torch.Tensor  # [T, Hq, D] queries of the new tokens
    k_new: torch.Tensor  # [T, Hk, D]
    v_new: torch.Tensor  # [T, Hk, D]
    k_buffer: torch.Tensor  # [S, Hk, D]; slots no request owns hold NaN
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor  # [R, L]; entries past seq_len point at NaN slots
    req_pool_indices: torch.Tensor  # int64 [B]
    seq_lens: torch.Tensor  # int64 [B]
    prefix_lens: torch.Tensor  # int64 [B]
    extend_lens: torch.Tensor  # int64 [B]
    extend_start_loc: torch.Tensor  # int64 [B]
    out_cache_loc: torch.Tensor  # int64 [T]


def make_paged_batch(
    prefix_lens: list[int], extend_lens: list[int], num_kv_heads: int, group: int, head_dim: int,
    dtype: torch.dtype, device: torch.device, table_dtype: torch.dtype = torch.int32, seed: int = 0,
) -> PagedBatch:
    """Random batch whose slots are shuffled and non-contiguous; prefix K/V are already in the pool,
    the new tokens' K/V are not (the code under test must store them)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_slots, num_rows, max_len = 2 * sum(seq_lens) + 8, len(seq_lens) + 3, max(seq_lens) + 5
    slot_perm = torch.randperm(num_slots - 1, generator=gen) + 1  # slot 0 is the scheduler's scratch slot
    row_perm = torch.randperm(num_rows, generator=gen)[: len(seq_lens)]
    spare = slot_perm[sum(seq_lens):]  # never owned by a request: poisoned with NaN
    table = spare[torch.randint(len(spare), (num_rows, max_len), generator=gen)]
    kv_shape = (num_slots, num_kv_heads, head_dim)
    k_buffer = torch.full(kv_shape, float("nan"))
    v_buffer = torch.full(kv_shape, float("nan"))
    used, out_loc = 0, []
    for row, seq_len, prefix_len in zip(row_perm.tolist(), seq_lens, prefix_lens):
        slots = slot_perm[used:used + seq_len]
        used += seq_len
        table[row, :seq_len] = slots
        k_buffer[slots[:prefix_len]] = torch.randn(prefix_len, num_kv_heads, head_dim, generator=gen)
        v_buffer[slots[:prefix_len]] = torch.randn(prefix_len, num_kv_heads, head_dim, generator=gen)
        out_loc.append(slots[prefix_len:])
    num_tokens = sum(extend_lens)
    ext = torch.tensor(extend_lens, dtype=torch.int64)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    return PagedBatch(
        q=rand(num_tokens, num_kv_heads * group, head_dim),
        k_new=rand(num_tokens, num_kv_heads, head_dim),
        v_new=rand(num_tokens, num_kv_heads, head_dim),
        k_buffer=k_buffer.to(dtype=dtype, device=device),
        v_buffer=v_buffer.to(dtype=dtype, device=device),
        req_to_token=table.to(dtype=table_dtype, device=device),
        req_pool_indices=row_perm.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64, device=device),
        extend_lens=ext.to(device),
        extend_start_loc=(torch.cumsum(ext, 0) - ext).to(device),
        out_cache_loc=torch.cat(out_loc).to(device),
    )


@pytest.fixture
def paged_batch() -> Callable[..., PagedBatch]:
    return make_paged_batch


@pytest.fixture
def tol() -> Callable[[torch.dtype], dict[str, float]]:
    return tolerance


@pytest.fixture(scope="module", params=["native", "avx2"])
def ops(request):
    """radixlm's compiled CPU ops (radixlm/kernels/cpu), once per ISA build: the native one and the AVX2 one
    (the path an AVX2-only machine takes). The tests that use it skip where there is no compiler."""
    from radixlm.kernels.cpu import build

    built = build.load(request.param)
    assert built is not None, "the ops did not build (see the log)"
    return built
