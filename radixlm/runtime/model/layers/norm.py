"""RMSNorm with the exact arithmetic of transformers' LlamaRMSNorm (fp32 statistics), so greedy outputs match.

Runs inside the scheduler process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps
        # The compiled CPU ops (radixlm.kernels.cpu) once the model runner has found that they apply (fp32
        # on the CPU, contiguous rows: cpu_ops.py); one op a call instead of torch's seven.
        self.native = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.native.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # torch's rms_norm does the same fp32 arithmetic in one call instead of seven (bit-identical
            # to the lines below, tests/runtime/test_norm.py): 25 vs 45 us a call at decode, 61 calls a
            # step for SmolLM2. Other dtypes keep transformers' order: cast, then scale in the input dtype.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """residual + x, then normalize: returns (normed, new residual). One call per sublayer. With the
        compiled ops the sum is written into `residual` itself (the caller's running residual, which
        nothing else holds: llama.py)."""
        if self.native is not None:
            return self.native.add_rms_norm(x, residual, self.weight, self.eps), residual
        residual = residual + x
        return self.forward(residual), residual


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm (transformers' Gemma3RMSNorm): scales by (1 + weight), both in fp32, and casts last.

    The checkpoint's weight is kept as is (the offset is added per call, in fp32 as transformers does): a
    stored 1 + weight rounded to bf16 would lose the weight's low bits.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + self.weight.float()
        if self.native is not None:
            return self.native.rms_norm(x, scale, self.eps)
        if x.dtype == torch.float32:
            return F.rms_norm(x, scale.shape, scale, self.eps)  # the same bits as the lines below
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * scale).to(x.dtype)

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.native is not None:
            return self.native.add_rms_norm(x, residual, 1.0 + self.weight.float(), self.eps), residual
        residual = residual + x
        return self.forward(residual), residual
