"""Rotary position embedding (HF "rotate_half" / neox layout), in place on q and k: kernel, launcher, reference.

Runs in the scheduler process (model runner) on CUDA; tests run it under TRITON_INTERPRET=1 on CPU.
Layout: the first half of each head is rotated against the second half,
out[:d/2] = x1*cos - x2*sin, out[d/2:] = x2*cos + x1*sin, with cos/sin looked up by position in a
cache [max_positions, head_dim] holding cos(pos*inv_freq) in its first half and sin in its second.
Any rope scaling (llama3, linear, ...) is folded into `inv_freq` when the cache is built.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import LazyKernel, check_device, next_pow2, tl


def _rotary_body(
    x_ptr, pos_ptr, cache_ptr,
    num_heads, half_dim,
    stride_xt, stride_xh, stride_cache,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # one program = one token, every head of q (or k) at once, so cos/sin are loaded once per token
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < half_dim
    cos = tl.load(cache_ptr + pos * stride_cache + d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + half_dim + d, mask=d_mask, other=0.0).to(tl.float32)
    h = tl.arange(0, BLOCK_H)
    mask = (h[:, None] < num_heads) & d_mask[None, :]
    p1 = x_ptr + tok * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + half_dim, mask=mask, other=0.0)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    tl.store(p1, (x1f * cos[None, :] - x2f * sin[None, :]).to(x1.dtype), mask=mask)
    tl.store(p1 + half_dim, (x2f * cos[None, :] + x1f * sin[None, :]).to(x2.dtype), mask=mask)


_rotary_kernel = LazyKernel(_rotary_body)


def compute_inv_freq(head_dim: int, rope_theta: float) -> torch.Tensor:
    """Default (unscaled) rope frequencies, as in transformers: 1 / theta^(2i/d), fp32 [head_dim/2]."""
    return 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def build_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """cos_sin_cache [max_positions, 2*len(inv_freq)] fp32: cos in the first half, sin in the second."""
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq.float())
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _launch(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> None:
    num_tokens, num_heads, head_dim = x.shape
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        x, positions, cache, num_heads, half, x.stride(0), x.stride(1), cache.stride(0),
        BLOCK_H=next_pow2(num_heads), BLOCK_D=next_pow2(half),
    )


def apply_rotary_(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place; positions int64 [T] index rows of cos_sin_cache [P, D]."""
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] == positions.shape[0], (q.shape, k.shape)
    head_dim = q.shape[2]
    assert k.shape[2] == head_dim and head_dim % 2 == 0, "q and k share an even head_dim"
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim, "partial rotary is not supported"
    assert cos_sin_cache.stride(1) == 1 and q.stride(2) == 1 and k.stride(2) == 1, "last dims must be contiguous"
    assert positions.dtype in (torch.int32, torch.int64) and q.dtype == k.dtype, (positions.dtype, q.dtype)
    check_device(q, k, positions, cos_sin_cache)
    if q.shape[0] == 0:
        return
    _launch(q, positions, cos_sin_cache)
    _launch(k, positions, cos_sin_cache)


def rotary_reference(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference (transformers' apply_rotary_pos_emb, computed in fp32); returns new tensors."""
    half = q.shape[-1] // 2
    cos, sin = cos_sin_cache[positions].float().split(half, dim=-1)
    cos = torch.cat([cos, cos], dim=-1)[:, None, :]  # [T, 1, D]
    sin = torch.cat([sin, sin], dim=-1)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)

    return rotate(q), rotate(k)
