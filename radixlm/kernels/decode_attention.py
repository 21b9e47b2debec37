"""Decode attention over the paged KV pool (split-K flash-decoding): Triton kernels, launcher, torch reference.

Runs in the scheduler process (model runner) on CUDA; tests run it under TRITON_INTERPRET=1 on CPU.
One query token per request: q [B, Hq, D] attends to the seq_lens[b] keys at slots
req_to_token[req_pool_indices[b], 0:seq_len] (the new token's K/V are already stored); with a sliding
window W > 0, to the last min(W, seq_len) of them only.
Stage 1: grid (B, Hk, num_kv_splits). Each program takes one KV head and one slice of the sequence and
handles all Hq/Hk query heads of that group at once, so each K/V row is read from memory once per KV
head (GQA grouping). It writes a partial output and its log-sum-exp (base 2) per split.
Stage 2: grid (B, Hq) merges the splits. Splits that a short sequence leaves empty write lse = -inf.
Rows with seq_len 0 (padding rows of a CUDA-graph batch) output zeros.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from radixlm.kernels._triton import (
    LazyKernel, check_device, dot_dtype, dot_precision, interpreting, next_pow2, tl,
)


def _decode_stage1_body(
    q_ptr, k_buf_ptr, v_buf_ptr, mid_o_ptr, mid_lse_ptr,
    req_to_token_ptr, req_pool_idx_ptr, seq_lens_ptr,
    sm_scale_log2, head_dim, kv_group, num_splits, window,
    stride_qb, stride_qh, stride_bs, stride_bh, stride_r2t, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    req_row = tl.load(req_pool_idx_ptr + b).to(tl.int64) * stride_r2t
    kv_start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)  # window 0: the whole sequence
    split_len = tl.cdiv(seq_len - kv_start, num_splits)
    split_start = kv_start + split * split_len
    split_end = tl.minimum(split_start + split_len, seq_len)

    g = tl.arange(0, BLOCK_H)
    g_mask = g < kv_group  # rows past the group are padding so tl.dot gets >= 16 rows
    heads = kv_head * kv_group + g
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    q = q.to(DOT_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n_start in range(split_start, split_end, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        n_mask = n < split_end
        slots = tl.load(req_to_token_ptr + req_row + n, mask=n_mask, other=0).to(tl.int64)
        kv_off = slots[:, None] * stride_bs + kv_head * stride_bh + d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_buf_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2
        # the first block of a non-empty split holds a valid key, so m_new is finite (no NaN)
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_buf_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    mid_o = b * stride_ob + heads * stride_oh + split * stride_os
    tl.store(mid_o_ptr + mid_o[:, None] + d[None, :], out, mask=q_mask)
    tl.store(mid_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


def _decode_stage2_body(
    mid_o_ptr, mid_lse_ptr, out_ptr, head_dim, num_splits,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_outb, stride_outh,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_mask = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    lse = tl.load(mid_lse_ptr + b * stride_lb + head * stride_lh + s, mask=s_mask, other=float("-inf"))
    # empty splits (lse = -inf) get weight 0; a row with seq_len 0 (CUDA-graph padding) has no
    # finite lse at all and outputs zeros instead of NaN
    lse_max = tl.max(lse, 0)
    weights = tl.exp2(lse - tl.where(lse_max == float("-inf"), 0.0, lse_max))
    parts_off = b * stride_ob + head * stride_oh + s[:, None] * stride_os + d[None, :]
    parts = tl.load(mid_o_ptr + parts_off, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    total = tl.sum(weights, 0)
    out = tl.sum(weights[:, None] * parts, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_outb + head * stride_outh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


_decode_stage1_kernel = LazyKernel(_decode_stage1_body)
_decode_stage2_kernel = LazyKernel(_decode_stage2_body)


def default_num_kv_splits(batch_size: int, num_kv_heads: int, num_sms: int) -> int:
    """Enough splits that stage 1 has about 2 programs per SM (long contexts at small batch need
    the sequence split to keep the GPU busy), capped at 32; depends only on host-known sizes, so a
    CUDA graph captured for one batch size keeps one split count."""
    programs = max(1, batch_size * num_kv_heads)
    return max(1, min(32, -(-2 * num_sms // programs)))


def _check(q, k_buffer, v_buffer, output, req_to_token, req_pool_indices, seq_lens) -> None:
    assert q.dim() == 3 and output.shape == q.shape, (q.shape, output.shape)
    assert k_buffer.dim() == 3 and k_buffer.shape == v_buffer.shape and k_buffer.stride() == v_buffer.stride()
    assert k_buffer.shape[2] == q.shape[2] and q.shape[1] % k_buffer.shape[1] == 0, (q.shape, k_buffer.shape)
    assert q.dtype == k_buffer.dtype == v_buffer.dtype, "q and the KV pool must share a dtype"
    assert q.stride(2) == 1 and output.stride(2) == 1 and k_buffer.stride(2) == 1, "head_dim must be contiguous"
    assert req_to_token.dim() == 2 and req_to_token.stride(1) == 1
    assert req_to_token.dtype in (torch.int32, torch.int64), req_to_token.dtype
    assert req_pool_indices.shape == (q.shape[0],) and seq_lens.shape == (q.shape[0],)
    assert req_pool_indices.dtype == seq_lens.dtype == torch.int64, (req_pool_indices.dtype, seq_lens.dtype)


def decode_attention(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, output: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
    num_kv_splits: int = 8, block_n: Optional[int] = None, window: int = 0,
) -> torch.Tensor:
    """Write decode attention into output [B, Hq, D] and return it. Rows with seq_lens[b] == 0 (padding
    of a CUDA-graph batch) get zeros. window > 0: each row attends to its last `window` keys only.

    No host synchronisation: safe to capture in a CUDA graph (the scratch buffers come from the
    caching allocator, which graph capture supports).
    """
    _check(q, k_buffer, v_buffer, output, req_to_token, req_pool_indices, seq_lens)
    check_device(q, k_buffer, v_buffer, output, req_to_token, req_pool_indices, seq_lens)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    if batch == 0:
        return output
    mid_o = torch.empty((batch, num_heads, num_kv_splits, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((batch, num_heads, num_kv_splits), dtype=torch.float32, device=q.device)
    block_d = max(16, next_pow2(head_dim))
    block_n = block_n or (32 if interpreting() else 64)
    extra = {} if interpreting() else {"num_warps": 4, "num_stages": 2}
    _decode_stage1_kernel[(batch, num_kv_heads, num_kv_splits)](
        q, k_buffer, v_buffer, mid_o, mid_lse, req_to_token, req_pool_indices, seq_lens,
        sm_scale * math.log2(math.e), head_dim, num_heads // num_kv_heads, num_kv_splits, window,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        BLOCK_H=max(16, next_pow2(num_heads // num_kv_heads)), BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_PRECISION=dot_precision(q.dtype), DOT_DTYPE=dot_dtype(q.dtype), **extra,
    )
    _decode_stage2_kernel[(batch, num_heads)](
        mid_o, mid_lse, output, head_dim, num_kv_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        output.stride(0), output.stride(1),
        BLOCK_S=next_pow2(num_kv_splits), BLOCK_D=block_d,
    )
    return output


def decode_attention_reference(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, window: int = 0,
) -> torch.Tensor:
    """Torch reference: per request, gather K/V through the slot table, plain softmax in fp32."""
    output = torch.empty_like(q)
    group = q.shape[1] // k_buffer.shape[1]
    for b in range(q.shape[0]):
        start = max(0, int(seq_lens[b]) - window) if window > 0 else 0
        slots = req_to_token[int(req_pool_indices[b]), start:int(seq_lens[b])].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        probs = (torch.einsum("hd,shd->hs", q[b].float(), k) * sm_scale).softmax(dim=-1)
        output[b] = torch.einsum("hs,shd->hd", probs, v).to(q.dtype)
    return output
