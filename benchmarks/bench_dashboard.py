"""What an open /dashboard costs the scheduler (issue 20: < 1% of step time with a viewer open).

    .venv/bin/python benchmarks/bench_dashboard.py [--model-path DIR] [--reps 3]

A viewer makes the HTTP process ask for one snapshot every 0.5 s (server/dashboard/hub.py MIN_INTERVAL_S),
however many viewers there are; the scheduler builds it between two steps, on its own thread. So the cost
is (snapshots per second) x (build + msgpack-encode time), as a share of the scheduler's busy second:
  1. direct: warm the radix cache with a few-shot workload on the in-process Engine (same scheduler code),
     then time build+encode on the loop thread (median of 50), and the mean decode step time;
  2. a synthetic tree of --big-nodes nodes (the 400-node cap bounds what is sent, not the walk);
  3. end to end: decode throughput of a real server with a viewer reading /dashboard/events vs without,
     each side a server of its own, alternating (ABBA), medians of --reps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import msgspec

from radixlm.runtime.messages import ControlResp, encode
from radixlm.runtime.scheduler.dashboard import build_snapshot

FEW_SHOT = "".join(f"Q: What is {a} plus {b}? A: {a + b}\n" for a in range(12) for b in range(3))
VIEWER_INTERVAL_S = 0.5


def _timed_snapshot(scheduler) -> float:
    t = time.perf_counter()
    encode(ControlResp("x", True, build_snapshot(scheduler)))
    return time.perf_counter() - t


def _warm(engine, n: int) -> None:
    prompts = [FEW_SHOT + f"Q: What is {i} times {i + 1}? A:" for i in range(n)]
    engine.generate(prompts, {"max_new_tokens": 8, "temperature": 0})


def _decode(engine, batch: int, tokens: int) -> tuple[float, int]:
    """Wall seconds and forward steps of one decode-heavy batch."""
    steps = engine.get_server_info()["num_forward_steps"]
    t = time.perf_counter()
    engine.generate([f"Story number {i}:" for i in range(batch)],
                    {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True})
    return time.perf_counter() - t, engine.get_server_info()["num_forward_steps"] - steps


def direct(args) -> dict:
    from radixlm.runtime.engine import Engine

    engine = Engine(args.model_path, num_threads=args.threads)
    try:
        _warm(engine, args.requests)
        loop_call = engine._loop.call
        tree_nodes = loop_call(lambda: _scheduler_of(engine).kv.tree and
                               build_snapshot(_scheduler_of(engine))["tree"]["num_nodes"])
        times = [loop_call(lambda: _timed_snapshot(_scheduler_of(engine))) for _ in range(50)]
        wall, steps = _decode(engine, args.batch, args.tokens)
    finally:
        engine.shutdown()
    build = statistics.median(times)
    step = wall / max(1, steps)
    return {"tree_nodes": tree_nodes, "snapshot_ms_median": 1000 * build, "snapshot_ms_max": 1000 * max(times),
            "decode_step_ms_mean": 1000 * step, "share_of_busy_time_pct": 100 * build / VIEWER_INTERVAL_S}


def _scheduler_of(engine):
    return engine._loop.scheduler


def synthetic(n_nodes: int) -> dict:
    from types import SimpleNamespace

    import torch

    from radixlm.radix_cache import RadixCache

    tree = RadixCache(lambda s: None)
    g = torch.Generator().manual_seed(0)
    slot = 1
    for i in range(n_nodes // 2):  # each insert adds ~2 nodes (a split and a leaf)
        ids = torch.randint(0, 50, (int(torch.randint(4, 60, (1,), generator=g)),), generator=g).tolist()
        tree.insert("", ids, torch.arange(slot, slot + len(ids)))
        slot += len(ids)
    sched = SimpleNamespace(
        kv=SimpleNamespace(tree=tree, allocator=SimpleNamespace(size=slot, num_free=lambda: 0)),
        grammar=SimpleNamespace(_pending=[]), waiting=[], running=[], num_forward_steps=0, num_computed_tokens=0,
        stats=SimpleNamespace(to_dict=lambda: {"num_retractions": 0}))
    times = [_timed_snapshot(sched) for _ in range(20)]
    return {"tree_nodes": build_snapshot(sched)["tree"]["num_nodes"],
            "snapshot_ms_median": 1000 * statistics.median(times),
            "share_of_busy_time_pct": 100 * statistics.median(times) / VIEWER_INTERVAL_S}


def one_side(args) -> dict:
    """A server of its own (the real processes), a warm cache, then decode throughput over HTTP, with or
    without a browser-like viewer reading /dashboard/events."""
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "radixlm.launch_server", "--port", str(port), "--log-level", "warning",
           "--num-threads", str(args.threads)]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    stop, events = threading.Event(), []
    try:
        for line in server.stdout:
            if line.startswith("radixlm: ready"):
                break
        client = httpx.Client(base_url=url, timeout=600)
        client.post("/generate", json={"text": [FEW_SHOT + f"Q: What is {i} times {i + 1}? A:"
                                                for i in range(args.requests)],
                                       "sampling_params": {"max_new_tokens": 8, "temperature": 0}})

        def viewer() -> None:
            with httpx.stream("GET", url + "/dashboard/events", timeout=600) as res:
                for line in res.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:])["build_ms"])
                    if stop.is_set():
                        return

        thread = threading.Thread(target=viewer, daemon=True)
        if args.side == "viewer":
            thread.start()
            while not events:
                time.sleep(0.05)
        steps = client.get("/server_info").json()["num_forward_steps"]
        t = time.perf_counter()
        client.post("/generate", json={"text": [f"Story number {i}:" for i in range(args.batch)],
                                       "sampling_params": {"max_new_tokens": args.tokens, "temperature": 0,
                                                           "ignore_eos": True}})
        wall = time.perf_counter() - t
        steps = client.get("/server_info").json()["num_forward_steps"] - steps
        stop.set()
    finally:
        server.terminate()
        server.wait(60)
    return {"tok_s": args.batch * args.tokens / wall, "step_ms": 1000 * wall / max(1, steps),
            "events": len(events), "build_ms_max": max(events, default=0.0)}


def end_to_end(args) -> dict:
    """Each side a server of its own, in the order none, viewer, viewer, none, ... (ABBA: drifting machine
    load hits both sides alike); medians."""
    results: dict[str, list[dict]] = {"none": [], "viewer": []}
    for rep in range(args.reps):
        for side in (("none", "viewer") if rep % 2 == 0 else ("viewer", "none")):
            results[side].append(one_side(argparse.Namespace(**{**vars(args), "side": side})))
    med = {side: statistics.median(r["tok_s"] for r in runs) for side, runs in results.items()}
    return {**{side: runs for side, runs in results.items()},
            "median_ratio_viewer_over_none": med["viewer"] / med["none"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--big-nodes", type=int, default=5000)
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--skip-direct", action="store_true")
    args = p.parse_args()
    print("load:", os.getloadavg())
    if not args.skip_direct:
        print("direct:", json.dumps(direct(args)))
        print("synthetic:", json.dumps(synthetic(args.big_nodes)))
    if not args.skip_e2e:
        print("end to end:", json.dumps(end_to_end(args)))
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
