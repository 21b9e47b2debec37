"""SiLU-and-mul kernel vs its torch reference, and the reference vs the HF MLP formula."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from radixlm.kernels.silu_and_mul import silu_and_mul, silu_and_mul_reference  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter", [64, 1500])  # 1500: several column blocks and a ragged last block
def test_silu_and_mul_matches_reference(device, tol, dtype, inter):
    x = (torch.randn(3, 2 * inter) * 4).to(dtype=dtype, device=device)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_reference(x), **tol(dtype))


def test_reference_is_gate_silu_times_up():
    gate, up = torch.randn(5, 16), torch.randn(5, 16)
    want = torch.nn.functional.silu(gate) * up  # transformers' LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
    torch.testing.assert_close(silu_and_mul_reference(torch.cat([gate, up], dim=1)), want)


def test_empty_batch(device):
    assert silu_and_mul(torch.empty(0, 32, device=device)).shape == (0, 16)
