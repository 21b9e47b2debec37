"""Extend (prefill) attention over the paged KV pool: Triton kernel, launcher, torch reference.

Runs in the scheduler process (model runner) on CUDA; tests run it under TRITON_INTERPRET=1 on CPU.
A ragged batch of B requests: request b has prefix_lens[b] tokens already in the pool and
extend_len = seq_lens[b] - prefix_lens[b] new tokens, whose queries sit at rows
extend_start_loc[b] .. + extend_len of q [T, Hq, D]. The caller has already stored the new tokens' K/V
(store_kv), so every key of request b — cached prefix and new tokens — is read from the pool through
req_to_token[req_pool_indices[b], 0:seq_len]. New token i (position prefix + i) sees keys 0..prefix+i;
with a sliding window W > 0, keys prefix+i-W+1..prefix+i only.
Softmax and accumulation are fp32 (flash-attention online softmax, base 2).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from radixlm.kernels._triton import (
    LazyKernel, check_device, dot_dtype, dot_precision, interpreting, next_pow2, tl,
)


def _extend_attention_body(
    q_ptr, k_buf_ptr, v_buf_ptr, out_ptr,
    req_to_token_ptr, req_pool_idx_ptr, seq_lens_ptr, prefix_lens_ptr, start_loc_ptr,
    sm_scale_log2, head_dim, kv_group, window,
    stride_qt, stride_qh, stride_bs, stride_bh, stride_ot, stride_oh, stride_r2t,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    kv_head = head // kv_group  # GQA: query head -> its shared KV head
    seq_len = tl.load(seq_lens_ptr + b)
    prefix_len = tl.load(prefix_lens_ptr + b)
    extend_len = seq_len - prefix_len
    start = tl.load(start_loc_ptr + b)
    req_row = tl.load(req_pool_idx_ptr + b).to(tl.int64) * stride_r2t

    m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # index among this request's new tokens
    m_mask = m < extend_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    q_off = (start + m)[:, None] * stride_qt + head * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)
    q_pos = prefix_len + m  # absolute position of each query row

    # causal: this row block never needs keys past its last row; blocks past extend_len do no work
    kv_end = prefix_len + tl.minimum(extend_len, (m_block + 1) * BLOCK_M)
    kv_end = tl.where(m_block * BLOCK_M < extend_len, kv_end, 0)
    # sliding window: the block's first row sees nothing before its window (window 0: the whole prefix)
    kv_lo = tl.where(window > 0, tl.maximum(prefix_len + m_block * BLOCK_M - window + 1, 0), 0)
    kv_lo = (kv_lo // BLOCK_N) * BLOCK_N  # block-aligned slot loads; the mask below hides the extra keys
    lo_pos = tl.where(window > 0, q_pos - window, -1)  # each row sees keys after this position
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n_start in range(kv_lo, kv_end, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        n_mask = n < kv_end
        slots = tl.load(req_to_token_ptr + req_row + n, mask=n_mask, other=0).to(tl.int64)
        kv_off = slots[:, None] * stride_bs + kv_head * stride_bh + d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_buf_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2
        visible = (n[None, :] <= q_pos[:, None]) & (n[None, :] > lo_pos[:, None]) & n_mask[None, :]
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row can see no key of a block (a window starting past it): its max is still -inf, and
        # exp2(-inf - -inf) would be NaN. Subtracting 0 instead leaves its sums at 0.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(qk - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_buf_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = (start + m)[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


_extend_attention_kernel = LazyKernel(_extend_attention_body)


def _check(q, k_buffer, v_buffer, output, req_to_token, req_pool_indices, seq_lens, prefix_lens,
           extend_start_loc) -> None:
    assert q.dim() == 3 and output.shape == q.shape, (q.shape, output.shape)
    assert k_buffer.dim() == 3 and k_buffer.shape == v_buffer.shape and k_buffer.stride() == v_buffer.stride()
    assert k_buffer.shape[2] == q.shape[2] and q.shape[1] % k_buffer.shape[1] == 0, (q.shape, k_buffer.shape)
    assert q.dtype == k_buffer.dtype == v_buffer.dtype, "q and the KV pool must share a dtype"
    assert q.stride(2) == 1 and output.stride(2) == 1 and k_buffer.stride(2) == 1, "head_dim must be contiguous"
    assert req_to_token.dim() == 2 and req_to_token.stride(1) == 1
    assert req_to_token.dtype in (torch.int32, torch.int64), req_to_token.dtype
    batch = req_pool_indices.shape[0]
    for t in (req_pool_indices, seq_lens, prefix_lens, extend_start_loc):
        assert t.shape == (batch,) and t.dtype == torch.int64 and t.is_contiguous(), (t.shape, t.dtype)


def _cdiv_at_least_1(a: int, b: int) -> int:
    return max(1, (a + b - 1) // b)


def _default_blocks(head_dim: int, dtype: torch.dtype) -> tuple[int, int]:
    if interpreting():
        return 32, 32  # the interpreter pays per op, not per element: few big blocks are fastest
    if dtype == torch.float32:
        # exact fp32 dots take no tensor cores: 64x64 tiles spill registers and ran 14-30x slower than
        # 16x64 on an H200 (docs/benchmarks.md, "GPU")
        return 16, 64
    return (64, 64) if head_dim <= 128 else (32, 32)


def extend_attention(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, output: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    prefix_lens: torch.Tensor, extend_start_loc: torch.Tensor, sm_scale: float,
    max_extend_len: Optional[int] = None, block_m: Optional[int] = None, block_n: Optional[int] = None,
    window: int = 0,
) -> torch.Tensor:
    """Write attention of the new tokens into output [T, Hq, D] and return it (see module docstring).
    window > 0: a sliding window of that many keys per token.

    max_extend_len: the largest extend length, if the caller knows it on the host (saves a device sync).
    """
    _check(q, k_buffer, v_buffer, output, req_to_token, req_pool_indices, seq_lens, prefix_lens,
           extend_start_loc)
    check_device(q, k_buffer, v_buffer, output, req_to_token, req_pool_indices, seq_lens, prefix_lens)
    batch, num_heads, head_dim = req_pool_indices.shape[0], q.shape[1], q.shape[2]
    if batch == 0 or q.shape[0] == 0:
        return output
    if max_extend_len is None:
        max_extend_len = int((seq_lens - prefix_lens).max().item())
    default_m, default_n = _default_blocks(head_dim, q.dtype)
    block_m, block_n = block_m or default_m, block_n or default_n
    grid = (batch, num_heads, _cdiv_at_least_1(max_extend_len, block_m))
    extra = {} if interpreting() else {"num_warps": 4, "num_stages": 2}
    _extend_attention_kernel[grid](
        q, k_buffer, v_buffer, output, req_to_token, req_pool_indices, seq_lens, prefix_lens,
        extend_start_loc, sm_scale * math.log2(math.e), head_dim, num_heads // k_buffer.shape[1], window,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), output.stride(0), output.stride(1),
        req_to_token.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(head_dim)),
        DOT_PRECISION=dot_precision(q.dtype), DOT_DTYPE=dot_dtype(q.dtype), **extra,
    )
    return output


def extend_attention_reference(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, prefix_lens: torch.Tensor,
    extend_start_loc: torch.Tensor, sm_scale: float, window: int = 0,
) -> torch.Tensor:
    """Torch reference: per request, gather K/V through the slot table, causal mask offset by prefix (and
    the sliding window, window > 0), fp32."""
    output = torch.empty_like(q)
    group = q.shape[1] // k_buffer.shape[1]
    for b in range(req_pool_indices.shape[0]):
        seq_len, prefix_len = int(seq_lens[b]), int(prefix_lens[b])
        start, extend_len = int(extend_start_loc[b]), seq_len - prefix_len
        slots = req_to_token[int(req_pool_indices[b]), :seq_len].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        qb = q[start:start + extend_len].float()  # [E, Hq, D]
        scores = torch.einsum("ehd,shd->hes", qb, k) * sm_scale
        q_pos = torch.arange(prefix_len, seq_len, device=q.device)[:, None]
        kv_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = (kv_pos <= q_pos) & ((kv_pos > q_pos - window) if window > 0 else True)  # [E, S]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        output[start:start + extend_len] = torch.einsum("hes,shd->ehd", probs, v).to(q.dtype)
    return output
