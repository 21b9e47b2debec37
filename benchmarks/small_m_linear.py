"""fp32 CPU matmul candidates for few-row steps (batched decode, speculative verify rows), SmolLM2 shapes.

Prints min ms per pass over 30 layers' worth of distinct weights (q/k/v fused, o, gate/up fused, down),
so the weights stream from memory as in a real step, and over the tied LM head [49152, 576], for M rows.
Sides: F.linear on the row-major weight, on a column-major copy (x @ W_t), weight_layout.py's blocks,
MKL's packed sgemm (`mkl::_mkl_linear`, what inductor's freezing uses; packed for each M), oneDNN's
prepacked weight (`mkldnn::_linear_pointwise`), radixlm's compiled tiled GEMV (`f32_linear`, the
packed_tiles layout's copy; skipped where the compiled ops do not build), and the LM head split into row
chunks.
Usage: python benchmarks/small_m_linear.py [--rows 1 2 5 8 16 32 128 512] [--threads 2] [--passes 5]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from radixlm.runtime.model.weight_layout import (as_blocks, as_tiles, blocked_linear, column_major, tile_ops,
                                                 tiled_linear)

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
HEAD = (49152, 576)


def _mkl(m: int):
    def fn(x, packed, w):
        return torch.ops.mkl._mkl_linear(x, packed, w, None, m)
    return fn


def _dnnl(x, packed):
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def _chunked(chunks: int):
    def fn(x, w):
        return torch.cat([F.linear(x, c) for c in w.chunk(chunks)], dim=-1)
    return fn


def sides(weights: list[torch.Tensor], threads: int, m: int, which: set[str]) -> dict[str, list]:
    """name -> [(fn, args) per weight]."""
    out: dict[str, list] = {"row": [(F.linear, (w,)) for w in weights]}
    if "column" in which:
        out["column"] = [(F.linear, (column_major(w),)) for w in weights]
    if "blocks" in which:
        out["blocks"] = [(blocked_linear, (as_blocks(w, threads),)) for w in weights]
    if "mkl" in which:
        out["mkl packed"] = [(_mkl(m), (torch.ops.mkl._mkl_reorder_linear_weight(w, m), w)) for w in weights]
    if "dnnl" in which:
        out["onednn packed"] = [(_dnnl, (torch.ops.mkldnn._reorder_linear_weight(w, m),)) for w in weights]
    ops = tile_ops() if "tiles" in which else None
    if ops is not None:
        out[f"tiles ({ops.tile_rows()}/tile)"] = [(tiled_linear, (as_tiles(w, ops),)) for w in weights]
    if "chunks" in which:
        for c in (2, 4, 8):
            out[f"{c} chunks"] = [(_chunked(c), (w,)) for w in weights]
    return out


def run_table(table: dict[str, list], ks: list[int], m: int, passes: int) -> dict[str, float]:
    """Min ms per pass of each side, sides interleaved pass by pass (noise only adds time)."""
    xs = {k: torch.randn(m, k) for k in set(ks)}
    best = dict.fromkeys(table, float("inf"))
    for rep in range(passes + 1):
        for name, calls in table.items():
            t0 = time.perf_counter()
            for (fn, args), k in zip(calls, ks):
                fn(xs[k], *args)
            if rep:
                best[name] = min(best[name], (time.perf_counter() - t0) * 1000)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 8, 16, 32, 128, 512])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--sides", default="column,blocks,mkl,dnnl,tiles,chunks")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    which = set(args.sides.split(","))
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{args.threads} threads, load {os.getloadavg()[0]:.2f}; min ms per pass")
    for label, shapes, layers in (("layers", SHAPES, args.layers), ("LM head", [HEAD], 1)):
        weights = [torch.randn(*s) * 0.02 for _ in range(layers) for s in shapes]
        ks = [w.shape[1] for w in weights]
        results = {}
        with torch.inference_mode():
            for m in args.rows:
                sel = which - ({"chunks"} if label == "layers" else set())
                results[m] = run_table(sides(weights, args.threads, m, sel), ks, m, args.passes)
        print(f"\n{label}: " + " ".join(f"{'M=' + str(m):>8}" for m in args.rows))
        for name in results[args.rows[0]]:
            print(f"{name:>14} " + " ".join(f"{results[m][name]:8.2f}" for m in args.rows))
        print(f"{'best':>14} " + " ".join(f"{min(results[m], key=results[m].get):>8}"[-8:] for m in args.rows))


if __name__ == "__main__":
    main()
