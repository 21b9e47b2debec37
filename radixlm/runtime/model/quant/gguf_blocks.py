"""A GGUF's weights as the file stores them: rows of quantized blocks, multiplied without an fp32 copy.

Runs in the scheduler process. A GGUF model in `quantization=gguf` (auto's choice for a GGUF on the CPU) keeps
every 2-D tensor as a BlockMatrix: a [rows, row_bytes] uint8 view of the memory-mapped file (only llama's
q/k rows, which llama.cpp's converter permuted, are a reordered copy). The compiled ops
(radixlm/kernels/cpu/csrc/gguf_blocks.cpp) read the blocks directly:
  - steps of up to GEMV_MAX_ROWS rows (decode), every part of a type in Q8_TYPES: gguf_linear_q8 rounds
    each activation row to int8 in blocks of 32 (as llama.cpp does) and takes integer dot products with
    the weight's own quantized values; other types: gguf_linear dequantizes each weight row once into a
    cache-resident buffer and multiplies it with every activation row (fp32 activations, no rounding);
  - larger steps (prefill): the weight is dequantized a tile of rows at a time and multiplied by torch's
    GEMM (bf16 where the CPU computes it natively, else fp32), so the arithmetic runs at the GEMM's rate
    and the dequantized copy never exceeds one tile;
  - the embedding lookup dequantizes only the looked-up rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# ggml type ids the kernels take (ggml.h enum ggml_type), by GGUF name.
KERNEL_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10,
                "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
# The types gguf_linear_q8 (int8 activations) takes; the float types and Q2_K / Q3_K keep fp32 activations.
Q8_TYPES = frozenset(KERNEL_TYPES[name] for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"))
# Rows at most this many go through the block GEMV (it reads the compressed blocks once per 4 rows); more
# go through dequantized tiles and a GEMM, whose cost is mostly the dequantization and barely grows with rows.
GEMV_MAX_ROWS = 16
# The fp32 tile a many-row matmul dequantizes at a time.
TILE_BYTES = 4 << 20


@dataclass(frozen=True, eq=False)
class BlockMatrix:
    """One GGUF tensor: `data` [rows, row_bytes] uint8, each row `in_features` values in blocks of `qtype`."""

    data: torch.Tensor
    qtype: int
    in_features: int

    @property
    def rows(self) -> int:
        return self.data.shape[0]


@dataclass(frozen=True, eq=False)
class GGUFWeight:
    """A linear weight [out, in] made of BlockMatrix parts stacked by rows (q/k/v, gate/up), each part in
    its own type: a Q4_K_M file mixes Q4_K, Q5_0, Q6_K and Q8_0 even within one layer."""

    parts: tuple[BlockMatrix, ...]

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def out_features(self) -> int:
        return sum(p.rows for p in self.parts)

    def nbytes(self) -> int:
        return sum(p.data.nbytes for p in self.parts)


@functools.cache
def _ops():
    from radixlm.kernels import cpu

    return cpu.load()


def dequantize(m: BlockMatrix, ops=None) -> torch.Tensor:
    """fp32 [rows, in] of a block matrix (tests, tiles, and dequantized loading)."""
    return (ops or _ops()).gguf_dequantize(m.data, m.qtype, m.in_features)


def embedding(ids: torch.Tensor, table: BlockMatrix) -> torch.Tensor:
    """F.embedding over a block matrix: only the looked-up rows are dequantized."""
    rows = table.data.index_select(0, ids.reshape(-1))
    return _ops().gguf_dequantize(rows, table.qtype, table.in_features).reshape(*ids.shape, table.in_features)


@functools.cache
def gemm_dtype() -> torch.dtype:
    """What many-row steps multiply in: bf16 where the CPU computes it natively (AMX / AVX512-BF16: several
    times fp32's GEMM rate; the weights are 4-6-bit values and the decode path rounds activations to int8
    already), else fp32."""
    from radixlm.runtime.model.quant.cpu_caps import cpu_caps

    return torch.bfloat16 if cpu_caps().native_bf16 else torch.float32


def _tiled_matmul(x: torch.Tensor, w: GGUFWeight, ops, dtype: torch.dtype) -> torch.Tensor:
    """x [M, in] @ W^T for many rows: each tile of weight rows dequantized once, then torch's GEMM in
    `dtype` (fp32 output)."""
    y = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
    xd = x.to(dtype)
    step = max(1, TILE_BYTES // (4 * w.in_features))
    col = 0
    for part in w.parts:
        for r0 in range(0, part.rows, step):
            tile = ops.gguf_dequantize(part.data[r0:r0 + step], part.qtype, part.in_features).to(dtype)
            y[:, col:col + tile.shape[0]] = xd @ tile.t()
            col += tile.shape[0]
    return y


def gguf_linear(x: torch.Tensor, w: GGUFWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, W, bias) for a GGUF block weight; x [..., in] in any float dtype, the result in x's."""
    ops = _ops()
    x2 = x.reshape(-1, x.shape[-1]).float()
    if x2.shape[0] <= GEMV_MAX_ROWS:
        linear = ops.gguf_linear_q8 if all(p.qtype in Q8_TYPES for p in w.parts) else ops.gguf_linear
        y = linear(x2, [p.data for p in w.parts], [p.qtype for p in w.parts], bias)
    else:
        y = _tiled_matmul(x2.contiguous(), w, ops, gemm_dtype())
        if bias is not None:
            y.add_(bias)
    return y.to(x.dtype).reshape(*x.shape[:-1], w.out_features)


def block_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's block weights, each counted once (a tied LM head reads the embedding's)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        for value in vars(module).values():
            parts = value.parts if isinstance(value, GGUFWeight) else [value]
            seen.update((id(p), p.data.nbytes) for p in parts if isinstance(p, BlockMatrix))
    return sum(seen.values())
