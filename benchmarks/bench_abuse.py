"""Plain-request latency beside each abusive request: the p99 of a stream of plain requests alone, then with
one abuser at a time sending its request in a loop; target: within 1.5x of the p99 alone.

    .venv/bin/python benchmarks/bench_abuse.py [--model-path DIR [--context-length 4096]] [--seconds 20]

One server (SmolLM2-135M-Instruct when --model-path is not given, or any model dir: the tiny random model
works too) serves both phases. The abusers are the grammar cases of docs/robustness.md: a backtracking
`pattern` in json_schema and in a tool's parameters (the finished-output check), exponential schemas in
tools and structural_tag (schema lowering), a ~1 MB schema with a fresh title each time (validator build),
and grammars llguidance cannot run (refused at compile); a control sends the first abuser's request with a
benign pattern (the same 40-token output: what the abuser's own decoding costs the others). Timings depend
on the machine's load: run it on an otherwise idle machine (the script prints the load average it started
with).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable

import httpx

PLAIN = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


def _hostile() -> dict[str, Any]:
    """A fresh title each time: every request is a new schema (nothing is answered from a cache)."""
    return {"title": uuid.uuid4().hex, "type": "string", "pattern": "^(a|a)*(?<!a)$", "minLength": 40,
            "maxLength": 40}


def _exponential(n: int = 16) -> dict[str, Any]:
    branches = [{"anyOf": [{"properties": {f"p{i}": {"type": "integer"}}},
                           {"properties": {f"q{i}": {"type": "string"}}}]} for i in range(n)]
    return {"title": uuid.uuid4().hex, "type": "object", "allOf": branches}


def _big_schema() -> str:
    defs = {f"d{i}": {"type": "object", "properties": {f"k{j}": {"type": "string", "maxLength": j} for j in range(12)}}
            for i in range(1800)}
    return json.dumps({"title": uuid.uuid4().hex, "definitions": defs, "type": "boolean"})


def _wide_ebnf() -> str:
    """20k alternatives (past llguidance's row limit), a fresh first one each time."""
    return f'root ::= "{uuid.uuid4().hex}" | ' + " | ".join(f'"w{i}"' for i in range(20000))


def _tool(params: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": params}}


def abusers() -> dict[str, tuple[str, Callable[[], dict[str, Any]]]]:
    """name -> (route, body factory)."""
    ask = [{"role": "user", "content": "call f"}]
    return {
        "control: same output, benign": ("/generate", lambda: {"text": "a", "sampling_params": {  # decode work only
            "max_new_tokens": 64, "temperature": 0, "json_schema": json.dumps({**_hostile(), "pattern": "^a*$"})}}),
        "pattern in json_schema": ("/generate", lambda: {"text": "a", "sampling_params": {
            "max_new_tokens": 64, "temperature": 0, "json_schema": json.dumps(_hostile())}}),
        "pattern in tool args": ("/v1/chat/completions", lambda: {
            "messages": ask, "max_tokens": 100, "temperature": 0, "tool_choice": "required",
            "tools": [_tool({"type": "object", "properties": {"s": _hostile()}, "required": ["s"]})]}),
        "exponential tool schema": ("/v1/chat/completions", lambda: {
            "messages": ask, "max_tokens": 8, "tool_choice": "required", "tools": [_tool(_exponential())]}),
        "exponential structural_tag": ("/generate", lambda: {"text": "x", "sampling_params": {
            "max_new_tokens": 8, "structural_tag": {"type": "structural_tag", "triggers": ["<f>"], "structures": [
                {"begin": "<f>", "schema": _exponential(), "end": "</f>"}]}}}),
        "1 MB schema, fresh title": ("/generate", lambda: {"text": "x", "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "json_schema": _big_schema()}}),
        "ebnf 20k alternatives": ("/generate", lambda: {"text": "x", "sampling_params": {
            "max_new_tokens": 8, "ebnf": _wide_ebnf()}}),
    }


def _plain_stream(url: str, seconds: float, concurrency: int) -> list[float]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=600) as c:
            while time.monotonic() < deadline:
                t = time.perf_counter()
                c.post("/generate", json=PLAIN).raise_for_status()
                latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def _abuse_loop(url: str, route: str, body: Callable[[], dict[str, Any]], stop: threading.Event,
                statuses: list[int]) -> None:
    with httpx.Client(base_url=url, timeout=600) as c:
        while not stop.is_set():
            statuses.append(c.post(route, json=body()).status_code)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def _start_server(model_path: str | None, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "radixlm.launch_server", "--port", str(port), "--log-level", "warning",
           "--num-threads", str(threads)]
    if model_path:
        cmd += ["--model-path", model_path]
    server = subprocess.Popen(cmd + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    for line in server.stdout:
        if line.startswith("radixlm: ready"):
            return server, f"http://127.0.0.1:{port}"
    raise RuntimeError("the server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--seconds", type=float, default=20.0, help="per phase")
    ap.add_argument("--concurrency", type=int, default=2, help="plain requests in flight")
    ap.add_argument("--threads", type=int, default=1, help="the scheduler's torch threads")
    ap.add_argument("--only", default=None, help="run only the abusers whose name contains this")
    ap.add_argument("--context-length", default=None, help="e.g. 4096 for the tiny random model (512 by default)")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    extra = ["--context-length", args.context_length] if args.context_length else []
    server, url = _start_server(args.model_path, args.threads, extra)
    try:
        _plain_stream(url, 3.0, 1)  # warm-up
        alone = p99(_plain_stream(url, args.seconds, args.concurrency))
        print(f"{'abuser':<30} {'plain p99 (ms)':>15} {'ratio':>7}  abuser statuses")
        print(f"{'(none)':<30} {1000 * alone:>15.1f} {1.0:>7.2f}")
        for name, (route, body) in abusers().items():
            if args.only and args.only not in name:
                continue
            stop, statuses = threading.Event(), []
            thread = threading.Thread(target=_abuse_loop, args=(url, route, body, stop, statuses), daemon=True)
            thread.start()
            with_abuser = p99(_plain_stream(url, args.seconds, args.concurrency))
            stop.set()
            thread.join(600)
            counts = {s: statuses.count(s) for s in sorted(set(statuses))}
            print(f"{name:<30} {1000 * with_abuser:>15.1f} {with_abuser / alone:>7.2f}  {counts}")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
