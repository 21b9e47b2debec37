"""The GGUF block kernels (radixlm/kernels/cpu/csrc/gguf_blocks.cpp) against the gguf package's own
dequantization (gguf.quants.dequantize) and a float matmul, for every type they take, in the native and the
AVX2 build: dequantization bit for bit, the linear within fp32 summation order, several parts of mixed
types stacked by rows, bias, batch invariance; and the Python wrapper's many-row (tiled) path."""

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
        raw[:, :, off:off + 2] = rng.uniform(-0.05, 0.05, size=(rows, inp // block, 1)).astype(np.float16).view(np.uint8)
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
    """Few rows: the block GEMV; many: dequantized tiles and torch's GEMM (small tiles here, so several)."""
    monkeypatch.setattr(gguf_blocks, "TILE_BYTES", 4 * 512 * 24)
    w = GGUFWeight((matrix(Q.Q4_K, 48, 512, seed=1), matrix(Q.Q6_K, 40, 512, seed=2)))
    dense = torch.cat([gguf_blocks.dequantize(p) for p in w.parts])
    x, bias = torch.randn(2, rows, 512), torch.randn(88)
    close(gguf_blocks.gguf_linear(x, w, bias), F.linear(x, dense, bias))


def test_embedding_dequantizes_the_looked_up_rows() -> None:
    table = matrix(Q.Q5_0, 100, 256, seed=3)
    ids = torch.tensor([[3, 99, 3], [0, 50, 7]])
    want = F.embedding(ids, gguf_blocks.dequantize(table))
    assert torch.equal(gguf_blocks.embedding(ids, table), want)
