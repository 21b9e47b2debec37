"""Quality and batch-1 speed of the CPU weight modes on the real SmolLM2-135M-Instruct (or --model).

Perplexity of a fixed public-domain text (benchmarks/data/declaration.txt, ~2.7k tokens, scored as one
prompt through the Engine's input logprobs), greedy agreement with fp32 over chat prompts (share of
identical continuations, and mean share of tokens before the first difference), and with --speed the
batch-1 decode tok/s of each mode (sides alternated, best of --repeats). Each mode is a real Engine.
Usage: python benchmarks/quant_quality.py [--modes fp32 bf16 int8 int4 int8-gemv int8-torch] [--new 32] [--speed]
       [--speed-only] [--threads 1 --cpu-time]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.quant import kernels as _kernels
from radixlm.runtime.model.quant.cpu_caps import cpu_caps

TEXT = Path(__file__).parent / "data" / "declaration.txt"
MODES = {"fp32": {"quantization": "none", "dtype": "float32"},
         "bf16": {"quantization": "none", "dtype": "bfloat16"},
         "int8": {"quantization": "int8", "dtype": "float32"},
         "int4": {"quantization": "int4", "dtype": "float32"},
         # int8 with one kernel at every row count (perplexity is scored in one many-row prefill, where
         # plain int8 runs the bf16 copies): gemv = radixlm's compiled GEMV, fp32 activations (what every
         # batch-1 decode step computes); torch = _weight_int8pack_mm, bf16 activations (before session 26)
         "int8-gemv": {"quantization": "int8", "dtype": "float32"},
         "int8-torch": {"quantization": "int8", "dtype": "float32"}}
# mode -> (kernels.GEMV_MAX_ROWS, kernels.DENSE_MIN_ROWS) while it runs (the Engine runs in this process)
KERNEL_ROWS = {"int8-gemv": (1 << 30, 1 << 30), "int8-torch": (0, 1 << 30)}
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain what a hash table is in two sentences.", "List three prime numbers greater than 50.",
           "Translate 'good morning' into Spanish and German.", "What causes the seasons on Earth?",
           "Give me a short recipe for pancakes.", "Who wrote Pride and Prejudice?",
           "Summarize the plot of Romeo and Juliet.", "How do I reverse a list in Python?",
           "What is 17 times 23?", "Name a famous painting by Vincent van Gogh."]


def perplexity(engine: Engine, ids: list[int]) -> float:
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0},
                          return_logprob=True, logprob_start_len=0)
    lps = [e[0] for e in out["meta_info"]["input_token_logprobs"] if e[0] is not None]
    return math.exp(-sum(lps) / len(lps))


def greedy(engine: Engine, new: int) -> list[list[int]]:
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True) for p in PROMPTS]
    res = engine.generate(prompts, {"max_new_tokens": new, "temperature": 0, "ignore_eos": True})
    return [r["output_ids"] for r in res]


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[float, float]:
    same = sum(a == b for a, b in zip(ref, got)) / len(ref)
    prefix = []
    for a, b in zip(ref, got):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n / max(1, len(a)))
    return same, sum(prefix) / len(prefix)


def decode_tok_s(engine: Engine, new: int = 64, cpu: bool = False) -> float:
    """Batch-1 decode tok/s; cpu: tokens per second of this process's CPU time instead of wall time
    (with one thread, a measure that a loaded machine's time slicing leaves alone)."""
    clock = time.process_time if cpu else time.perf_counter
    t0 = clock()
    out = engine.generate("The history of the printing press", {"max_new_tokens": new, "temperature": 0,
                                                               "ignore_eos": True})
    return out["meta_info"]["completion_tokens"] / (clock() - t0)


def speed_rounds(modes: list[str], repeats: int, threads: int | None, cpu: bool) -> dict[str, float]:
    """Best batch-1 decode tok/s per mode, each run in its own process (one OpenMP pool each), alternated."""
    import subprocess
    import sys

    best = dict.fromkeys(modes, 0.0)
    for _ in range(repeats):
        for m in modes:
            cmd = [sys.executable, __file__, "--speed-one", m] + (["--threads", str(threads)] if threads else [])
            cmd += ["--cpu-time"] if cpu else []
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            best[m] = max(best[m], float(out.strip().splitlines()[-1]))
    return best


_DEFAULT_ROWS = (_kernels.GEMV_MAX_ROWS, _kernels.DENSE_MIN_ROWS)


def _use_kernels(mode: str) -> None:
    _kernels.GEMV_MAX_ROWS, _kernels.DENSE_MIN_ROWS = KERNEL_ROWS.get(mode, _DEFAULT_ROWS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--modes", nargs="+", default=["fp32", "bf16", "int8", "int4"], choices=list(MODES))
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--speed-one", choices=list(MODES), help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cpu-time", action="store_true", help="--speed in tokens per CPU-second (use with --threads 1)")
    ap.add_argument("--speed-only", action="store_true", help="skip the quality table")
    args = ap.parse_args()
    extra = {"num_threads": args.threads} if args.threads else {}
    if args.speed_one:
        _use_kernels(args.speed_one)
        with Engine(args.model, **MODES[args.speed_one], **extra) as e:
            decode_tok_s(e, 8)  # warm-up
            print(decode_tok_s(e, cpu=args.cpu_time))
        return
    print(f"torch {torch.__version__}, CPU {cpu_caps().describe()}, load {os.getloadavg()[0]:.1f}")
    if not args.speed_only:
        quality(args, extra)
    if args.speed or args.speed_only:
        best = speed_rounds(args.modes, args.repeats, args.threads, args.cpu_time)
        unit = "tokens per CPU-second" if args.cpu_time else "tok/s"
        print(f"batch-1 decode, {unit} (64 new, best of {args.repeats}, load {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{m} {v:.1f}" for m, v in best.items()))


def quality(args, extra: dict) -> None:
    ref = base = None
    print(f"{'mode':>10} {'ppl':>8} {'vs fp32':>8} {'same':>6} {'prefix':>7}")
    for m in args.modes:
        _use_kernels(m)
        with Engine(args.model, **MODES[m], **extra) as e:
            ids = e.tokenizer(TEXT.read_text())["input_ids"]
            ppl, outs = perplexity(e, ids), greedy(e, args.new)
            e.check_integrity()
        if m == "fp32":
            ref, base = outs, ppl
        rel = f"{(ppl / base - 1) * 100:+.2f}%" if base else "-"
        same, prefix = agreement(ref, outs) if ref else (float("nan"),) * 2
        print(f"{m:>10} {ppl:8.3f} {rel:>8} {same:6.2f} {prefix:7.2f}", flush=True)
    print(f"text: {TEXT.name}, {len(ids)} tokens; greedy: {len(PROMPTS)} chat prompts x {args.new} tokens")


if __name__ == "__main__":
    main()
