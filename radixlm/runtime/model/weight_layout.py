"""Memory layout of the weight matrices for CPU matmuls (fp32), chosen by measurement.

Runs inside the scheduler process (and each tensor-parallel rank), once, after loading and sharding.

Why: CPU decode is bound by how fast the weights stream from memory, and torch's fp32 GEMV (MKL) streams
a [out, in] row-major weight noticeably slower than the same weight stored column-major (x @ W^T with
W^T contiguous). Measured on a 2-core AMD EPYC (Zen 3), 1 thread, SmolLM2-135M shapes (30 layers' worth,
so nothing stays in cache), batch of 1 row, best of 4 rounds on a shared machine; the ratios held in
every round (benchmarks/bench_engine.py --layouts prints the end-to-end effect):

    weight [out, in]      row-major    column-major
    qkv   [960, 576]      11.1 GB/s    14.6 GB/s
    o     [576, 576]      10.2 GB/s    12.2 GB/s
    gate_up [3072, 576]   12.5 GB/s    17.9 GB/s
    down  [576, 1536]     15.8 GB/s    13.3 GB/s   <- stays row-major
    LM head [49152, 576]  12.4 GB/s    20.2 GB/s

With 4 to 32 rows the column-major GEMMs are 0-15% slower (and the LM head 35% slower at 4 rows), so
the layers take the layout that wins where CPU serving spends its time (few concurrent requests), and
the LM head keeps both: the row-major matrix (which the tied embedding lookup needs anyway) for several
rows, and a column-major copy for single-row decode (+vocab x hidden x 4 bytes of memory).

The logical shape stays [out, in]: F.linear sees a transposed-contiguous weight and calls the
column-major GEMM itself, so the model code does not change, and outputs are the same products summed in
another order (greedy parity with transformers is tested with this layout on).
"""

from __future__ import annotations

import torch
from torch import nn

LAYOUTS = ("auto", "row")


def column_major(w: torch.Tensor) -> torch.Tensor:
    """The same [out, in] matrix, stored so that its transpose is contiguous."""
    return w.t().contiguous().t()


def apply_weight_layout(model: nn.Module, layout: str, device: torch.device, dtype: torch.dtype) -> None:
    """Re-store the model's matmul weights for this device (see the module docstring); in place."""
    if layout not in LAYOUTS:
        raise ValueError(f"weight_layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if layout == "row" or device.type != "cpu" or dtype != torch.float32:
        return  # measured only for fp32 on CPU; GPUs and bf16 keep the loaded layout
    for layer in model.layers:
        attn = layer.self_attn
        attn.qkv_weight.data = column_major(attn.qkv_weight.data)
        attn.o_weight.data = column_major(attn.o_weight.data)
        layer.gate_up_weight.data = column_major(layer.gate_up_weight.data)
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    model.lm_head_single_row = column_major(head.data)
