"""Cascade decode attention for a batch whose requests share a KV prefix (torch, CPU path).

Runs inside the scheduler process. With the radix cache, many decoding requests attend to the very
same slots first (a few-shot prefix, a forked program's trunk). Gathering every row's slots copies that
prefix once per request per layer, and on CPU the copy dominates decode. Here the shared prefix is read
once: all b*G query heads of a KV head meet it in one matmul, each request's own suffix is scored
separately, and one softmax over both parts merges them (exact, up to float reassociation).
"""

from __future__ import annotations

import torch

# Below this many shared tokens the plain padded path is as fast (and one code path is simpler).
MIN_SHARED_TOKENS = 64


def shared_prefix_len(slots: torch.Tensor, valid: torch.Tensor) -> int:
    """Leading columns where every row has the same slot and every row is valid. slots/valid [b, L]."""
    if slots.shape[0] < 2:
        return 0
    same = (slots == slots[:1]) & valid  # [b, L]
    col_ok = same.all(dim=0).to(torch.int32)
    return int(col_ok.cumprod(0).sum())


def cascade_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
                   valid: torch.Tensor, shared: int, scale: float) -> torch.Tensor:
    """q [b, Hq, D]; slots/valid [b, L] with slots[:, :shared] identical -> [b, Hq, D]."""
    b, hq, d = q.shape
    hkv = k_buf.shape[1]
    g = hq // hkv
    prefix = slots[0, :shared]
    kp = k_buf.index_select(0, prefix).permute(1, 2, 0)  # [Hkv, D, S]
    vp = v_buf.index_select(0, prefix).transpose(0, 1)  # [Hkv, S, D]
    qg = q.view(b, hkv, g, d)
    q_heads = qg.permute(1, 0, 2, 3).reshape(hkv, b * g, d)  # every request's heads of one KV head
    s_prefix = torch.matmul(q_heads, kp).view(hkv, b, g, shared).permute(1, 0, 2, 3)  # [b, Hkv, G, S]
    rest = slots[:, shared:]
    n_rest = rest.shape[1]
    ks = k_buf.index_select(0, rest.reshape(-1)).view(b, n_rest, hkv, d)
    vs = v_buf.index_select(0, rest.reshape(-1)).view(b, n_rest, hkv, d)
    s_rest = torch.einsum("bhgd,blhd->bhgl", qg, ks)  # [b, Hkv, G, R]
    s_rest = s_rest.masked_fill(~valid[:, None, None, shared:], float("-inf"))
    probs = (torch.cat([s_prefix, s_rest], dim=-1).float() * scale).softmax(dim=-1).to(q.dtype)
    p_prefix, p_rest = probs.split([shared, n_rest], dim=-1)
    o = torch.matmul(p_prefix.permute(1, 0, 2, 3).reshape(hkv, b * g, shared), vp)  # [Hkv, bG, D]
    o = o.view(hkv, b, g, d).permute(1, 0, 2, 3) + torch.einsum("bhgl,blhd->bhgd", p_rest, vs)
    return o.reshape(b, hq, d)
