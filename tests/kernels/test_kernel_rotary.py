"""Rotary embedding kernel vs its torch reference, and the reference vs transformers' Llama rotary code."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from radixlm.kernels.rotary import (  # noqa: E402
    apply_rotary_, build_cos_sin_cache, compute_inv_freq, rotary_reference,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(3, 1, 64), (8, 2, 128), (2, 2, 80)])
def test_rotary_matches_reference(device, tol, dtype, num_heads, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    cache = build_cos_sin_cache(compute_inv_freq(head_dim, 10000.0), 64).to(device)
    positions = torch.randint(0, 64, (5,), generator=gen).to(device)
    q = torch.randn(5, num_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    k = torch.randn(5, num_kv_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    want_q, want_k = rotary_reference(q, k, positions, cache)
    apply_rotary_(q, k, positions, cache)
    torch.testing.assert_close(q, want_q, **tol(dtype))
    torch.testing.assert_close(k, want_k, **tol(dtype))


def test_rotary_on_views_of_fused_qkv(device, tol):
    # q and k are usually strided views of one qkv projection output; the rotation must stay in place
    num_heads, num_kv_heads, head_dim = 4, 2, 64
    qkv = torch.randn(3, (num_heads + 2 * num_kv_heads) * head_dim, device=device)
    before = qkv.clone()
    q = qkv[:, : num_heads * head_dim].view(3, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(3, num_kv_heads, head_dim)
    cache = build_cos_sin_cache(compute_inv_freq(head_dim, 500000.0), 16).to(device)
    positions = torch.tensor([0, 7, 15], device=device)
    want_q, want_k = rotary_reference(q.clone(), k.clone(), positions, cache)
    apply_rotary_(q, k, positions, cache)
    torch.testing.assert_close(q, want_q, **tol(torch.float32))
    torch.testing.assert_close(k, want_k, **tol(torch.float32))
    v_cols = slice((num_heads + num_kv_heads) * head_dim, None)
    assert torch.equal(qkv[:, v_cols], before[:, v_cols]), "v must be untouched"


def test_reference_matches_transformers():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    head_dim, theta = 32, 10000.0
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2,
                         rope_theta=theta, max_position_embeddings=64)
    rope = LlamaRotaryEmbedding(config)
    positions = torch.tensor([0, 3, 9, 40, 63])
    q, k = torch.randn(5, 4, head_dim), torch.randn(5, 2, head_dim)
    cos, sin = rope(q, positions[None, :])
    # HF shapes: [batch, heads, seq, dim]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    cache = build_cos_sin_cache(compute_inv_freq(head_dim, theta), 64)
    got_q, got_k = rotary_reference(q, k, positions, cache)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
