"""Cascade decode attention equals plain attention over each request's full slot list."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.model.layers.cascade import cascade_decode, shared_prefix_len


@pytest.mark.parametrize("hq, hkv", [(4, 4), (9, 3), (8, 1)])
def test_cascade_matches_reference(hq, hkv):
    g = torch.Generator().manual_seed(0)
    d, pool, b, shared = 16, 400, 5, 70
    k_buf = torch.randn(pool, hkv, d, generator=g)
    v_buf = torch.randn(pool, hkv, d, generator=g)
    perm = torch.randperm(pool - 1, generator=g) + 1
    prefix = perm[:shared]
    lens = [shared + 3, shared + 9, shared + 1, shared + 20, shared + 5]
    L = max(lens)
    slots = torch.zeros(b, L, dtype=torch.int64)
    valid = torch.zeros(b, L, dtype=torch.bool)
    used = shared
    for i, n in enumerate(lens):
        own = perm[used : used + n - shared]
        used += n - shared
        slots[i, :n] = torch.cat([prefix, own])
        valid[i, :n] = True
    assert shared_prefix_len(slots, valid) == shared
    q = torch.randn(b, hq, d, generator=g)
    out = cascade_decode(q, k_buf, v_buf, slots, valid, shared, d ** -0.5)
    for i, n in enumerate(lens):
        kk = k_buf[slots[i, :n]].transpose(0, 1).repeat_interleave(hq // hkv, 0)  # [Hq, n, D]
        vv = v_buf[slots[i, :n]].transpose(0, 1).repeat_interleave(hq // hkv, 0)
        ref = F.scaled_dot_product_attention(q[i][:, None], kk, vv).squeeze(1)
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-5)


def test_shared_prefix_stops_at_first_difference_or_padding():
    slots = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 5, 0]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    assert shared_prefix_len(slots, valid) == 2
    assert shared_prefix_len(slots[:1], valid[:1]) == 0
