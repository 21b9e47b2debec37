"""Torch references of the compiled CPU ops (what tests/kernels/test_cpu_ops.py compares them with)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, new residual) for residual + x."""
    residual = residual + x
    return rms_norm(residual, weight, eps), residual


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
    """x @ (scales[:, None] * qweight).T + bias, for int8 qweight [out, in] (the op takes pack_rows(qweight))."""
    return F.linear(x, qweight.float() * scales.float()[:, None], bias)


def rope_store_kv(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_buf: torch.Tensor,
                  v_buf: torch.Tensor, loc: torch.Tensor, num_q_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Rotate q and k of the fused qkv [T, (Hq + 2 Hkv) D] (HF rotate_half: x * cos + roll(x) * signed_sin,
    cos/signed_sin [T, 1, D]), store k and v at pool slots loc, return q [T, Hq, D]."""
    d = cos.shape[-1]
    t = qkv.shape[0]
    heads = qkv[:, : (num_q_heads + 2 * num_kv_heads) * d].reshape(t, num_q_heads + 2 * num_kv_heads, d)
    qk = heads[:, : num_q_heads + num_kv_heads]
    rotated = qk * cos.view(t, 1, d) + torch.roll(qk, d // 2, dims=-1) * signed_sin.view(t, 1, d)
    k_buf[loc] = rotated[:, num_q_heads:]
    v_buf[loc] = heads[:, num_q_heads + num_kv_heads :]
    return rotated[:, :num_q_heads].contiguous()


def paged_decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                           req_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [b, Hq, D], one query per row, attending to its row's first seq_lens[r] slots (SDPA per row)."""
    out = torch.empty_like(q)
    for r in range(q.shape[0]):
        slots = req_to_token[int(req_rows[r]), : int(seq_lens[r])]
        k = k_buf.index_select(0, slots).transpose(0, 1)[None]  # [1, Hkv, L, D]
        v = v_buf.index_select(0, slots).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(q[r, :, None][None], k, v, scale=scale,
                                           enable_gqa=k.shape[1] != q.shape[1])
        out[r] = o[0, :, 0]
    return out


def paged_extend_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                           req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor, scale: float
                           ) -> torch.Tensor:
    """q [T, Hq, D], the new tokens of each row in turn; token j of row r attends causally to its row's first
    prefix_lens[r] + j + 1 slots (SDPA per row with a bottom-right causal mask)."""
    out = torch.empty_like(q)
    start = 0
    for r in range(req_rows.shape[0]):
        p, n = int(prefix_lens[r]), int(extend_lens[r])
        slots = req_to_token[int(req_rows[r]), : p + n]
        k = k_buf.index_select(0, slots).transpose(0, 1)[None]  # [1, Hkv, p + n, D]
        v = v_buf.index_select(0, slots).transpose(0, 1)[None]
        mask = torch.ones(n, p + n, dtype=torch.bool).tril(diagonal=p)
        o = F.scaled_dot_product_attention(q[start : start + n].transpose(0, 1)[None], k, v, attn_mask=mask,
                                           scale=scale, enable_gqa=k.shape[1] != q.shape[1])
        out[start : start + n] = o[0].transpose(0, 1)
        start += n
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2I] (gate columns first)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def argmax_linear(logits: torch.Tensor) -> torch.Tensor:
    """What argmax_linear returns for one row of full logits (f32_linear's): each logit that could be the
    row's argmax kept, the rest -inf. The op keeps every logit within its error bound of the largest; this
    reference keeps only the largest and its ties, the set every correct answer contains."""
    return torch.where(logits == logits.max(), logits, torch.full_like(logits, float("-inf")))
