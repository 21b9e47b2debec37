"""The GGUF block kernels (radixlm/kernels/cpu/csrc/gguf_blocks.cpp) against the gguf package's own
dequantization (gguf.quants.dequantize) and a float matmul, for every type they take, in the native and the
AVX2 build: dequantization bit for bit, the linear within fp32 summation order, the int8-activation linear
within what rounding x to int8 implies, several parts of mixed types stacked by rows, bias, batch
invariance; and the Python wrapper's paths."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from radixlm.runtime.model.quant import gguf_blocks
from radixlm.runtime.model.quant.gguf_blocks import KERNEL_TYPES, BlockMatrix, GGUFWeight

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")

# Where each block format keeps its fp16 scales (d, and dmin / m where it has one).
SCALE_OFFSETS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0], Q.Q2_K: [80, 82],
                 Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
FLOATS = {Q.F32: np.float32, Q.F16: np.float16}
TYPES = [Q[name] for name in KERNEL_TYPES]


def blocks_of(qtype: Q, rows: int, inp: int, seed: int) -> np.ndarray:
    """[rows, row_bytes] uint8: random bytes with sane fp16 scales (random ones would be inf / NaN), or
    random normal values for the float types."""
    rng = np.random.default_rng(seed)
    if qtype in (Q.F32, Q.F16, Q.BF16):
        w = rng.standard_normal((rows, inp)).astype(np.float32)
        stored = gguf.quants.quantize(w, qtype) if qtype == Q.BF16 else w.astype(FLOATS[qtype])
        return np.ascontiguousarray(stored).view(np.uint8).reshape(rows, -1)
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, inp // block, nbytes), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        scales = rng.uniform(-0.05, 0.05, size=(rows, inp // block, 1)).astype(np.float16)
        raw[:, :, off:off + 2] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


def reference(blocks: np.ndarray, qtype: Q, inp: int) -> torch.Tensor:
    return torch.from_numpy(np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float32).reshape(-1, inp))


def matrix(qtype: Q, rows: int, inp: int, seed: int) -> BlockMatrix:
    return BlockMatrix(torch.from_numpy(blocks_of(qtype, rows, inp, seed)), qtype.value, inp)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 sums in another order than torch's: relative to the output's magnitude."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5 * float(want.abs().max()))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_is_the_gguf_packages_bit_for_bit(ops, qtype: Q) -> None:
    blocks = blocks_of(qtype, 24, 512, seed=qtype.value)
    got = ops.gguf_dequantize(torch.from_numpy(blocks), qtype.value, 512)
    assert torch.equal(got, reference(blocks, qtype, 512))


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_linear_matches_the_dequantized_matmul(ops, qtype: Q, rows: int) -> None:
    blocks = blocks_of(qtype, 40, 768, seed=rows)
    w = reference(blocks, qtype, 768)
    x, bias = torch.randn(rows, 768), torch.randn(40)
    data = torch.from_numpy(blocks)
    close(ops.gguf_linear(x, [data], [qtype.value], None), F.linear(x, w))
    close(ops.gguf_linear(x, [data], [qtype.value], bias), F.linear(x, w, bias))


def test_parts_of_mixed_types_stack_by_rows(ops) -> None:
    """q/k/v of a Q4_K_M file: each part its own type, the outputs side by side in part order."""
    parts = [(Q.Q4_K, 32), (Q.Q5_0, 16), (Q.Q6_K, 16), (Q.Q8_0, 8)]
    blocks = [blocks_of(t, rows, 512, seed=i) for i, (t, rows) in enumerate(parts)]
    w = torch.cat([reference(b, t, 512) for b, (t, _) in zip(blocks, parts)])
    x, bias = torch.randn(5, 512), torch.randn(w.shape[0])
    got = ops.gguf_linear(x, [torch.from_numpy(b) for b in blocks], [t.value for t, _ in parts], bias)
    close(got, F.linear(x, w, bias))


def test_a_row_has_the_same_bits_alone_and_in_any_batch(ops) -> None:
    data = torch.from_numpy(blocks_of(Q.Q4_K, 64, 1024, seed=0))
    x = torch.randn(8, 1024)
    together = ops.gguf_linear(x, [data], [Q.Q4_K.value], None)
    for i in range(8):
        assert torch.equal(ops.gguf_linear(x[i:i + 1], [data], [Q.Q4_K.value], None)[0], together[i])


def test_bad_input_is_a_clear_error(ops) -> None:
    data = torch.from_numpy(blocks_of(Q.Q4_0, 4, 64, seed=0))
    with pytest.raises(RuntimeError, match="type 20 has no kernel"):
        ops.gguf_dequantize(data, Q.IQ4_NL.value, 64)
    with pytest.raises(RuntimeError, match="uint8 \\[rows, 40\\]"):
        ops.gguf_linear(torch.randn(1, 64), [data], [Q.Q4_1.value], None)
    with pytest.raises(RuntimeError, match="not a whole number of 256-value blocks"):
        ops.gguf_dequantize(data, Q.Q4_K.value, 64)


@pytest.mark.parametrize("rows", [1, gguf_blocks.GEMV_MAX_ROWS + 1, 70])
def test_the_python_linear_takes_both_paths_to_the_same_result(rows: int, monkeypatch) -> None:
    """Few rows: the block GEMV (fp32 activations here: an F16 part); many: dequantized tiles and torch's
    GEMM (small tiles here, so several; in fp32 here, see the bf16 test below)."""
    monkeypatch.setattr(gguf_blocks, "TILE_BYTES", 4 * 512 * 24)
    monkeypatch.setattr(gguf_blocks, "gemm_dtype", lambda: torch.float32)
    w = GGUFWeight((matrix(Q.Q4_K, 48, 512, seed=1), matrix(Q.Q6_K, 40, 512, seed=2), matrix(Q.F16, 8, 512, seed=3)))
    dense = torch.cat([gguf_blocks.dequantize(p) for p in w.parts])
    x, bias = torch.randn(2, rows, 512), torch.randn(96)
    close(gguf_blocks.gguf_linear(x, w, bias), F.linear(x, dense, bias))


def test_many_rows_multiply_in_bf16_where_the_cpu_computes_it(monkeypatch) -> None:
    """The bf16 GEMM of many-row steps: the fp32 result of bf16-rounded x and weights (each rounded once,
    relative error <= 2^-8), so within a bound of sum |w| |x| 2^-7 of the exact product."""
    monkeypatch.setattr(gguf_blocks, "gemm_dtype", lambda: torch.bfloat16)
    w = GGUFWeight((matrix(Q.Q4_K, 48, 512, seed=1), matrix(Q.Q5_0, 40, 512, seed=2)))
    dense = torch.cat([gguf_blocks.dequantize(p) for p in w.parts])
    x = torch.randn(40, 512)
    got, want = gguf_blocks.gguf_linear(x, w), F.linear(x, dense)
    bound = F.linear(x.abs(), dense.abs()) * 2.0 ** -7
    assert bool(((got - want).abs() <= bound).all())
    assert not torch.equal(got, want)  # the bf16 path did run


def test_the_python_linear_takes_int8_activations_for_few_rows_of_q8_types(monkeypatch) -> None:
    monkeypatch.setattr(gguf_blocks, "gemm_dtype", lambda: torch.float32)
    w = GGUFWeight((matrix(Q.Q4_K, 48, 512, seed=1), matrix(Q.Q6_K, 40, 512, seed=2)))
    ops, data, types = gguf_blocks._ops(), [p.data for p in w.parts], [p.qtype for p in w.parts]
    x, bias = torch.randn(3, 512), torch.randn(88)
    assert torch.equal(gguf_blocks.gguf_linear(x, w, bias), ops.gguf_linear_q8(x, data, types, bias))
    many = torch.randn(gguf_blocks.GEMV_MAX_ROWS + 1, 512)
    dense = torch.cat([gguf_blocks.dequantize(p) for p in w.parts])
    close(gguf_blocks.gguf_linear(many, w, bias), F.linear(many, dense, bias))


def test_embedding_dequantizes_the_looked_up_rows() -> None:
    table = matrix(Q.Q5_0, 100, 256, seed=3)
    ids = torch.tensor([[3, 99, 3], [0, 50, 7]])
    want = F.embedding(ids, gguf_blocks.dequantize(table))
    assert torch.equal(gguf_blocks.embedding(ids, table), want)


# ---- int8 activations (gguf_linear_q8) --------------------------------------------------------------------

Q8_TYPES = [t for t in TYPES if t.value in gguf_blocks.Q8_TYPES]


def int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as the kernel rounds it (blocks of 32: dx = max|x| / 127 in fp32, q = rint(x * (127 / max|x|))), as
    float64 dx * q, and each value's dx."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    dx = amax / 127
    rounded = torch.round(xb * inv).double() * dx.double()  # torch.round: half to even, as nearbyint
    return rounded.reshape(x.shape), dx.expand_as(xb).reshape(x.shape).double()


def check_q8(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """got against the float matmul of the dequantized weight, within what int8 activations imply: x_i is
    dx * q_i + e_i with |e_i| <= dx / 2, so |y - y_ref| <= sum_i |w_i| * dx_i / 2 per output, plus fp32
    summation (1e-5 of sum_i |w_i x_i|, far below it). And against the exact dot products with x rounded
    as the kernel rounds it, within fp32 summation: that catches errors the rounding bound would hide."""
    w64 = w.double()
    b = 0 if bias is None else bias.double()
    xq, dx = int8_rows(x)
    fp32_slack = 1e-5 * (x.double().abs() @ w64.abs().T)
    bound = (dx @ w64.abs().T) / 2 + fp32_slack
    err = (got.double() - (x.double() @ w64.T + b)).abs()
    assert bool((err <= bound).all()), f"int8 rounding bound exceeded: {float((err / bound).max()):.3f} of it"
    exact = xq @ w64.T + b
    torch.testing.assert_close(got.double(), exact, rtol=0, atol=float(fp32_slack.max()))


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("qtype", Q8_TYPES, ids=lambda t: t.name)
def test_q8_linear_is_the_matmul_up_to_int8_activation_rounding(ops, qtype: Q, rows: int) -> None:
    # 96 inputs: an odd number of 32-value blocks, so the last 64-value chunk is half padding.
    for inp in [768, 1536] + ([96] if gguf.GGML_QUANT_SIZES[qtype][0] == 32 else []):
        blocks = blocks_of(qtype, 40, inp, seed=rows)
        w = reference(blocks, qtype, inp)
        x, bias = torch.randn(rows, inp), torch.randn(40)
        data = torch.from_numpy(blocks)
        check_q8(ops.gguf_linear_q8(x, [data], [qtype.value], None), x, w)
        check_q8(ops.gguf_linear_q8(x, [data], [qtype.value], bias), x, w, bias)


def test_q8_parts_of_mixed_types_stack_by_rows(ops) -> None:
    parts = [(t, 8 + 4 * i) for i, t in enumerate(Q8_TYPES)]
    blocks = [blocks_of(t, rows, 512, seed=i) for i, (t, rows) in enumerate(parts)]
    w = torch.cat([reference(b, t, 512) for b, (t, _) in zip(blocks, parts)])
    x, bias = torch.randn(5, 512) * 3, torch.randn(w.shape[0])
    got = ops.gguf_linear_q8(x, [torch.from_numpy(b) for b in blocks], [t.value for t, _ in parts], bias)
    check_q8(got, x, w, bias)


def test_q8_a_row_has_the_same_bits_alone_and_in_any_batch(ops) -> None:
    parts = [(t, 24) for t in Q8_TYPES]
    data = [torch.from_numpy(blocks_of(t, rows, 1024, seed=i)) for i, (t, rows) in enumerate(parts)]
    types = [t.value for t, _ in parts]
    x = torch.randn(8, 1024)
    together = ops.gguf_linear_q8(x, data, types, None)
    for i in range(8):
        assert torch.equal(ops.gguf_linear_q8(x[i:i + 1], data, types, None)[0], together[i])
        assert torch.equal(ops.gguf_linear_q8(x[i:i + 3], data, types, None)[0], together[i])


def test_q8_native_and_avx2_builds_give_the_same_bits() -> None:
    """Both builds form the same exact int32 lane sums (VNNI or maddubs + madd) and then the same fp32
    operations in the same order."""
    from radixlm.kernels.cpu import build

    native, avx2 = build.load("native"), build.load("avx2")
    parts = [(t, 16) for t in Q8_TYPES]
    data = [torch.from_numpy(blocks_of(t, rows, 768, seed=i)) for i, (t, rows) in enumerate(parts)]
    types = [t.value for t, _ in parts]
    x, bias = torch.randn(5, 768), torch.randn(16 * len(parts))
    assert torch.equal(native.gguf_linear_q8(x, data, types, bias), avx2.gguf_linear_q8(x, data, types, bias))


def test_q8_takes_only_its_types(ops) -> None:
    data = torch.from_numpy(blocks_of(Q.Q3_K, 4, 256, seed=0))
    with pytest.raises(RuntimeError, match="type 11 has no int8-activation kernel"):
        ops.gguf_linear_q8(torch.randn(1, 256), [data], [Q.Q3_K.value], None)


# ---- panels of 16 rows (gguf_pack, gguf_linear_packed, gguf_packed_dequantize) --------------------------------

PACKED = [t for t in TYPES if t.value in gguf_blocks.PACKED_TYPES]


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_packed_dequantize_is_the_gguf_packages_bit_for_bit(ops, qtype: Q) -> None:
    """21 rows: the second panel is mostly padding, which dequantizes to nothing."""
    blocks = blocks_of(qtype, 21, 512, seed=qtype.value)
    packed = ops.gguf_pack(torch.from_numpy(blocks), qtype.value)
    assert packed.shape[0] == 2
    assert torch.equal(ops.gguf_packed_dequantize(packed, qtype.value, 512, 21), reference(blocks, qtype, 512))


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_packed_linear_is_the_matmul_up_to_int8_activation_rounding(ops, qtype: Q, rows: int) -> None:
    """9 and 16 rows: more than one pass of activation rows over a panel; 40 outputs: a partial panel."""
    for inp in [768, 1536]:
        blocks = blocks_of(qtype, 40, inp, seed=rows)
        w = reference(blocks, qtype, inp)
        packed = ops.gguf_pack(torch.from_numpy(blocks), qtype.value)
        x, bias = torch.randn(rows, inp), torch.randn(40)
        check_q8(ops.gguf_linear_packed(x, [packed], [qtype.value], [40], None), x, w)
        check_q8(ops.gguf_linear_packed(x, [packed], [qtype.value], [40], bias), x, w, bias)


def mixed_packed(ops, inp: int) -> tuple[list[torch.Tensor], list[int], list[int], torch.Tensor]:
    """Packed parts of every packed type with row counts that are not multiples of 16, and the dense weight."""
    parts = [(t, 8 + 9 * i) for i, t in enumerate(PACKED)]
    blocks = [blocks_of(t, rows, inp, seed=i) for i, (t, rows) in enumerate(parts)]
    packed = [ops.gguf_pack(torch.from_numpy(b), t.value) for b, (t, _) in zip(blocks, parts)]
    dense = torch.cat([reference(b, t, inp) for b, (t, _) in zip(blocks, parts)])
    return packed, [t.value for t, _ in parts], [rows for _, rows in parts], dense


def test_packed_parts_of_mixed_types_stack_by_rows(ops) -> None:
    packed, types, rows, w = mixed_packed(ops, 512)
    x, bias = torch.randn(5, 512) * 3, torch.randn(w.shape[0])
    check_q8(ops.gguf_linear_packed(x, packed, types, rows, bias), x, w, bias)


def test_packed_a_row_has_the_same_bits_alone_and_in_any_batch(ops) -> None:
    packed, types, rows, _ = mixed_packed(ops, 1024)
    x = torch.randn(gguf_blocks.GEMV_MAX_ROWS, 1024)
    together = ops.gguf_linear_packed(x, packed, types, rows, None)
    for i in range(x.shape[0]):
        assert torch.equal(ops.gguf_linear_packed(x[i:i + 1], packed, types, rows, None)[0], together[i])
        assert torch.equal(ops.gguf_linear_packed(x[i:i + 9], packed, types, rows, None)[0], together[i])


def test_packed_native_and_avx2_builds_pack_and_multiply_the_same_bits() -> None:
    from radixlm.kernels.cpu import build

    native, avx2 = build.load("native"), build.load("avx2")
    for qtype in PACKED:
        data = torch.from_numpy(blocks_of(qtype, 24, 768, seed=qtype.value))
        assert torch.equal(native.gguf_pack(data, qtype.value), avx2.gguf_pack(data, qtype.value))
    packed, types, rows, w = mixed_packed(native, 768)
    x, bias = torch.randn(11, 768), torch.randn(w.shape[0])
    assert torch.equal(native.gguf_linear_packed(x, packed, types, rows, bias),
                       avx2.gguf_linear_packed(x, packed, types, rows, bias))


def test_packed_bad_input_is_a_clear_error(ops) -> None:
    with pytest.raises(RuntimeError, match="type 3 has no packed kernel"):
        ops.gguf_pack(torch.from_numpy(blocks_of(Q.Q4_1, 16, 64, seed=0)), Q.Q4_1.value)
    packed = ops.gguf_pack(torch.from_numpy(blocks_of(Q.Q5_0, 16, 64, seed=0)), Q.Q5_0.value)
    with pytest.raises(RuntimeError, match="gguf_pack's"):
        ops.gguf_linear_packed(torch.randn(1, 64), [packed], [Q.Q5_0.value], [17], None)


def test_the_python_pack_takes_whole_weights_of_packed_types_and_both_paths(monkeypatch) -> None:
    """A weight is packed only when every part's type is; the packed one gives the GEMV's int8-activation
    result for few rows and the dequantized tiles' for many (several tiles here, the last one partial)."""
    monkeypatch.setattr(gguf_blocks, "TILE_BYTES", 4 * 512 * 32)
    monkeypatch.setattr(gguf_blocks, "gemm_dtype", lambda: torch.float32)
    mixed = GGUFWeight((matrix(Q.Q4_K, 48, 512, seed=1), matrix(Q.Q4_1, 16, 512, seed=2)))
    assert gguf_blocks.pack(mixed) is mixed
    w = GGUFWeight((matrix(Q.Q4_K, 48, 512, seed=1), matrix(Q.Q6_K, 40, 512, seed=2), matrix(Q.Q8_0, 8, 512, 3)))
    packed = gguf_blocks.pack(w)
    assert packed.is_packed and packed.out_features == 96 and packed.nbytes() >= w.nbytes()
    dense = torch.cat([gguf_blocks.dequantize(p) for p in w.parts])
    assert torch.equal(torch.cat([gguf_blocks.dequantize(p) for p in packed.parts]), dense)
    ops, bias = gguf_blocks._ops(), torch.randn(96)
    few = torch.randn(3, 512)
    want = ops.gguf_linear_packed(few, [p.data for p in packed.parts], [p.qtype for p in packed.parts],
                                  [p.rows for p in packed.parts], bias)
    assert torch.equal(gguf_blocks.gguf_linear(few, packed, bias), want)
    check_q8(want, few, dense, bias)
    many = torch.randn(gguf_blocks.GEMV_MAX_ROWS + 1, 512)
    close(gguf_blocks.gguf_linear(many, packed, bias), F.linear(many, dense, bias))
