"""The greedy LM head (radixlm/kernels/cpu/csrc/argmax_head.cpp): a bf16 screen with a proven bound, then
f32_linear's exact logits for the candidates. Against f32_linear in the native and the AVX2 build: the
candidates carry its bits, the argmax (first maximum) and its ties are always among them, every logit left
out is below the maximum, the bound holds, and input the screen cannot bound falls back to the full row."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixlm.kernels.cpu import reference
from radixlm.runtime.model.cpu_ops import row_norms_up

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")


def head(ops, w: torch.Tensor):
    packed = ops.pack_rows(w)
    screen, coef = ops.argmax_screen(packed, w.shape[0])
    return packed, screen, coef


def check(ops, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    packed, screen, coef = head(ops, w)
    full = ops.f32_linear(x, packed, w.shape[0], None)
    got = ops.argmax_linear(x, packed, screen, coef, w.shape[0])
    kept = torch.isfinite(got)
    assert torch.equal(got[kept], full[kept])  # f32_linear's own bits
    assert int(got.argmax()) == int(full.argmax())  # the first maximum
    assert bool(kept[reference.argmax_linear(full) == full.max()].all())  # every tie with it
    assert bool((full[~kept] < full.max()).all())
    return got


@pytest.mark.parametrize("size", [(49152, 576), (1003, 576), (37, 19), (8, 16)])
def test_candidates_carry_f32_linears_bits_and_the_argmax(ops, size: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(size[0])
    w = torch.randn(*size, generator=g) * 0.05
    for _ in range(3):
        x = torch.randn(1, size[1], generator=g) * 2
        got = check(ops, w, x)
    if size[0] > 1000:  # the point of the screen: few rows recomputed
        assert int(torch.isfinite(got).sum()) <= size[0] // 50


def test_near_ties_and_exact_ties_stay_exact(ops) -> None:
    """Rows equal to the best one, or off it by a few ulps, all within the screen's bound: the candidates
    decide among them with exact logits (the first of equal maxima wins, as in the full row)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4096, 576, generator=g) * 0.05
    x = torch.randn(1, 576, generator=g)
    best = int((w @ x[0]).argmax())
    for i, row in enumerate((5, 900, 2500, 4000)):
        w[row] = w[best] * (1 + (i - 1) * 2e-7)  # a few ulps below, equal, above, above
    w[3000] = w[best]  # an exact tie after the best row
    check(ops, w, x)


def test_the_bound_covers_every_logit(ops) -> None:
    """|f32_linear's logit - the bf16 weights' exact dot| <= coef * ||x|| for every row."""
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(2000, 576, generator=g) * 0.1, torch.randn(1, 576, generator=g) * 5
    packed, _, coef = head(ops, w)
    full = ops.f32_linear(x, packed, 2000, None)[0].double()
    screened = w.to(torch.bfloat16).double() @ x[0].double()
    assert bool(((full - screened).abs() <= coef.double() * x.double().norm()).all())


def test_what_cannot_be_bounded_gets_the_full_row(ops) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(300, 64, generator=g)
    packed, screen, coef = head(ops, w)
    for x in (torch.full((1, 64), float("nan")), torch.zeros(1, 64), torch.full((1, 64), 1e38)):  # 1e38: sums overflow
        full = ops.f32_linear(x, packed, 300, None)
        torch.testing.assert_close(ops.argmax_linear(x, packed, screen, coef, 300), full, equal_nan=True,
                                   rtol=0, atol=0)


def test_bad_input_is_a_clear_error(ops) -> None:
    w = torch.randn(40, 64)
    packed, screen, coef = head(ops, w)
    with pytest.raises(RuntimeError, match="one fp32 row"):
        ops.argmax_linear(torch.randn(2, 64), packed, screen, coef, 40)
    with pytest.raises(RuntimeError, match="argmax_screen"):
        ops.argmax_linear(torch.randn(1, 64), packed, screen, coef[:39], 40)
    with pytest.raises(RuntimeError, match="pack_rows"):
        ops.argmax_screen(w, 40)


# ---- several rows: argmax_rows, screened by a bf16 x bf16 matmul --------------------------------------

def rows_head(ops, w: torch.Tensor):
    packed, _, coef = head(ops, w)
    return packed, coef, row_norms_up(w)


def bf16_screen(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """bf16(W) bf16(x)^T summed in fp32, rounded to bf16, as the engine's oneDNN screen gives it."""
    return (x.to(torch.bfloat16).float() @ w.to(torch.bfloat16).float().t()).to(torch.bfloat16)


def check_rows(ops, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    packed, coef, wnorm = rows_head(ops, w)
    full = ops.f32_linear(x, packed, w.shape[0], None)
    screened = bf16_screen(w, x)
    got = ops.argmax_rows(x, screened, packed, coef, wnorm, w.shape[0])
    for m in range(x.shape[0]):
        kept = torch.isfinite(got[m])
        assert torch.equal(got[m][kept], full[m][kept])  # f32_linear's own bits
        assert int(got[m].argmax()) == int(full[m].argmax())
        assert bool(kept[full[m] == full[m].max()].all())  # every tie with the maximum
        assert bool((full[m][~kept] < full[m].max()).all())
        # the same bits as the one-row head's candidates
        one = ops.argmax_linear(x[m : m + 1], packed, *ops.argmax_screen(packed, w.shape[0]), w.shape[0])[0]
        both = kept & torch.isfinite(one)
        assert torch.equal(got[m][both], one[both])
    return got


@pytest.mark.parametrize("size", [(49152, 576), (1003, 576), (37, 19)])
def test_rows_candidates_carry_f32_linears_bits_and_each_rows_argmax(ops, size: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(size[0] + 7)
    w = torch.randn(*size, generator=g) * 0.05
    x = torch.randn(5, size[1], generator=g) * 2
    got = check_rows(ops, w, x)
    if size[0] > 1000:  # few rows recomputed per row of x
        assert int(torch.isfinite(got).sum()) <= 5 * size[0] // 50


def test_rows_near_ties_and_exact_ties_stay_exact(ops) -> None:
    g = torch.Generator().manual_seed(11)
    w = torch.randn(4096, 576, generator=g) * 0.05
    x = torch.randn(3, 576, generator=g)
    best = int((w @ x[1]).argmax())
    for i, row in enumerate((5, 900, 2500, 4000)):
        w[row] = w[best] * (1 + (i - 1) * 2e-7)
    w[3000] = w[best]
    check_rows(ops, w, x)


def test_rows_bound_covers_the_bf16_inputs_rounding(ops) -> None:
    """x whose bf16 rounding moves every logit (values just off bf16's grid): the screen's error is then
    mostly x's, and the bound (||w|| ||x - bf16(x)||) still keeps the argmax among the candidates."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(3000, 64, generator=g)
    x = torch.randn(4, 64, generator=g).to(torch.bfloat16).float() * (1 + 2.0 ** -9)  # halfway-ish: rounds away
    check_rows(ops, w, x)


def test_rows_that_cannot_be_bounded_get_the_full_row(ops) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(300, 64, generator=g)
    packed, coef, wnorm = rows_head(ops, w)
    x = torch.randn(3, 64, generator=g)
    x[1] = float("nan")
    x[2] = 1e38  # the sums overflow
    full = ops.f32_linear(x, packed, 300, None)
    got = ops.argmax_rows(x, bf16_screen(w, x), packed, coef, wnorm, 300)
    torch.testing.assert_close(got[1:], full[1:], equal_nan=True, rtol=0, atol=0)
    assert int(got[0].argmax()) == int(full[0].argmax())


def test_rows_bad_input_is_a_clear_error(ops) -> None:
    w = torch.randn(40, 64)
    packed, coef, wnorm = rows_head(ops, w)
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="screened must be"):
        ops.argmax_rows(x, bf16_screen(w, x)[:, :39], packed, coef, wnorm, 40)
    with pytest.raises(RuntimeError, match="screened must be"):
        ops.argmax_rows(x, bf16_screen(w, x).float(), packed, coef, wnorm, 40)
    with pytest.raises(RuntimeError, match="wnorm"):
        ops.argmax_rows(x, bf16_screen(w, x), packed, coef, wnorm[:39], 40)
