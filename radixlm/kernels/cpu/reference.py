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
