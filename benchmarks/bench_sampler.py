"""Sampler micro-benchmark: time per call for B in {1, 32} x V = 49152 (SmolLM2's vocabulary).

Runs in the user's process, standalone: `python benchmarks/bench_sampler.py [--threads N] [--iters N]`.
Prints one table row per (mode, batch size): min, median and p90 time per call in milliseconds (on a
shared machine the min is the least disturbed number).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.runtime.sampling.sampler import Sampler, SamplingRow, make_generator
from radixlm.sampling_params import SamplingParams

VOCAB = 49152
MODES: dict[str, dict] = {
    "greedy (fast path)": dict(temperature=0.0),
    "temperature only": dict(temperature=0.8),
    "top-p 0.9 + top-k 50": dict(temperature=0.8, top_p=0.9, top_k=50),
    # randn * 3 logits are flat: the top-p set is far wider than the 1024 candidates -> full-sort path.
    "top-p 0.9 only (worst)": dict(temperature=0.8, top_p=0.9),
    "top-p/top-k, seeded": dict(temperature=0.8, top_p=0.9, top_k=50, sampling_seed=1),
    "top-p/top-k + penalties": dict(temperature=0.8, top_p=0.9, top_k=50, frequency_penalty=0.5,
                                    presence_penalty=0.5, repetition_penalty=1.1),
}


def make_rows(batch: int, params: dict) -> list[SamplingRow]:
    rows = []
    for i in range(batch):
        p = SamplingParams(**params)
        p.normalize()
        prompt = [(i * 31 + j * 7) % VOCAB for j in range(128)]
        output = [(i * 17 + j * 13) % VOCAB for j in range(64)]
        rows.append(SamplingRow(p, prompt, output, make_generator(p.sampling_seed)))
    return rows


def time_calls(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], iters: int) -> list[float]:
    for _ in range(3):  # warm-up: allocator, kernels
        sampler(logits, rows)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        sampler(logits, rows)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sampler = Sampler(VOCAB, frozenset({0}))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, V={VOCAB}, iters {args.iters}")
    print(f"{'mode':<26}{'B':>4}{'min ms':>9}{'median ms':>11}{'p90 ms':>9}{'median us/row':>15}")
    for mode, params in MODES.items():
        for batch in (1, 32):
            logits = torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
            times = sorted(time_calls(sampler, logits, make_rows(batch, params), args.iters))
            median = statistics.median(times)
            p90 = times[int(0.9 * (len(times) - 1))]
            print(f"{mode:<26}{batch:>4}{times[0]:>9.3f}{median:>11.3f}{p90:>9.3f}{median * 1e3 / batch:>15.1f}")


if __name__ == "__main__":
    main()
