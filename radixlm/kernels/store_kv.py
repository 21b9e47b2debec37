"""Store the new tokens' K and V into one layer of the KV pool: Triton kernel, launcher, torch reference.

Runs in the scheduler process (model runner) on CUDA; tests run it under TRITON_INTERPRET=1 on CPU.
Pool layout per layer: k_buffer / v_buffer [num_slots, num_kv_heads, head_dim]; token t goes to slot
out_cache_loc[t]. Values are cast to the pool dtype (e.g. a bf16 pool fed fp32 activations).
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import LazyKernel, check_device, next_pow2, tl


def _store_kv_body(
    k_ptr, v_ptr, k_buf_ptr, v_buf_ptr, loc_ptr,
    num_heads, head_dim,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_bs, stride_bh,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    # slots are int64 so slot * stride never overflows int32 on large pools
    slot = tl.load(loc_ptr + tok).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_heads) & (d < head_dim)
    dst = slot * stride_bs + h * stride_bh + d
    k = tl.load(k_ptr + tok * stride_kt + h * stride_kh + d, mask=mask)
    tl.store(k_buf_ptr + dst, k.to(k_buf_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(v_buf_ptr + dst, v.to(v_buf_ptr.dtype.element_ty), mask=mask)


_store_kv_kernel = LazyKernel(_store_kv_body)


def _check(k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
           out_cache_loc: torch.Tensor) -> None:
    assert k.dim() == 3 and k.shape == v.shape, (k.shape, v.shape)
    assert k_buffer.dim() == 3 and k_buffer.shape == v_buffer.shape, (k_buffer.shape, v_buffer.shape)
    assert k.shape[1:] == k_buffer.shape[1:], f"token shape {k.shape[1:]} != pool shape {k_buffer.shape[1:]}"
    assert out_cache_loc.shape == (k.shape[0],) and out_cache_loc.dtype in (torch.int32, torch.int64)
    assert k_buffer.stride() == v_buffer.stride() and k_buffer.stride(2) == 1, "pool buffers must match"
    assert k.stride(2) == 1 and v.stride(2) == 1, "last dims must be contiguous"


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """k_buffer[out_cache_loc] = k; v_buffer[out_cache_loc] = v. k, v: [T, Hk, D]; buffers [S, Hk, D]."""
    _check(k, v, k_buffer, v_buffer, out_cache_loc)
    check_device(k, v, k_buffer, v_buffer, out_cache_loc)
    if k.shape[0] == 0:
        return
    _store_kv_kernel[(k.shape[0],)](
        k, v, k_buffer, v_buffer, out_cache_loc, k.shape[1], k.shape[2],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        BLOCK_H=next_pow2(k.shape[1]), BLOCK_D=next_pow2(k.shape[2]),
    )


def store_kv_reference(
    k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Torch reference (in place, same contract)."""
    k_buffer[out_cache_loc] = k.to(k_buffer.dtype)
    v_buffer[out_cache_loc] = v.to(v_buffer.dtype)
