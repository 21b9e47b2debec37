"""The compiled few-row GEMV (radixlm/kernels/cpu/csrc/gemv.cpp): int8 and fp32 weights in the tiled layout
against torch, in the native and the AVX2 build, at 1-8 rows, sizes off every vector and block width, with
and without bias; each row's result independent of the batch."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.cpu import reference
from radixlm.kernels.cpu.build import namespace
from radixlm.runtime.model.quant.cpu_caps import cpu_caps

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")

SIZES = [(37, 19), (960, 576), (13, 1536), (8, 16)]  # (out, in): off / on the widths, SmolLM2's shapes


def int8_weight(out: int, inp: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-127, 128, (out, inp), dtype=torch.int8, generator=g), torch.rand(out, generator=g) / 100


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 sums in another order than torch's: relative to the row's magnitude."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("rows", [*range(1, 9), 15])  # every tile shape; 15: quant's GEMV_MAX_ROWS
@pytest.mark.parametrize("size", SIZES)
def test_int8_linear_matches_the_dequantized_matmul(ops, rows: int, size: tuple[int, int]) -> None:
    q, scales = int8_weight(*size, seed=rows)
    x, bias = torch.randn(rows, size[1]), torch.randn(size[0])
    packed = ops.pack_rows(q)
    close(ops.int8_linear(x, packed, scales, None), reference.int8_linear(x, q, scales))
    close(ops.int8_linear(x, packed, scales, bias), reference.int8_linear(x, q, scales, bias))


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("size", SIZES)
def test_f32_linear_matches_f_linear(ops, rows: int, size: tuple[int, int]) -> None:
    w, x, bias = torch.randn(*size), torch.randn(rows, size[1]), torch.randn(size[0])
    packed = ops.pack_rows(w)
    close(ops.f32_linear(x, packed, size[0], None), F.linear(x, w))
    close(ops.f32_linear(x, packed, size[0], bias), F.linear(x, w, bias))


def test_a_row_has_the_same_bits_alone_and_in_any_batch(ops) -> None:
    """Batch invariance: each output is one dot product whose order depends on the input size only."""
    q, scales = int8_weight(960, 576, seed=0)
    packed, x = ops.pack_rows(q), torch.randn(15, 576)
    together = ops.int8_linear(x, packed, scales, None)
    for rows in range(1, 15):
        assert torch.equal(ops.int8_linear(x[:rows], packed, scales, None), together[:rows])
    assert all(torch.equal(ops.int8_linear(x[i : i + 1], packed, scales, None)[0], together[i]) for i in range(15))


def test_tile_rows_is_the_builds_rows_per_tile(ops) -> None:
    """What packed_tiles routes through the GEMV (weight_layout.packed_linear): 4 rows in the AVX-512 build,
    2 in the AVX2 one; a step of that many rows has each row's one-row bits in the fp32 kernel too."""
    assert ops.tile_rows() == (4 if ops.name == namespace("native") and cpu_caps().avx512 else 2)
    w, x = torch.randn(960, 576), torch.randn(ops.tile_rows(), 576)
    packed = ops.pack_rows(w)
    together = ops.f32_linear(x, packed, 960, None)
    assert all(torch.equal(ops.f32_linear(x[i : i + 1], packed, 960, None)[0], together[i])
               for i in range(x.shape[0]))


def test_threads_do_not_change_the_result(ops) -> None:
    q, scales = int8_weight(3072, 576, seed=1)
    packed, x = ops.pack_rows(q), torch.randn(2, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.int8_linear(x, packed, scales, None)
        torch.set_num_threads(2)
        assert torch.equal(ops.int8_linear(x, packed, scales, None), one)
    finally:
        torch.set_num_threads(before)


def test_a_non_contiguous_x_is_read_correctly(ops) -> None:
    q, scales = int8_weight(40, 64, seed=2)
    x = torch.randn(64, 3).t()  # [3, 64], strided
    close(ops.int8_linear(x, ops.pack_rows(q), scales, None), reference.int8_linear(x, q, scales))


def test_bad_input_is_a_clear_error(ops) -> None:
    q, scales = int8_weight(40, 64, seed=3)
    packed = ops.pack_rows(q)
    with pytest.raises(RuntimeError, match="pack_rows"):
        ops.int8_linear(torch.randn(1, 64), q, scales, None)  # not packed
    with pytest.raises(RuntimeError, match="inputs"):
        ops.int8_linear(torch.randn(1, 128), packed, scales, None)
    with pytest.raises(RuntimeError, match="fp32"):
        ops.int8_linear(torch.randn(1, 64, dtype=torch.float64), packed, scales, None)
    with pytest.raises(RuntimeError, match="bias"):
        ops.int8_linear(torch.randn(1, 64), packed, scales, torch.randn(41))
