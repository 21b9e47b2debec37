"""Tensor parallelism: decode step time at TP=2 vs TP=1 on the same cores, and whether outputs agree.

    .venv/bin/python benchmarks/bench_tp.py [--model-path DIR] [--tp 2] [--cores N] [--new 32]

Without --model-path it builds a random Llama of SmolLM2-135M's width (hidden 576, intermediate 1536,
vocab 384 tiny tokenizer) but 8 heads / 4 kv heads, so it splits two ways (SmolLM2's 9 heads do not).
TP=1 runs with `cores` threads; TP=N runs N ranks with cores // N threads each, so both use the same
cores. On CPU TP is expected to be slower: every layer pays two gloo all-reduces over loopback and the
ranks share a memory bus; the point on CPU is correctness. On several GPUs, NCCL is the transport.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import torch

from radixlm.runtime.engine import Engine
from radixlm.testing import build_tiny_model

PROMPT = "Once upon a time there was a small language model that loved to answer questions politely."


def measure(model_dir: str, tp: int, threads: int, batch: int, new: int) -> tuple[float, float, list]:
    """(ms per decode step, start-up s, outputs) for `batch` concurrent greedy requests."""
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    with Engine(model_dir, tp_size=tp, num_threads=threads, max_total_tokens=8192) as engine:
        startup = time.perf_counter() - t0
        prompts = [f"{i} {PROMPT}" for i in range(batch)]
        engine.generate(prompts, {**params, "max_new_tokens": 1})  # prefill + warm-up; fills the cache
        steps0 = engine.scheduler.num_forward_steps
        t = time.perf_counter()
        outs = engine.generate(prompts, params)  # prompts are cached: these steps are (almost all) decode
        dt = time.perf_counter() - t
        steps = engine.scheduler.num_forward_steps - steps0
    return 1000 * dt / steps, startup, [o["output_ids"] for o in outs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--batches", default="1,8")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_path or str(build_tiny_model(
            tmp, arch="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=8, num_key_value_heads=4))
        per_rank = max(1, args.cores // args.tp)
        print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
              f"{args.cores} cores; TP=1: {args.cores} threads; TP={args.tp}: {per_rank} threads x {args.tp} ranks")
        print(f"{'batch':>5} | {'TP=1 ms/step':>12} | {f'TP={args.tp} ms/step':>12} | {'ratio':>5} | same output")
        for batch in (int(b) for b in args.batches.split(",")):
            ms1, _, out1 = measure(model_dir, 1, args.cores, batch, args.new)
            ms2, start2, out2 = measure(model_dir, args.tp, per_rank, batch, args.new)
            print(f"{batch:>5} | {ms1:>12.1f} | {ms2:>12.1f} | {ms2 / ms1:>5.2f} | {out1 == out2}"
                  f"  (TP={args.tp} start-up {start2:.1f}s)")


if __name__ == "__main__":
    main()
