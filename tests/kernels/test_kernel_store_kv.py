"""Store-KV kernel vs its torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from radixlm.kernels.store_kv import store_kv, store_kv_reference  # noqa: E402


@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (2, 128), (3, 80)])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_reference(device, num_kv_heads, head_dim, pool_dtype):
    gen = torch.Generator().manual_seed(head_dim)
    num_slots, num_tokens = 40, 7
    loc = (torch.randperm(num_slots - 1, generator=gen)[:num_tokens] + 1).to(device)  # shuffled slots
    # k is a strided view (as from a fused qkv projection); fp32 activations into a bf16 pool get cast
    kv = torch.randn(num_tokens, 2, num_kv_heads, head_dim, generator=gen).to(device)
    k, v = kv[:, 0], kv[:, 1]
    k_buf = torch.full((num_slots, num_kv_heads, head_dim), float("nan"), dtype=pool_dtype, device=device)
    v_buf = k_buf.clone()
    want_k, want_v = k_buf.clone(), v_buf.clone()
    store_kv_reference(k, v, want_k, want_v, loc)
    store_kv(k, v, k_buf, v_buf, loc)
    # equal_nan: the untouched slots must still hold their poison; bf16 casts may differ by an ulp
    # because Triton's interpreter truncates where torch rounds
    exact = {"atol": 0.0, "rtol": 0.0} if pool_dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    torch.testing.assert_close(k_buf, want_k, equal_nan=True, **exact)
    torch.testing.assert_close(v_buf, want_v, equal_nan=True, **exact)
    assert torch.isnan(k_buf).sum() == (num_slots - num_tokens) * num_kv_heads * head_dim


def test_rejects_shape_mismatch(device):
    k = torch.randn(2, 1, 64, device=device)
    buf = torch.zeros(8, 2, 64, device=device)
    with pytest.raises(AssertionError):
        store_kv(k, k, buf, buf.clone(), torch.tensor([1, 2], device=device))
