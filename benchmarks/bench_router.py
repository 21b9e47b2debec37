"""Data-parallel router: cache hit rate and throughput, cache-aware vs round-robin, on real replicas.

    .venv/bin/python benchmarks/bench_router.py [--model-path DIR] [--replicas 2] [--tenants 8]
        [--questions 8] [--concurrency 8] [--new 8] [--dp-size-too]

Starts `--replicas` `radixlm serve` processes (a tiny random Llama unless --model-path; 1 thread each)
and, per policy, a `python -m radixlm.router` in front of them; flushes every cache; sends a multi-tenant
workload (each tenant a long shared system prefix + its own questions, in a shuffled order, `concurrency`
at a time). The hit rate is what the replicas report (cached_tokens / prompt_tokens). With
--dp-size-too it then runs the same workload, per policy, on one `radixlm serve --dp-size <replicas>`
(data parallelism inside one server, 1 thread per scheduler rank).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from radixlm.testing import build_tiny_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], url: str, timeout: float = 300) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} exited with {proc.returncode}")
        time.sleep(0.5)
    raise TimeoutError(f"{args[0]} did not become healthy")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def workload(tenants: int, questions: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prefixes = [f"[tenant {t}] You are assistant number {t}. " + " ".join(
        rng.choice(["Answer", "politely", "briefly", "in French", "with care", "and cite", "sources"])
        for _ in range(60)) + "\n" for t in range(tenants)]
    prompts = [p + f"Question {q}: what is {q} plus {t}?" for t, p in enumerate(prefixes) for q in range(questions)]
    rng.shuffle(prompts)
    return prompts


def run(router_url: str, prompts: list[str], concurrency: int, new: int) -> tuple[float, float, float]:
    """(hit rate, requests/s, output tokens/s)."""
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=router_url, timeout=600) as client:
        assert client.post("/flush_cache").status_code == 200

        def one(text: str) -> dict:
            res = client.post("/generate", json={"text": text, "sampling_params": params})
            res.raise_for_status()
            return res.json()["meta_info"]

        t = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            metas = list(pool.map(one, prompts))
        dt = time.perf_counter() - t
    cached = sum(m["cached_tokens"] for m in metas)
    prompt = sum(m["prompt_tokens"] for m in metas)
    completion = sum(m["completion_tokens"] for m in metas)
    return cached / prompt, len(prompts) / dt, completion / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--new", type=int, default=8)
    p.add_argument("--dp-size-too", action="store_true", help="also one server with --dp-size <replicas>")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model_path or str(build_tiny_model(tmp, arch="llama"))
        ports = [free_port() for _ in range(a.replicas)]
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        servers = [start(["radixlm.launch_server", "--model-path", model, "--port", str(port), "--num-threads", "1",
                          "--log-level", "warning"], url) for port, url in zip(ports, urls)]
        prompts = workload(a.tenants, a.questions)
        print(f"# {a.replicas} replicas ({os.path.basename(model)}), {a.tenants} tenants x {a.questions} "
              f"questions, concurrency {a.concurrency}, {a.new} new tokens, {os.cpu_count()} cores")
        print(f"{'policy':>18} | {'hit rate':>8} | {'req/s':>6} | {'out tok/s':>9}")
        try:
            for policy in ("round_robin", "cache_aware"):
                port = free_port()
                router = start(["radixlm.router", "--worker-urls", *urls, "--port", str(port), "--policy", policy,
                                "--log-level", "warning"], f"http://127.0.0.1:{port}")
                try:
                    hit, rps, tps = run(f"http://127.0.0.1:{port}", prompts, a.concurrency, a.new)
                finally:
                    stop(router)
                print(f"{'router ' + policy:>18} | {hit:>8.3f} | {rps:>6.2f} | {tps:>9.1f}")
        finally:
            for s in servers:
                stop(s)
        if a.dp_size_too:
            run_in_server_dp(model, prompts, a)


def run_in_server_dp(model: str, prompts: list[str], a: argparse.Namespace) -> None:
    """The same workload on one server with --dp-size replicas, once per --dp-load-balance."""
    for policy in ("round_robin", "cache_aware"):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start(["radixlm.launch_server", "--model-path", model, "--port", str(port), "--num-threads", "1",
                        "--dp-size", str(a.replicas), "--dp-load-balance", policy, "--log-level", "warning"], url)
        try:
            hit, rps, tps = run(url, prompts, a.concurrency, a.new)
        finally:
            stop(server)
        print(f"{'dp ' + policy:>18} | {hit:>8.3f} | {rps:>6.2f} | {tps:>9.1f}")


if __name__ == "__main__":
    main()
