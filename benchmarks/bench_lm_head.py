"""The greedy LM heads vs the full fp32 head, on the real model's head (SmolLM2: [49152, 576]), for M rows.

    .venv/bin/python benchmarks/bench_lm_head.py [--model-path DIR] [--rows 1 2 4 16 32 64] [--threads 1]

Sides, both in this one process (one torch thread pool, passes interleaved, the median reported):
  full:   every logit in fp32 (oneDNN's packed matmul; the compiled tiled GEMV at one row),
  greedy: what a step whose rows only want the argmax takes: at one row the bf16-read ArgmaxHead, at more
          rows ArgmaxRows (a bf16 x bf16 matmul screen, then each row's candidates exactly; only where the
          CPU has native bf16, else the full head again).
Each row's argmax is checked equal between the sides; "kept" is the candidates per row (finite logits).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="default: the default model (SmolLM2-135M-Instruct)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 16, 32, 64])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passes", type=int, default=15)
    args = ap.parse_args()

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.quant.cpu_caps import cpu_caps

    with Engine(args.model_path, num_threads=args.threads, weight_layout="packed_tiles") as eng:
        model = eng.runner.model
        print(f"torch {torch.__version__}  threads={torch.get_num_threads()}  cpu: {cpu_caps().describe()}")
        print(f"one-row greedy head: {model.lm_head_argmax is not None}  "
              f"many-row greedy head: {model.lm_head_argmax_rows is not None}")
        print(f"{'rows':>4} {'full ms':>8} {'greedy ms':>9} {'ratio':>6} {'kept/row':>8} same")
        g = torch.Generator().manual_seed(0)
        for m in args.rows:
            # Hidden states as the final norm leaves them (the head's real input scale).
            h = model.norm(torch.randn(m, model.dims.hidden, generator=g))
            full = model._logits(h, False)
            greedy = model._logits(h, True)
            same = torch.equal(full.argmax(dim=1), greedy.argmax(dim=1))
            kept = int(torch.isfinite(greedy).sum()) / m
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.passes):
                for argmax_only in (False, True):
                    t = time.perf_counter()
                    model._logits(h, argmax_only)
                    times[argmax_only].append((time.perf_counter() - t) * 1e3)
            a, b = statistics.median(times[False]), statistics.median(times[True])
            print(f"{m:>4} {a:>8.2f} {b:>9.2f} {a / b:>5.2f}x {kept:>8.0f} {same}")


if __name__ == "__main__":
    main()
