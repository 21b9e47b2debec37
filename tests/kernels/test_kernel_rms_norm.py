"""RMSNorm kernels vs their torch reference, and the reference vs transformers' LlamaRMSNorm."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from radixlm.kernels.rms_norm import (  # noqa: E402
    fused_add_rms_norm, fused_add_rms_norm_reference, rms_norm, rms_norm_reference,
)

EPS = 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 96])  # 96: not a power of two, exercises the column mask
def test_rms_norm_matches_reference(device, tol, dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(5, hidden, generator=gen).to(dtype=dtype, device=device) * 3
    w = torch.randn(hidden, generator=gen).to(dtype=dtype, device=device)
    torch.testing.assert_close(rms_norm(x, w, EPS), rms_norm_reference(x, w, EPS), **tol(dtype))


def test_rms_norm_on_strided_per_head_view(device, tol):
    # q-norm (Qwen3) normalises each head of a [T, H, D] slice of a fused qkv tensor
    qkv = torch.randn(3, 4 * 32 + 64, device=device)
    q = qkv[:, : 4 * 32].view(3, 4, 32)
    w = torch.randn(32, device=device)
    torch.testing.assert_close(rms_norm(q, w, EPS), rms_norm_reference(q, w, EPS), **tol(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_matches_reference(device, tol, dtype):
    gen = torch.Generator().manual_seed(1)
    x, residual = (torch.randn(4, 80, generator=gen).to(dtype=dtype, device=device) for _ in range(2))
    w = torch.randn(80, generator=gen).to(dtype=dtype, device=device)
    want_out, want_res = fused_add_rms_norm_reference(x, residual, w, EPS)
    res = residual.clone()
    out, res_out = fused_add_rms_norm(x, res, w, EPS)
    assert res_out.data_ptr() == res.data_ptr(), "the residual is updated in place"
    torch.testing.assert_close(res, want_res, **tol(dtype))
    torch.testing.assert_close(out, want_out, **tol(dtype))


def test_reference_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(48, eps=EPS).to(torch.bfloat16)
    with torch.no_grad():
        hf.weight.normal_()
    x = torch.randn(6, 48).to(torch.bfloat16)
    torch.testing.assert_close(rms_norm_reference(x, hf.weight.data, EPS), hf(x), atol=0, rtol=0)


def test_launcher_rejects_mismatched_weight(device):
    with pytest.raises(AssertionError):
        rms_norm(torch.randn(2, 8, device=device), torch.randn(9, device=device), EPS)
