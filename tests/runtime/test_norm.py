"""RMSNorm (runtime/model/layers/norm.py) is bit-identical to transformers' LlamaRMSNorm in every dtype."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from radixlm.runtime.model.layers.norm import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim,eps", [(64, 1e-6), (576, 1e-5), (2048, 1e-6)])
def test_rms_norm_matches_transformers_bit_for_bit(dtype, dim, eps):
    g = torch.Generator().manual_seed(dim)
    ours, ref = RMSNorm(dim, eps), LlamaRMSNorm(dim, eps)
    weight = torch.randn(dim, generator=g)
    ours.weight.data.copy_(weight)
    ref.weight.data.copy_(weight)
    ours.to(dtype)
    ref.to(dtype)
    for shape in [(1, dim), (37, dim), (5, 3, dim)]:  # decode row, a prefill chunk, per-head (q/k norm)
        x = (torch.randn(*shape, generator=g) * 4).to(dtype)
        with torch.no_grad():
            assert torch.equal(ours(x), ref(x))
    residual = torch.randn(4, dim, generator=g).to(dtype)
    x = torch.randn(4, dim, generator=g).to(dtype)
    with torch.no_grad():
        normed, new_residual = ours.forward_residual(x, residual)
        assert torch.equal(new_residual, residual + x) and torch.equal(normed, ref(residual + x))
