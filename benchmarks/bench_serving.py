"""Serving benchmark: an async load generator against a radixlm (or SGLang) server's native /generate.

Runs in its own process. Workloads: `random` prompts, or `shared-prefix` (groups of prompts that share
a long prefix, where the radix cache pays off). Load: a fixed concurrency, or a Poisson request rate.
Prints throughput, TTFT / inter-token / end-to-end latency percentiles and the server's cache hit rate;
with --compare-engine it runs the same workload on the in-process Engine and prints the server's overhead.

    python benchmarks/bench_serving.py --launch --model-path /path/to/model --num-prompts 64 --concurrency 8
    python benchmarks/bench_serving.py --url http://127.0.0.1:30000 --dataset shared-prefix --request-rate 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

WORDS = ("the quick brown fox jumps over a lazy dog while paris rome berlin and madrid are capitals of "
         "countries in europe radix trees share every common prefix of the prompts they store").split()


@dataclass
class Sample:
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    ok: bool = True
    start: float = field(default_factory=time.perf_counter)
    last: float | None = None  # when the latest new tokens arrived

    def observe(self, completion_tokens: int) -> None:
        """A streamed chunk reporting completion_tokens so far: first tokens set TTFT, later ones add
        per-token inter-token latencies."""
        if completion_tokens <= self.output_tokens:
            return
        now = time.perf_counter()
        if self.last is None:
            self.ttft = now - self.start
        else:
            self.itl.append((now - self.last) / (completion_tokens - self.output_tokens))
        self.last, self.output_tokens = now, completion_tokens

    def done(self) -> "Sample":
        self.e2e = time.perf_counter() - self.start
        return self


def make_prompts(args: argparse.Namespace) -> list[str]:
    rng = random.Random(args.seed)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    if args.dataset == "random":
        return [words(args.input_len) for _ in range(args.num_prompts)]
    prefixes = [words(args.prefix_len) for _ in range(args.num_groups)]
    return [prefixes[i % args.num_groups] + " " + words(args.input_len) for i in range(args.num_prompts)]


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    vs = sorted(values)
    pick = lambda q: vs[min(len(vs) - 1, int(q * len(vs)))]  # noqa: E731
    return f"p50 {1000 * pick(0.5):8.1f}  p90 {1000 * pick(0.9):8.1f}  p99 {1000 * pick(0.99):8.1f} ms"


def report(name: str, samples: list[Sample], duration: float, hit_rate: float | None) -> dict:
    ok = [s for s in samples if s.ok]
    out_tokens = sum(s.output_tokens for s in ok)
    print(f"\n== {name} ==")
    print(f"requests ok / total     {len(ok)} / {len(samples)} in {duration:.2f}s")
    print(f"throughput              {len(ok) / duration:.2f} req/s, {out_tokens / duration:.1f} output tok/s")
    print(f"TTFT                    {percentiles([s.ttft for s in ok])}")
    print(f"inter-token latency     {percentiles([t for s in ok for t in s.itl])}")
    print(f"end-to-end latency      {percentiles([s.e2e for s in ok])}")
    if hit_rate is not None:
        print(f"cache hit rate          {hit_rate:.1%}")
    return {"tok_s": out_tokens / duration, "ttft_p50": statistics.median([s.ttft for s in ok]) if ok else 0.0}


# ---- the server ---------------------------------------------------------------------------------
async def one_request(client: httpx.AsyncClient, prompt: str, args: argparse.Namespace) -> Sample:
    body = {"text": prompt, "stream": True, "sampling_params": {
        "max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}}
    sample = Sample()
    try:
        async with client.stream("POST", "/generate", json=body) as res:
            if res.status_code != 200:
                return Sample(ok=False)
            async for line in res.aiter_lines():
                if line.startswith("data: {"):
                    sample.observe(json.loads(line[6:])["meta_info"]["completion_tokens"])
    except httpx.HTTPError:
        return Sample(ok=False)
    return sample.done()


async def run_server(url: str, prompts: list[str], args: argparse.Namespace) -> tuple[list[Sample], float]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=max(args.concurrency, 64))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        gate = asyncio.Semaphore(args.concurrency if not args.request_rate else len(prompts))
        rng = random.Random(args.seed)

        async def gated(prompt: str, delay: float) -> Sample:
            await asyncio.sleep(delay)
            async with gate:
                return await one_request(client, prompt, args)

        delays, t = [], 0.0
        for _ in prompts:
            delays.append(t)
            t += rng.expovariate(args.request_rate) if args.request_rate else 0.0
        start = time.perf_counter()
        samples = await asyncio.gather(*(gated(p, d) for p, d in zip(prompts, delays)))
        return list(samples), time.perf_counter() - start


def cache_stats(url: str, api_key: str | None) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(url + "/server_info", headers=headers, timeout=30).json().get("cache_stats", {})


def hit_rate_between(before: dict, after: dict) -> float:
    prompt = after.get("prompt_tokens", 0) - before.get("prompt_tokens", 0)
    return (after.get("cached_tokens", 0) - before.get("cached_tokens", 0)) / prompt if prompt else 0.0


# ---- the in-process engine (same workload, no sockets) ------------------------------------------
def run_engine(prompts: list[str], args: argparse.Namespace) -> tuple[list[Sample], float, float]:
    from radixlm.runtime.engine import Engine

    params = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    with Engine(args.model_path, num_threads=args.num_threads) as engine:
        engine.generate(prompts[0], {"max_new_tokens": 1})  # warm-up, like the server's health check
        engine.flush_cache()

        def one(prompt: str) -> Sample:
            sample = Sample()
            for chunk in engine.generate(prompt, params, stream=True):
                sample.observe(chunk["meta_info"]["completion_tokens"])
            return sample.done()

        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            samples = list(pool.map(one, prompts))
        duration = time.perf_counter() - start
        return samples, duration, engine.cache_stats()["hit_rate"]


def launch(args: argparse.Namespace):
    from radixlm.lang.backend.runtime import Runtime

    options = {"max_total_tokens": args.max_total_tokens, "num_threads": args.num_threads}
    return Runtime(args.model_path, log_level="warning", port=args.port, **options)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="an already running server")
    p.add_argument("--launch", action="store_true", help="start a server for the run (with --model-path)")
    p.add_argument("--model-path", default=None)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", choices=["random", "shared-prefix"], default="random")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=32, help="words per prompt (after any shared prefix)")
    p.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: words in each group's prefix")
    p.add_argument("--num-groups", type=int, default=4)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second")
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--compare-engine", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not args.url and not args.launch:
        p.error("give --url or --launch")
    print(f"radixlm bench_serving: {args.dataset}, {args.num_prompts} prompts, concurrency {args.concurrency}, "
          f"rate {args.request_rate or 'max'}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"num_threads={args.num_threads or 'default'}")
    prompts = make_prompts(args)
    runtime = launch(args) if args.launch else None
    try:
        url = runtime.url if runtime else args.url.rstrip("/")
        before = cache_stats(url, args.api_key)
        samples, duration = asyncio.run(run_server(url, prompts, args))
        server = report("server (HTTP + ZMQ processes)", samples, duration,
                        hit_rate_between(before, cache_stats(url, args.api_key)))
    finally:
        if runtime:
            runtime.shutdown()
    if args.compare_engine:
        samples, duration, hit = run_engine(prompts, args)
        engine = report("in-process Engine (same workload)", samples, duration, hit)
        print(f"\nserver overhead: throughput {server['tok_s'] / engine['tok_s'] - 1:+.1%}, "
              f"TTFT p50 {1000 * (server['ttft_p50'] - engine['ttft_p50']):+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
