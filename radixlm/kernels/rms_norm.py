"""RMSNorm and fused residual-add + RMSNorm: Triton kernel, launchers, torch reference.

Runs in the scheduler process (model runner) on CUDA; tests run it under TRITON_INTERPRET=1 on CPU.
Rounding follows HF LlamaRMSNorm exactly: statistics in fp32, the normalised row is rounded to the
input dtype before the weight multiply, and the residual sum is rounded to the input dtype before it
is normalised (HF adds the residual in the model dtype).
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import LazyKernel, check_device, next_pow2, tl


def _rms_norm_body(
    x_ptr, res_ptr, w_ptr, out_ptr,
    n_cols, eps,
    stride_x, stride_res, stride_out,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # residual <- x + residual, rounded to the model dtype like HF's eager add
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_ptr + row * stride_res + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * inv_rms).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


_rms_norm_kernel = LazyKernel(_rms_norm_body)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    assert x.dim() >= 1 and x.shape[-1] == weight.shape[0] and weight.dim() == 1, (x.shape, weight.shape)
    assert x.stride(-1) == 1 and weight.stride(0) == 1, "last dim must be contiguous"
    assert x.dtype in (torch.float32, torch.float16, torch.bfloat16), x.dtype


def _rows(t: torch.Tensor) -> torch.Tensor:
    # [..., H] -> [N, H] without copying; rows may be strided (e.g. per-head views for q/k norm)
    return t.reshape(-1, t.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """out[..., H] = x / rms(x) * weight, normalised over the last dim. x: [..., H]; weight: [H]."""
    _check(x, weight)
    check_device(x, weight)
    x2 = _rows(x)
    out = torch.empty_like(x2)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, x2, weight, out, x2.shape[1], eps, x2.stride(0), x2.stride(0), out.stride(0),
        HAS_RESIDUAL=False, BLOCK=next_pow2(x2.shape[1]),
    )
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place); returns (rms_norm(residual), residual). x, residual: [N, H] same dtype."""
    _check(x, weight)
    assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, residual.dtype)
    assert residual.stride(-1) == 1 and x.dim() == 2, "fused add expects contiguous-last-dim [N, H]"
    check_device(x, residual, weight)
    out = torch.empty_like(x)
    _rms_norm_kernel[(x.shape[0],)](
        x, residual, weight, out, x.shape[1], eps, x.stride(0), residual.stride(0), out.stride(0),
        HAS_RESIDUAL=True, BLOCK=next_pow2(x.shape[1]),
    )
    return out, residual


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Torch reference (same arithmetic as transformers' LlamaRMSNorm)."""
    xf = x.to(torch.float32)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference; returns (normed, new_residual) without touching the inputs."""
    new_residual = x + residual
    return rms_norm_reference(new_residual, weight, eps), new_residual
