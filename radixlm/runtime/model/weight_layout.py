"""How the matmul weights are stored and multiplied on the CPU (fp32), chosen by measurement.

Runs inside the scheduler process, once, after loading (not on tensor-parallel ranks).

Why: CPU decode is bound by how fast the weights stream from memory, and how fast torch's fp32 matmuls
(MKL) stream them depends on the layout and on threading. Measured on the 2-core AMD EPYC (Zen 3)
development machine, SmolLM2-135M shapes, 30 layers' worth of distinct weights (so nothing stays in
cache), ms per pass over the layers (q/k/v, o, gate/up, down), mean of 6 passes after a warm-up (the
ranking held in every run made):

    rows (M)                      1      4     32    128
    2 threads  row-major        35.9   66.5   92.5   295
    2 threads  column-major     25.9   65.6   95.8   315
    2 threads  blocks           19.1   25.5   72.4   248
    1 thread   row-major        40.8   72.6    160    387
    1 thread   column-major     26.4   77.5    171    361
    1 thread   blocks           35.0   47.5    143    389
    LM head [49152, 576], 2 threads: M=1 row 10.3 / column 5.3 / blocks 5.1 ms; M=4 26.6 / 43.6 / 8.1;
    M=32 41.6 / 51.3 / 24.3.  Past ~100 rows (prefill) the row-major GEMM wins (MAX_BLOCKED_ROWS).

MKL's own threading of these skinny products is poor here: one GEMV stays on one core, and a threaded
GEMM with few rows streams the weight far below the memory bandwidth. "blocks" splits each [out, in]
weight into p row blocks (a free view of the row-major matrix, [p, out/p, in]) and multiplies them with
one torch.bmm, which runs the blocks' GEMMs on different threads, each streaming its own part of the
weight; the outputs are the same dot products (greedy parity with transformers is tested with it on).
Steps of more than MAX_BLOCKED_ROWS tokens multiply the same row-major memory with one GEMM instead.
With one thread the column-major GEMV is fastest at one row, where CPU serving with few requests spends
its time, so:

    auto: fp32 on the CPU -> blocks with >= 2 threads, column with 1; anything else -> row (loaded as is).
          (model_runner then lets layout_probe.py measure the candidates on the machine and keeps the fastest.)
    column: q/k/v, o and gate/up stored column-major (down measured faster row-major and stays), and a
            column-major copy of the LM head for single-row logits (+vocab x hidden x 4 bytes).
    packed: every matmul weight (the LM head too, a copy for a tied embedding) reordered once into oneDNN's
            blocked format and multiplied by oneDNN's inner product (`mkldnn::_linear_pointwise`, what
            inductor's weight prepacking uses) at every row count.
    packed_blocks: packed, plus the blocks view of the row-major layer weights for one-row steps (a second
            copy of the layers' weights: only where that is <= 1/8 of the RAM, rows_copy_fits).
    packed_tiles: packed, plus a tiled copy of every weight (the LM head too) for steps of up to a tile's
            rows (the build's tile_rows: 4 with AVX-512, 2 with AVX2), multiplied by radixlm's compiled fp32
            GEMV (radixlm/kernels/cpu, csrc/gemv.cpp: blocks of output rows interleaved so each block is one
            memory stream, threads over blocks); packed_blocks where the compiled ops do not load. On a
            Zen 5, 1 thread, ms per pass over 30 layers at one row: blocks 14.9, tiles 11.5; LM head
            3.6 vs 3.1 (docs/benchmarks.md, "int8 GEMV").

Why "packed": torch's fp32 F.linear calls MKL, which on AMD CPUs runs its AVX2 code even where the CPU has
AVX-512 (Zen 4/5); oneDNN dispatches on the ISA itself. On a 2-core AMD EPYC (Zen 5, AVX-512),
1 thread, ms per pass over 12 layers' weights, column / blocks / packed: M=1 8.2 / 5.6 / 7.8,
M=2 11.9 / 7.8 / 5.8, M=16 22.7 / 27.5 / 10.5, M=128 114 / 116 / 50; prefill (M=512-2048) 95-100 vs
215-230 GFLOPS (docs/benchmarks.md, "Few-row fp32 matmuls"; benchmarks/small_m_linear.py). With 1 or 2
threads the blocks still stream one row fastest (2 threads: 3.6 vs 5.9 ms), and lose from 2 rows on:
hence packed_blocks, which layout_probe.py weighs against the others.

Each layout keeps the logical [out, in] products, so only the `linear` function of the modules changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

LAYOUTS = ("auto", "row", "column", "blocks", "packed", "packed_blocks", "packed_tiles")


def resolve_layout(layout: str, device: torch.device, dtype: torch.dtype, threads: int) -> str:
    """The concrete layout ("row", "column" or "blocks") that `layout` means for this device."""
    if layout not in LAYOUTS:
        raise ValueError(f"weight_layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if device.type != "cpu" or dtype != torch.float32:
        return "row"  # measured only for fp32 on CPU; GPUs and bf16 keep the loaded layout
    if layout == "auto" or (layout.startswith("packed") and not packed_available()):
        return "blocks" if threads >= 2 else "column"
    if layout == "packed_tiles" and tile_ops() is None:
        return "packed_blocks"
    return layout


def column_major(w: torch.Tensor) -> torch.Tensor:
    """The same [out, in] matrix, stored so that its transpose is contiguous."""
    return w.t().contiguous().t()


def block_count(rows: int, threads: int) -> int:
    """Row blocks for a weight of `rows` outputs: about two per thread (measured a little better than
    one), a divisor of rows; 1 = not blocked."""
    for p in range(min(rows, 2 * threads), 1, -1):
        if rows % p == 0:
            return p
    return 1


def as_blocks(w: torch.Tensor, threads: int) -> torch.Tensor:
    """[out, in] -> a [p, out/p, in] view of the row-major matrix (or w itself when out has no divisor)."""
    p = block_count(w.shape[0], threads)
    return w.contiguous().view(p, w.shape[0] // p, w.shape[1]) if p > 1 else w


# Rows up to which the blocks win (ms per pass over SmolLM2's layers, 2 threads: M=64 row 143 / blocks 110,
# M=128 239 / 252, M=1024 1285 / 1923); above, MKL's own threaded GEMM on the row-major matrix is faster.
MAX_BLOCKED_ROWS = 96


def blocked_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, W, bias) for x [M, in] and W as_blocks: one bmm over the blocks (one per thread), or for
    many rows one GEMM over the row-major matrix (the same memory)."""
    if w.dim() == 2:
        return F.linear(x, w, bias)
    p, rows, k = w.shape
    m = x.shape[0]
    if m > MAX_BLOCKED_ROWS:
        return F.linear(x, w.view(p * rows, k), bias)
    # [p, rows, in] @ [p, in, M] (x^T broadcast, no copy) -> [p, rows, M] -> [M, out]. The permuted result
    # is a column-major view; the copy to row-major costs little next to the product (and nothing at
    # M = 1) and keeps every later op on contiguous rows (SDPA falls back to its slow math kernel on
    # column-major q/k/v: prefill measured 2x slower without the copy).
    y = torch.bmm(w, x.t().expand(p, k, m)).permute(2, 0, 1).reshape(m, p * rows).contiguous()
    return y if bias is None else y.add_(bias)


def packed_available() -> bool:
    """Whether this torch build has oneDNN's prepacked fp32 linear (the "packed" layout)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def pack(w: torch.Tensor) -> torch.Tensor:
    """[out, in] fp32 -> oneDNN's reordered weight (an opaque `torch._mkldnn` tensor of the same shape)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous())


def tile_ops():
    """The compiled CPU ops' namespace (radixlm.kernels.cpu: pack_rows, f32_linear), or None."""
    from radixlm.kernels.cpu import load

    return load()


@dataclass(frozen=True, eq=False)
class Tiles:
    """An fp32 [out, in] weight in the compiled GEMV's tiled layout (csrc/gemv.cpp pack_rows) and that
    build's f32_linear (x fp32 [M, in], data, out_features, bias | None) -> [M, out]. max_rows: the build's
    rows per tile (tile_rows: 4 with AVX-512, 2 otherwise); packed_linear multiplies steps of up to that
    many rows here, each block of weights read once for all of them."""

    data: torch.Tensor
    out_features: int
    linear: Callable[..., torch.Tensor]
    max_rows: int = 1

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def as_tiles(w: torch.Tensor, ops) -> Tiles:
    return Tiles(ops.pack_rows(w.contiguous()), w.shape[0], ops.f32_linear, ops.tile_rows())


def tiled_linear(x: torch.Tensor, w: Tiles, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = w.linear(x.reshape(-1, x.shape[-1]), w.data, w.out_features, bias)
    return y.reshape(*x.shape[:-1], w.out_features)


@dataclass(frozen=True, eq=False)
class PackedRows:
    """The packed_blocks / packed_tiles layouts' weight: oneDNN's packed copy for steps of several rows, and
    for one-row steps the blocks view of the row-major matrix (measured faster there with >= 2 threads) or
    its tiled copy (the compiled GEMV), which also takes steps of up to Tiles.max_rows rows."""

    packed: torch.Tensor
    rows: torch.Tensor | Tiles

    @property
    def shape(self) -> torch.Size:
        return self.packed.shape

    def nbytes(self) -> int:
        return self.packed.nbytes + self.rows.nbytes


def packed_linear(x: torch.Tensor, w: torch.Tensor | PackedRows, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, W, bias) for W from `pack` or a PackedRows (any row count, x [..., in] fp32); a plain W
    goes to F.linear."""
    if isinstance(w, PackedRows):
        rows = x.shape[0] if x.dim() == 2 else 0
        # A few rows (a few requests decoding, one verify row of a short draft) stream the weights through the
        # tiled GEMV at about a one-row step's cost, where oneDNN's fp32 inner product takes a path up to 2x
        # slower (docs/benchmarks.md); each row keeps its one-row bits (gemv.cpp).
        if isinstance(w.rows, Tiles) and 0 < rows <= w.rows.max_rows:
            return tiled_linear(x, w.rows, bias)
        if rows == 1:
            return blocked_linear(x, w.rows, bias)
        w = w.packed
    if not w.is_mkldnn:
        return F.linear(x, w, bias)
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


def rows_copy_fits(nbytes: int) -> bool:
    """Whether keeping a second copy of `nbytes` of weights (packed_blocks) is cheap: <= 1/8 of the RAM."""
    return nbytes * 8 <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _apply_packed(model: nn.Module, head: torch.Tensor, one_row_blocks: int, ops=None) -> None:
    """one_row_blocks: 0 for "packed"; else the threads of the blocks view kept for one-row steps.
    ops: the compiled ops for packed_tiles (a tiled copy for one-row steps instead of the blocks view)."""
    for layer in model.layers:
        attn = layer.self_attn
        for owner, name in ((attn, "qkv_weight"), (attn, "o_weight"), (layer, "gate_up_weight"),
                            (layer, "down_weight")):
            dense = getattr(owner, name).data
            packed = pack(dense)
            if ops is not None:
                packed = PackedRows(packed, as_tiles(dense, ops))
            elif one_row_blocks:
                packed = PackedRows(packed, as_blocks(dense, one_row_blocks))
            del owner._parameters[name]  # a plain attribute now: an nn.Parameter cannot hold an mkldnn tensor
            setattr(owner, name, packed)
        layer.linear = attn.linear = packed_linear
    model.linear = packed_linear
    model.lm_head_matmul = pack(head.data)  # a copy: the embedding lookup keeps `head`
    if ops is not None:  # a copy (vocab x hidden x 4 bytes more)
        model.lm_head_matmul = PackedRows(model.lm_head_matmul, as_tiles(head.data, ops))
    elif one_row_blocks:  # one row of logits: blocks 2.7 vs packed 2.9 ms (2 threads); a view of `head`
        model.lm_head_matmul = PackedRows(model.lm_head_matmul, as_blocks(head.data, one_row_blocks))
    if model.lm_head is not None:  # an untied head is used only as a matmul: drop the dense copy
        model.lm_head = None


def apply_weight_layout(model: nn.Module, layout: str, threads: int) -> None:
    """Re-store the model's matmul weights in a resolved layout (see the module docstring); in place."""
    if layout == "row":
        return
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    if layout in ("packed", "packed_blocks"):
        _apply_packed(model, head, threads if layout == "packed_blocks" else 0)
        return
    if layout == "packed_tiles":
        _apply_packed(model, head, threads, tile_ops())
        return
    if layout == "column":
        for layer in model.layers:
            attn = layer.self_attn
            attn.qkv_weight.data = column_major(attn.qkv_weight.data)
            attn.o_weight.data = column_major(attn.o_weight.data)
            layer.gate_up_weight.data = column_major(layer.gate_up_weight.data)
        model.lm_head_single_row = column_major(head.data)
        return
    if layout != "blocks":
        raise ValueError(f"not a resolved weight layout: {layout!r}")
    for layer in model.layers:
        attn = layer.self_attn
        for owner, name in ((attn, "qkv_weight"), (attn, "o_weight"), (layer, "gate_up_weight"),
                            (layer, "down_weight")):
            param = getattr(owner, name)
            param.data = as_blocks(param.data, threads)
        layer.linear = attn.linear = blocked_linear
    model.linear = blocked_linear
    model.lm_head_matmul = as_blocks(head.data, threads)  # a view: the embedding lookup keeps `head`
