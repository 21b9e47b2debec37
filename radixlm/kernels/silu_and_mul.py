"""SiLU-and-mul (the gated MLP activation): Triton kernel, launcher, torch reference.

Runs in the scheduler process (model runner) on CUDA; tests run it under TRITON_INTERPRET=1 on CPU.
Input is the fused gate_up projection [N, 2*I] (gate first, then up, as the model loader stacks them);
output is silu(gate) * up [N, I], computed in fp32 and rounded once.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import LazyKernel, check_device, next_pow2, tl

_BLOCK = 1024


def _silu_and_mul_body(
    x_ptr, out_ptr, inter, stride_x, stride_out,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


_silu_and_mul_kernel = LazyKernel(_silu_and_mul_body)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [N, 2*I] -> silu(x[:, :I]) * x[:, I:] as [N, I] in x's dtype."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0, x.shape
    assert x.stride(1) == 1, "last dim must be contiguous"
    check_device(x)
    num_rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_rows, inter), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    block = min(_BLOCK, next_pow2(inter))
    grid = (num_rows, (inter + block - 1) // block)
    _silu_and_mul_kernel[grid](x, out, inter, x.stride(0), out.stride(0), BLOCK=block)
    return out


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """Torch reference, fp32 math."""
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
