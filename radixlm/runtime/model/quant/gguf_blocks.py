"""A GGUF's weights as the file stores them: rows of quantized blocks, multiplied without an fp32 copy.

Runs in the scheduler process. A GGUF model in `quantization=gguf` (auto's choice for a GGUF on the CPU) keeps
every 2-D tensor as a BlockMatrix: a [rows, row_bytes] uint8 view of the memory-mapped file (only llama's
q/k rows, which llama.cpp's converter permuted, are a reordered copy). A linear weight whose parts are all
of a type in PACKED_TYPES is repacked once at load (`pack`) into panels of 16 rows (PackedMatrix, the same
size as the blocks; the loader then lets go of the file's pages): csrc/gguf_packed.cpp multiplies those
with every activation row of a step per unpacked panel vector, and one float FMA per 32 values x 16 outputs.
The compiled ops (radixlm/kernels/cpu/csrc/gguf_*.cpp) read the blocks or panels directly:
  - steps of up to GEMV_MAX_ROWS rows (decode), packed weights: gguf_linear_packed (int8 activations, as
    below); other weights, every part of a type in Q8_TYPES: gguf_linear_q8
    rounds each activation row to int8 in blocks of 32 (as llama.cpp does) and takes integer dot products
    with the weight's own quantized values; other types: gguf_linear dequantizes each weight row once into
    a cache-resident buffer and multiplies it with every activation row (fp32 activations, no rounding);
  - larger steps (prefill): the weight (blocks or panels) is dequantized a tile of rows at a time, bit for
    bit the gguf package's values, and multiplied by torch's GEMM (bf16 where the CPU computes it
    natively, else fp32), so the arithmetic runs at the GEMM's rate and the dequantized copy never
    exceeds one tile;
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
# The types gguf_pack repacks into panels (a Q4_K_M / Q5_K_M file's: Q4_K, Q6_K, Q5_0, Q8_0).
PACKED_TYPES = frozenset(KERNEL_TYPES[name] for name in ("Q5_0", "Q8_0", "Q4_K", "Q6_K"))
# Weight rows per panel (csrc/gguf_packed.cpp's kPanel).
PANEL_ROWS = 16
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
class PackedMatrix:
    """A BlockMatrix of a type in PACKED_TYPES repacked by gguf_pack: `data` [ceil(rows / 16), panel_bytes]
    uint8, each panel 16 rows' blocks regrouped (the last one padded with zero rows)."""

    data: torch.Tensor
    qtype: int
    in_features: int
    rows: int


@dataclass(frozen=True, eq=False)
class GGUFWeight:
    """A linear weight [out, in] made of parts stacked by rows (q/k/v, gate/up), each part in its own type
    (a Q4_K_M file mixes Q4_K, Q5_0, Q6_K and Q8_0 even within one layer): all BlockMatrix, or all
    PackedMatrix after `pack`."""

    parts: tuple[BlockMatrix, ...] | tuple[PackedMatrix, ...]

    @property
    def is_packed(self) -> bool:
        return isinstance(self.parts[0], PackedMatrix)

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


def dequantize(m: BlockMatrix | PackedMatrix, ops=None) -> torch.Tensor:
    """fp32 [rows, in] of a block or packed matrix (tests, tiles, and dequantized loading)."""
    ops = ops or _ops()
    if isinstance(m, PackedMatrix):
        return ops.gguf_packed_dequantize(m.data, m.qtype, m.in_features, m.rows)
    return ops.gguf_dequantize(m.data, m.qtype, m.in_features)


def pack(w: GGUFWeight, ops=None) -> GGUFWeight:
    """w with every part repacked into panels when all of them are of a type in PACKED_TYPES, else w."""
    if w.is_packed or any(p.qtype not in PACKED_TYPES for p in w.parts):
        return w
    ops = ops or _ops()
    return GGUFWeight(tuple(PackedMatrix(ops.gguf_pack(p.data, p.qtype), p.qtype, p.in_features, p.rows)
                            for p in w.parts))


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


def _tile(part: BlockMatrix | PackedMatrix, r0: int, step: int, ops) -> torch.Tensor:
    """fp32 rows r0 .. r0 + step of a part (step a multiple of PANEL_ROWS)."""
    if isinstance(part, PackedMatrix):
        p0 = r0 // PANEL_ROWS
        rows = min(step, part.rows - r0)
        return ops.gguf_packed_dequantize(part.data[p0:p0 + step // PANEL_ROWS], part.qtype, part.in_features, rows)
    return ops.gguf_dequantize(part.data[r0:r0 + step], part.qtype, part.in_features)


def _tiled_matmul(x: torch.Tensor, w: GGUFWeight, ops, dtype: torch.dtype) -> torch.Tensor:
    """x [M, in] @ W^T for many rows: each tile of weight rows dequantized once, then torch's GEMM in
    `dtype` (fp32 output)."""
    y = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
    xd = x.to(dtype)
    step = max(1, TILE_BYTES // (4 * w.in_features) // PANEL_ROWS) * PANEL_ROWS
    col = 0
    for part in w.parts:
        for r0 in range(0, part.rows, step):
            tile = _tile(part, r0, step, ops).to(dtype)
            y[:, col:col + tile.shape[0]] = xd @ tile.t()
            col += tile.shape[0]
    return y


def _gemv(x: torch.Tensor, w: GGUFWeight, ops, bias: torch.Tensor | None) -> torch.Tensor:
    types = [p.qtype for p in w.parts]
    if w.is_packed:
        return ops.gguf_linear_packed(x, [p.data for p in w.parts], types, [p.rows for p in w.parts], bias)
    linear = ops.gguf_linear_q8 if all(t in Q8_TYPES for t in types) else ops.gguf_linear
    return linear(x, [p.data for p in w.parts], types, bias)


def gguf_linear(x: torch.Tensor, w: GGUFWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, W, bias) for a GGUF block weight; x [..., in] in any float dtype, the result in x's."""
    ops = _ops()
    x2 = x.reshape(-1, x.shape[-1]).float()
    if x2.shape[0] <= GEMV_MAX_ROWS:
        y = _gemv(x2, w, ops, bias)
    else:
        y = _tiled_matmul(x2.contiguous(), w, ops, gemm_dtype())
        if bias is not None:
            y.add_(bias)
    return y.to(x.dtype).reshape(*x.shape[:-1], w.out_features)


def block_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's block weights, each counted once (a tied LM head reads the embedding's, or has
    its packed copy)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        for value in vars(module).values():
            parts = value.parts if isinstance(value, GGUFWeight) else [value]
            seen.update((id(p), p.data.nbytes) for p in parts if isinstance(p, (BlockMatrix, PackedMatrix)))
    return sum(seen.values())
