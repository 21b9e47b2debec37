"""Which fp32 CPU weight layout (and how many threads) streams one-row steps fastest on this machine.

Runs inside the scheduler process, once per process, before the weights are re-stored (weight_layout.py).

Why measure: weight_layout.py's static rule (blocks with >= 2 threads) was measured on a 2-core AMD EPYC
(Zen 3), where MKL keeps a one-row GEMV on one core and only the blocks' bmm uses both. On a 2-core Intel
Xeon (AVX-512, AMX) MKL threads the GEMV itself and the blocks layout is the slowest of the three: batch-1
decode of SmolLM2 ran 2.4x faster with the column layout on both threads (docs/benchmarks.md, "CPU
speed"). The issue is the machine, not the model, so `auto` times the candidates on weights of the
model's own shapes (enough layers' worth to leave the caches) and keeps the fastest. A candidate's score
is a one-row pass plus a FEW_ROWS pass: batch-1 decode is where CPU serving with few requests spends its
time, and steps of a few rows (a few requests decoding, speculative verify rows) come next; a layout that
wins one row narrowly but doubles the few-row time (column on a 2-core AMD EPYC: 7.7 vs 6.2 ms
at one row, 13-25 vs 7-11 ms at 2-16 rows for packed) loses. The "packed" layout (oneDNN) is a candidate
where torch has it, also with one thread (MKL's fp32 GEMM runs AVX2 code on AMD CPUs), and so is
"packed_blocks" (the blocks' one-row pass with packed's few-row pass, where its second copy of the weights
fits: weight_layout.rows_copy_fits; on that EPYC, 1 thread, 12 layers: M=1 blocks 5.6 / packed 7.8 ms).

Where radixlm's compiled ops build and oneDNN is there, nothing is measured: packed_tiles is taken (its
few-row pass is packed's, its one-row pass the compiled fp32 GEMV, which streams the weights at the memory's
rate on any AVX2 or AVX-512 CPU). Why not let the probe pick it: a probe is a few milliseconds of timing,
and on a shared machine (CI, a laptop doing other work) whatever else runs decides it. On 2 cores
under load ~2: `auto` picked `packed` with 1 small-step thread in one process of three, which then decoded
at 42 tok/s against 69-93 for packed_tiles (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from radixlm.runtime.model.weight_layout import (as_blocks, as_tiles, blocked_linear, column_major, pack,
                                                 packed_available, packed_linear, rows_copy_fits, tile_ops,
                                                 tiled_linear)

PROBE_BYTES = 96 << 20  # weights per pass: past a 2-core VM's share of the caches
MIN_MODEL_BYTES = 32 << 20  # smaller models (test checkpoints) keep the static rule: nothing to gain
ROUNDS = 4  # candidates interleaved per round; the minimum per candidate is kept (noise only adds time)
FEW_ROWS = 8  # the second pass of the score (see the module docstring)


@functools.lru_cache(maxsize=8)
def probe_layout(hidden: int, intermediate: int, num_layers: int, threads: int) -> tuple[str, int] | None:
    """(layout, threads for small steps) with the fastest one-row plus FEW_ROWS-row passes over the model's
    layer weights, or None where nothing is measured (a model too small for the layout to matter, or one
    thread without oneDNN: nothing to choose)."""
    per_layer = (2 * hidden * hidden + 3 * hidden * intermediate) * 4  # ~qkv + o, gate/up, down (fp32)
    if per_layer * num_layers < MIN_MODEL_BYTES or (threads < 2 and not packed_available()):
        return None
    if packed_available() and tile_ops() is not None and rows_copy_fits(per_layer * num_layers):
        return "packed_tiles", threads  # see the module docstring: not measured
    layers = max(1, min(num_layers, PROBE_BYTES // per_layer))
    rows = [torch.full((out, inp), 0.01) for _ in range(layers)  # values do not change the time
            for out, inp in ((hidden, hidden), (hidden, hidden), (2 * intermediate, hidden), (hidden, intermediate))]
    candidates = _candidates(rows, hidden, threads)
    x = {(k, m): torch.full((m, k), 0.5) for k in (hidden, intermediate) for m in (1, FEW_ROWS)}
    best = {key: [float("inf")] * 2 for key in candidates}
    before = torch.get_num_threads()
    try:
        for _ in range(ROUNDS):
            for (layout, small), (linear, weights) in candidates.items():
                torch.set_num_threads(small)
                for i, m in enumerate((1, FEW_ROWS)):
                    t0 = time.perf_counter()
                    for w, w0 in zip(weights, rows):
                        linear(x[w0.shape[1], m], w)
                    best[(layout, small)][i] = min(best[(layout, small)][i], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    if ("packed", threads) in best and ("blocks", threads) in best and rows_copy_fits(per_layer * num_layers):
        # packed_blocks runs one-row steps in the blocks and the rest packed: its passes are theirs
        best[("packed_blocks", threads)] = [best[("blocks", threads)][0], best[("packed", threads)][1]]
    tiles = best.pop(("tiles", threads), None)  # only as packed_tiles' one-row pass
    if tiles is not None and ("packed", threads) in best and rows_copy_fits(per_layer * num_layers):
        best[("packed_tiles", threads)] = [tiles[0], best[("packed", threads)][1]]
    if threads == 1:
        best.pop(("blocks", 1), None)
    return min(best, key=lambda key: sum(best[key]))


def _candidates(rows: list[torch.Tensor], hidden: int, threads: int) -> dict:
    """(layout, small-step threads) -> (linear, the weights in that layout)."""
    column = [column_major(w) if w.shape[1] == hidden else w for w in rows]  # down stays row-major there
    out = {("column", n): (F.linear, column) for n in {threads, max(1, threads - 1)}}
    if threads >= 2:
        out[("blocks", threads)] = (blocked_linear, [as_blocks(w, threads) for w in rows])
    if packed_available():
        if threads == 1:  # only as packed_blocks' one-row pass (blocks alone lose few-row steps here)
            out[("blocks", 1)] = (blocked_linear, [as_blocks(w, 1) for w in rows])
        packed = [pack(w) for w in rows]
        out.update({("packed", n): (packed_linear, packed) for n in {threads, max(1, threads - 1)}})
        ops = tile_ops()
        if ops is not None:  # the compiled GEMV (packed_tiles' one-row pass)
            out[("tiles", threads)] = (tiled_linear, [as_tiles(w, ops) for w in rows])
    return out
