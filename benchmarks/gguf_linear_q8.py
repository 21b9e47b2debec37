"""G weights/s of radixlm's GGUF block GEMV (radixlm/kernels/cpu/csrc/gguf_blocks.cpp): the fp32-activation
op (gguf_linear), the int8-activation one (gguf_linear_q8) and, for the types gguf_pack takes, the same on
panels of 16 rows (gguf_linear_packed, csrc/gguf_packed.cpp), per type, for M rows.

Random blocks with sane scales, [4096, 1536] per type (larger than L2, so the weights stream as in decode).
1 thread: median CPU time (time.process_time) per call; more threads: median wall time.
Usage: python benchmarks/gguf_linear_q8.py [--isa native] [--threads 1 2] [--rows 1 4 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from test_cpu_gguf_blocks import blocks_of  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

from radixlm.kernels.cpu import build  # noqa: E402
from radixlm.runtime.model.quant.gguf_blocks import PACKED_TYPES  # noqa: E402

TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def measure(fn, threads: int, reps: int) -> float:
    clock = time.process_time if threads == 1 else time.perf_counter
    fn()
    times = []
    for _ in range(reps):
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", default="native")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=int, default=4096)
    ap.add_argument("--inp", type=int, default=1536)
    a = ap.parse_args()
    ops = build.load(a.isa)
    ops_list = [("fp32", ops.gguf_linear)] + ([("q8", ops.gguf_linear_q8)] if hasattr(ops, "gguf_linear_q8") else [])
    weights = a.out * a.inp
    for threads in a.threads:
        torch.set_num_threads(threads)
        for qtype in TYPES:
            data = torch.from_numpy(blocks_of(qtype, a.out, a.inp, seed=0))
            calls = [(name, lambda x, op=op: op(x, [data], [qtype.value], None)) for name, op in ops_list]
            if qtype.value in PACKED_TYPES:
                packed = ops.gguf_pack(data, qtype.value)
                calls.append(("packed", lambda x: ops.gguf_linear_packed(x, [packed], [qtype.value], [a.out], None)))
            line = [f"{a.isa} t={threads} {qtype.name:5}"]
            for m in a.rows:
                x = torch.randn(m, a.inp)
                cells = []
                for name, call in calls:
                    s = measure(lambda: call(x), threads, a.reps)
                    cells.append(f"{name} {weights / s / 1e9:5.1f}")
                line.append(f"M={m}: " + " ".join(cells))
            print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
