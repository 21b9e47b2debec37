"""Weight-only int8 / int4 matmuls on the CPU with torch's own kernels, and the weight formats they take.

Runs in the scheduler process. int8: per-output-channel symmetric scales, torch.ops.aten._weight_int8pack_mm.
int4: groups of GROUP inputs with an asymmetric scale and zero each, packed by
_convert_weight_to_int4pack_for_cpu and multiplied by _weight_int4pack_mm_for_cpu; the kernel computes
w = (q - 8) * scale + zero for q in 0..15, which represents GGUF's q4_0 / q4_1 / q4_K blocks exactly (see
gguf_source.py). Both kernels dequantize tiles in registers: the weight streams from memory at 1/4 or
1/8 of fp32's bytes. Kernel choices and activation dtypes are measured (docs/benchmarks.md, "Quantized and
bf16 weights").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

GROUP = 32  # int4 group size: GGUF's block size, and it divides every SmolLM2 / Llama input size
# Steps of at least this many rows multiply a quantized weight's bf16 copy (`dense`, kept only where the
# CPU computes bf16 natively: AMX / AVX512-BF16) with one bf16 GEMM instead of the weight-only kernel.
# The weight-only kernels stream 1-2 bytes a weight, which wins while the step is bound by memory; with
# more rows the step is bound by arithmetic, where oneDNN's bf16 GEMM (AMX) is far faster (Xeon with
# AMX, 1 thread, ms per pass over SmolLM2's layers: M=32 int8 104 / int4 83 / bf16 39; M=512 1355 /
# 1546 / 136; fp32 745; under load, M=8 int8 146 / int4 109 / bf16 160, M=16 218 / 178 / 194). The copy
# holds the same dequantized values (rounded to bf16).
DENSE_MIN_ROWS = 16
# Steps of at most this many rows multiply an int8 weight's `tiles` (the compiled C++ kernel, fp32
# activations, radixlm/kernels/cpu/csrc/gemv.cpp) instead of _weight_int8pack_mm: it streams the int8
# weights at about the memory rate at 1-2 rows and stays ahead of torch's bf16-activation kernel up to 16
# rows (SmolLM2's int8 matmuls, Zen 5, 1 thread, ms at M=1 / 4 / 8 / 15: 4.7 / 8.0 / 14.1 / 25.8 vs
# 10.6 / 10.8 / 19.6 / 35.3; docs/benchmarks.md, "int8 GEMV"), so every step below
# DENSE_MIN_ROWS takes it: one kernel, fp32 activations, each row's result independent of the batch.
GEMV_MAX_ROWS = 15


@dataclass(frozen=True, eq=False)
class Int8Tiles:
    """An int8 weight in the compiled GEMV's tiled layout (one build's `pack_rows`) and that build's op."""

    data: torch.Tensor
    scales: torch.Tensor  # fp32 [out]
    linear: Callable[..., torch.Tensor]  # (x fp32 [M, in], data, scales, bias | None) -> fp32 [M, out]


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """[out, in] int8 values and their per-output-channel scale ([out], the activation dtype)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    dense: torch.Tensor | None = None  # bf16 [out, in] copy for many-row steps (DENSE_MIN_ROWS)
    tiles: Int8Tiles | None = None  # for few-row steps (GEMV_MAX_ROWS), where the compiled ops load

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    def nbytes(self) -> int:
        extra = 0 if self.tiles is None else self.tiles.data.nbytes + self.tiles.scales.nbytes
        return self.qweight.nbytes + self.scales.nbytes + (0 if self.dense is None else self.dense.nbytes) + extra


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """The kernel's packed int4 tiles of an [out, in] weight and its [in / group, out, 2] scales and zeros."""

    packed: torch.Tensor
    scales_zeros: torch.Tensor
    group: int
    out_features: int
    in_features: int
    dense: torch.Tensor | None = None  # see Int8Weight.dense

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes + (0 if self.dense is None else self.dense.nbytes)



def quantize_int8(w: torch.Tensor, act_dtype: torch.dtype, ops=None) -> Int8Weight:
    """Symmetric per-row int8: scale = max|w_row| / 127, q = round(w / scale). ops: the compiled CPU ops
    (radixlm.kernels.cpu.load()) to also keep the tiled copy for few-row steps (GEMV_MAX_ROWS); its scales
    stay fp32, where torch's kernel needs them in the activation dtype."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    tiles = None if ops is None else Int8Tiles(ops.pack_rows(q), scale.contiguous(), ops.int8_linear)
    return Int8Weight(q, scale.to(act_dtype), tiles=tiles)


def int4_qparams(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric groupwise int4 (as gpt-fast and GGUF's q4_1 do it): for each group of `group` inputs,
    scale = (max - min) / 15, q = round((w - min) / scale) in 0..15. Returns q [out, in] (int32) and the
    kernel's scale and zero [out, in / group] (zero = min + 8 * scale)."""
    n, k = w.shape
    if k % group:
        raise ValueError(f"int4 needs the input size ({k}) to be a multiple of the group size {group}")
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32).reshape(n, k)
    return q, scale, lo + 8 * scale


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, act_dtype: torch.dtype) -> Int4Weight:
    """q [out, in] in 0..15 and scale/zero [out, in / group] -> the kernel's format."""
    n, k = q.shape
    group = k // scale.shape[1]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    sz = torch.stack([scale.float(), zero.float()], -1).transpose(0, 1).contiguous().to(act_dtype)
    return Int4Weight(packed, sz, group, n, k)


def quantize_int4(w: torch.Tensor, act_dtype: torch.dtype, group: int = GROUP) -> Int4Weight:
    return pack_int4(*int4_qparams(w, group), act_dtype)


def dequantize(w: QuantWeight) -> torch.Tensor:
    """The fp32 [out, in] matrix that a quantized weight stands for (the tests' reference)."""
    if isinstance(w, Int8Weight):
        return w.qweight.float() * w.scales.float()[:, None]
    eye = torch.eye(w.in_features)  # x = I gives W^T, through the kernel itself (fp32: no bf16 rounding)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, w.packed, w.group, w.scales_zeros.float()).t()


def with_dense(w: QuantWeight) -> QuantWeight:
    """w plus a bf16 copy of its dequantized values, for steps of DENSE_MIN_ROWS rows or more."""
    if isinstance(w, Int8Weight):
        dense = w.qweight.float() * w.scales.float()[:, None]
    else:  # through the kernel (x = I gives W^T); bf16 activations: its fp32 path is ~70x slower
        eye = torch.eye(w.in_features, dtype=w.scales_zeros.dtype)
        dense = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, w.packed, w.group, w.scales_zeros).t()
    return replace(w, dense=dense.to(torch.bfloat16).contiguous())


def _int4_mm(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, w.group, w.scales_zeros)


QuantWeight = Int8Weight | Int4Weight


def quant_linear(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, W, bias) for a quantized W; x [..., in] in any float dtype, the result in x's dtype.
    Activations are cast to the dtype the weight's scales were stored in (the kernels require it)."""
    act = w.scales.dtype if isinstance(w, Int8Weight) else w.scales_zeros.dtype
    x2 = x.reshape(-1, x.shape[-1])
    tiles = w.tiles if isinstance(w, Int8Weight) else None
    if tiles is not None and x2.shape[0] <= GEMV_MAX_ROWS and x.dtype == torch.float32 and (
            bias is None or bias.dtype == torch.float32):
        y = tiles.linear(x2, tiles.data, tiles.scales, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])
    if w.dense is not None and x2.shape[0] >= DENSE_MIN_ROWS:
        y = F.linear(x2.to(w.dense.dtype), w.dense).to(x.dtype).reshape(*x.shape[:-1], w.dense.shape[0])
        return y if bias is None else y.add_(bias)
    if x2.dtype != act:
        x2 = x2.to(act)
    if isinstance(w, Int8Weight):
        y = torch.ops.aten._weight_int8pack_mm(x2, w.qweight, w.scales)
    else:
        y = _int4_mm(x2.contiguous(), w)
    y = y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y.add_(bias)

