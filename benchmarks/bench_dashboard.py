"""What an open /dashboard costs the scheduler (issue 20: < 1% of step time with a viewer open).

    .venv/bin/python benchmarks/bench_dashboard.py [--model-path DIR] [--reps 3]

A viewer makes the HTTP process ask for one snapshot every 0.5 s (server/dashboard/hub.py MIN_INTERVAL_S),
however many viewers there are; the scheduler builds it between two steps, on its own thread. So the cost
is (snapshots per second) x (build + msgpack-encode time), as a share of the scheduler's busy second:
  1. direct: warm the radix cache with a few-shot workload on the in-process Engine (same scheduler code),
     then time build+encode on the loop thread (median of 50), and the mean decode step time;
  2. a synthetic tree of --big-nodes nodes (the 400-node cap bounds what is sent, not the walk);
  3. end to end: decode throughput with a background "viewer" (one snapshot every 0.5 s) vs without,
     each side in its own process, alternating, medians of --reps.
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


def one_side(args) -> None:
    """Child process: decode throughput, with or without a viewer's snapshots; prints JSON."""
    from radixlm.runtime.engine import Engine

    engine = Engine(args.model_path, num_threads=args.threads)
    stop = threading.Event()
    snaps = []

    def viewer() -> None:
        while not stop.wait(VIEWER_INTERVAL_S):
            snaps.append(engine._loop.call(lambda: _timed_snapshot(_scheduler_of(engine))))

    try:
        _warm(engine, args.requests)
        _decode(engine, args.batch, 4)  # warm-up
        thread = threading.Thread(target=viewer, daemon=True)
        if args.side == "viewer":
            thread.start()
        wall, steps = _decode(engine, args.batch, args.tokens)
        stop.set()
        if args.side == "viewer":
            thread.join()
    finally:
        engine.shutdown()
    print(json.dumps({"tok_s": args.batch * args.tokens / wall, "steps": steps, "snapshots": len(snaps)}))


def end_to_end(args) -> dict:
    results: dict[str, list[float]] = {"none": [], "viewer": []}
    snapshots = []
    for _ in range(args.reps):
        for side in ("none", "viewer"):
            cmd = [sys.executable, __file__, "--side", side, "--threads", str(args.threads), "--batch",
                   str(args.batch), "--tokens", str(args.tokens), "--requests", str(args.requests)]
            if args.model_path:
                cmd += ["--model-path", args.model_path]
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            results[side].append(out["tok_s"])
            if side == "viewer":
                snapshots.append(out["snapshots"])
    none, view = statistics.median(results["none"]), statistics.median(results["viewer"])
    return {"tok_s_no_viewer": results["none"], "tok_s_viewer": results["viewer"], "snapshots_per_run": snapshots,
            "median_ratio_viewer_over_none": view / none}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--big-nodes", type=int, default=5000)
    p.add_argument("--side", choices=("none", "viewer"), default=None)
    p.add_argument("--skip-e2e", action="store_true")
    args = p.parse_args()
    if args.side:
        return one_side(args)
    print("load:", os.getloadavg())
    print("direct:", json.dumps(direct(args)))
    print("synthetic:", json.dumps(synthetic(args.big_nodes)))
    if not args.skip_e2e:
        print("end to end:", json.dumps(end_to_end(args)))
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
