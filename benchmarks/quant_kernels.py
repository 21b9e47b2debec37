"""Weight-only quantized and bf16 CPU matmul kernels vs fp32, on SmolLM2-135M's linear shapes.

Prints ms per pass over 30 layers' worth of distinct weights (q/k/v fused, o, gate/up fused, down), so
nothing stays in cache, for M = 1, 4, 32, 128, 512 rows, and the LM head [49152, 576] alone. Sides:
fp32 F.linear (row-major), fp32 blocks (weight_layout.py), bf16 F.linear, torch's int8 per-channel
`_weight_int8pack_mm` and int4 groupwise `_weight_int4pack_mm_for_cpu` with fp32 and bf16 activations,
fbgemm's dynamic int8 linear (activations quantized too, per tensor), and radixlm's compiled few-row
GEMV (radixlm/kernels/cpu, csrc/gemv.cpp) on int8 and fp32 weights in its tiled layout, fp32 activations.
Usage: python benchmarks/quant_kernels.py [--rows 1 4 32 128 512] [--threads 2] [--passes 6] [--only int8 gemv] [--cpu-time]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu import load
from radixlm.runtime.model.weight_layout import as_blocks, blocked_linear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
HEAD = (49152, 576)


def int8_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def int4_pack(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    g = w.view(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).view(n, k)
    zero = lo + 8 * scale
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return packed, torch.stack([scale, zero], -1).transpose(0, 1).contiguous()


def sides(weights: list[torch.Tensor], threads: int, only: list[str]) -> dict[str, tuple]:
    """name -> (activation dtype, [(fn, args) per weight]); only: keep the names containing one of these."""
    bf = torch.bfloat16
    out: dict[str, tuple] = {}

    def want(name: str) -> bool:
        return not only or any(o in name for o in only)

    def add(name: str, dtype: torch.dtype, calls) -> None:
        if want(name):
            out[name] = (dtype, list(calls()))

    add("fp32 row", torch.float32, lambda: [(F.linear, (w,)) for w in weights])
    add("fp32 blocks", torch.float32, lambda: [(blocked_linear, (as_blocks(w.clone(), threads),)) for w in weights])
    add("bf16 F.linear", bf, lambda: [(F.linear, (w.to(bf),)) for w in weights])
    i8 = [int8_pack(w) for w in weights]
    add("int8 fp32-act", torch.float32, lambda: [(torch.ops.aten._weight_int8pack_mm, (q, s)) for q, s in i8])
    add("int8 bf16-act", bf, lambda: [(torch.ops.aten._weight_int8pack_mm, (q, s.to(bf))) for q, s in i8])
    for g in (32, 64):
        for name, dt in (("fp32", torch.float32), ("bf16", bf)):
            add(f"int4 g{g} {name}-act", dt,
                lambda g=g, dt=dt: [(_int4(g), (p, sz.to(dt))) for p, sz in (int4_pack(w, g) for w in weights)])
    add("fbgemm dyn int8", torch.float32, lambda: [(_dyn, (_prepack(w),)) for w in weights])
    ops = load()
    if ops is not None:
        add("int8 gemv C++", torch.float32, lambda: [(ops.int8_linear, (ops.pack_rows(q), s, None)) for q, s in i8])
        add("fp32 gemv C++", torch.float32,
            lambda: [(ops.f32_linear, (ops.pack_rows(w), w.shape[0], None)) for w in weights])
    return out


def _prepack(w: torch.Tensor):
    return torch.ops.quantized.linear_prepack(torch.quantize_per_channel(
        w, int8_pack(w)[1].double(), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8))


def _int4(group: int):
    return lambda x, p, sz: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, group, sz)


def _dyn(x: torch.Tensor, packed) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, packed, True)


CLOCK = time.perf_counter  # --cpu-time: time.thread_time (1 thread: time slices lost to other processes drop out)


def run_table(table: dict[str, tuple], weights: list[torch.Tensor], m: int, passes: int, scale: int) -> dict[str, float]:
    """Min ms per pass of each side, the sides interleaved pass by pass (a loaded machine's noise only
    ever adds time, so the minimum is the estimate least disturbed by it)."""
    xs = {(dt, k): torch.randn(m, k).to(dt) for dt in (torch.float32, torch.bfloat16) for k in {w.shape[1] for w in weights}}
    ks = [w.shape[1] for w in weights]
    best = dict.fromkeys(table, float("inf"))
    for rep in range(passes + 1):
        for name, (dtype, calls) in table.items():
            t0 = CLOCK()
            for (fn, args), k in zip(calls, ks):
                fn(xs[dtype, k], *args)
            if rep:  # the first pass warms up
                best[name] = min(best[name], (CLOCK() - t0) * 1000 * scale)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 32, 128, 512])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--only", nargs="+", default=[], help="keep the sides whose name contains one of these")
    ap.add_argument("--cpu-time", action="store_true", help="time the calling thread's CPU time (1 thread only)")
    args = ap.parse_args()
    if args.cpu_time:
        if args.threads != 1:
            ap.error("--cpu-time needs --threads 1 (other threads' work would not be counted)")
        global CLOCK
        CLOCK = time.thread_time
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{args.threads} threads; min ms per pass over {args.layers} layers (M >= 128: a fifth of them, x 5)")
    for label, shapes, layers in (("layers", SHAPES, args.layers), ("LM head", [HEAD], 1)):
        full = [torch.randn(*s) * 0.02 for _ in range(layers) for s in shapes]
        few = full[: len(shapes) * max(1, layers // 5)] if layers > 5 else full
        tables = {id(full): sides(full, args.threads, args.only)}
        if few is not full:
            tables[id(few)] = sides(few, args.threads, args.only)
        results = {}
        with torch.inference_mode():
            for m in args.rows:
                ws = full if m < 128 or few is full else few
                results[m] = run_table(tables[id(ws)], ws, m, args.passes, len(full) // len(ws))
        print(f"\n{label}: " + " ".join(f"{'M=' + str(m):>9}" for m in args.rows))
        for name in results[args.rows[0]]:
            print(f"{name:>18} " + " ".join(f"{results[m][name]:9.2f}" for m in args.rows))


if __name__ == "__main__":
    main()
