"""Which fp32 CPU weight layout (and how many threads) streams one-row steps fastest on this machine.

Runs inside the scheduler process, once per process, before the weights are re-stored (weight_layout.py).

Why measure: weight_layout.py's static rule (blocks with >= 2 threads) was measured on a 2-core AMD EPYC
(Zen 3), where MKL keeps a one-row GEMV on one core and only the blocks' bmm uses both. On a 2-core Intel
Xeon (AVX-512, AMX) MKL threads the GEMV itself and the blocks layout is the slowest of the three: batch-1
decode of SmolLM2 ran 2.4x faster with the column layout on both threads (docs/benchmarks.md, "CPU
speed"). The issue is the machine, not the model, so `auto` times the candidates on weights of the
model's own shapes (enough layers' worth to leave the caches) and keeps the fastest. Batch-1 decode is
where CPU serving with few requests spends its time, so one-row passes decide.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from radixlm.runtime.model.weight_layout import as_blocks, blocked_linear, column_major

PROBE_BYTES = 96 << 20  # weights per pass: past a 2-core VM's share of the caches
MIN_MODEL_BYTES = 32 << 20  # smaller models (test checkpoints) keep the static rule: nothing to gain
ROUNDS = 4  # candidates interleaved per round; the minimum per candidate is kept (noise only adds time)


@functools.lru_cache(maxsize=8)
def probe_layout(hidden: int, intermediate: int, num_layers: int, threads: int) -> tuple[str, int] | None:
    """(layout, threads for small steps) with the fastest one-row pass over the model's layer weights, or
    None where nothing is measured (one thread, or a model too small for the layout to matter)."""
    per_layer = (2 * hidden * hidden + 3 * hidden * intermediate) * 4  # ~qkv + o, gate/up, down (fp32)
    if threads < 2 or per_layer * num_layers < MIN_MODEL_BYTES:
        return None
    layers = max(1, min(num_layers, PROBE_BYTES // per_layer))
    rows = [torch.full((out, inp), 0.01) for _ in range(layers)  # values do not change the time
            for out, inp in ((hidden, hidden), (hidden, hidden), (2 * intermediate, hidden), (hidden, intermediate))]
    column = [column_major(w) if w.shape[1] == hidden else w for w in rows]  # down stays row-major there
    blocks = [as_blocks(w, threads) for w in rows]
    candidates = {("blocks", threads): (blocked_linear, blocks), ("column", threads): (F.linear, column),
                  ("column", threads - 1): (F.linear, column)}
    x = {hidden: torch.full((1, hidden), 0.5), intermediate: torch.full((1, intermediate), 0.5)}
    best = {key: float("inf") for key in candidates}
    try:
        for _ in range(ROUNDS):
            for (layout, small), (linear, weights) in candidates.items():
                torch.set_num_threads(small)
                t0 = time.perf_counter()
                for w in weights:
                    linear(x[w.shape[-1]], w)
                best[(layout, small)] = min(best[(layout, small)], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return min(best, key=best.__getitem__)
