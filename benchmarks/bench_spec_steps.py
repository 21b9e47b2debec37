"""Where a step's time goes, speculation on vs off: host phases per step and, on CUDA, the device's time.

    .venv/bin/python benchmarks/bench_spec_steps.py [--workloads code free json] [--batch 16] [--threads 1]

On a GPU a step's forward is launched and the host goes on (the n-gram indexing, `SpecController.observe`,
runs then); the device idles while the host samples, verifies, plans and builds the next step. This
splits each step (the real SmolLM2, greedy, bench_speculative's workloads, the best of --repeats runs)
into: plan (`Scheduler._plan`: proposals and slot reservation), build (`build_forward_batch`), launch
(`ModelRunner.forward`: on CUDA it returns once the graph is launched; on the CPU it is the forward),
observe, process (`OutputProcessor.process`, with the Sampler's calls apart: on CUDA the first one waits
for the device) and, on CUDA, the forward's device time from events around the launch; idle = step minus
device time. Each side runs in its own process (bench_speculative's rule), one after the other.
"host" is a step less the launch, the Sampler and observe (what the host does while a GPU would wait),
"host16" the same over the steps of 8+ rows only, "obs max" the longest observe of one step (on a GPU it
is hidden up to the device's step time).

--host-only replays each workload's greedy outputs (recorded by the warm-up run, with the real forward)
through a stand-in forward whose logits' argmax is the recorded next token (ReplayForward): every step's
host work runs as it does (the scheduler, the proposals, the verification), while the forward costs next
to nothing and leaves the CPU's caches warm, as a GPU's forward does (after a real CPU forward the same
host work measured several times slower). tok/s is then the host's rate alone; the table gives the host's
time per output token on and off instead of a speedup.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PHASES = ["step", "plan", "build", "launch", "observe", "process", "sampler"]


class ReplayForward:
    """Stands in for ModelRunner.forward (--host-only): fp32 logits [N, V], one-hot at the recorded greedy
    token that follows each logits position (EOS past a recorded output), so the Sampler's argmax gives
    what the model gave. The buffer is reused: only the previous step's ones are cleared."""

    def __init__(self, vocab_size: int, eos: int, device="cpu"):
        import torch

        self.outputs: dict[tuple[int, ...], list[int]] = {}  # prompt ids -> prompt + greedy output ids
        self.eos = eos
        self.device = device
        self.buf = torch.zeros(1024, vocab_size, device=device)
        self.set: tuple | None = None
        self.active = False  # the warm-up runs the real forward and records its outputs

    def record(self, prompt_ids: list[list[int]], output_ids: list[list[int]]) -> None:
        for prompt, out in zip(prompt_ids, output_ids):
            self.outputs[tuple(prompt)] = list(prompt) + list(out)

    def __call__(self, batch, logits_indices, argmax_only: bool = False):
        import torch

        starts = batch.meta.extend_start_loc_list
        tokens = []
        for index in logits_indices.tolist():
            r = bisect.bisect_right(starts, index) - 1
            row = batch.rows[r]
            seq = self.outputs[tuple(row.req.input_ids)]
            pos = row.start + index - starts[r] + 1  # the position this logits row predicts
            tokens.append(seq[pos] if pos < len(seq) else self.eos)
        if self.set is not None:
            self.buf[self.set] = 0.0
        self.set = (torch.arange(len(tokens), device=self.device),
                    torch.tensor(tokens, dtype=torch.int64).to(self.device))
        self.buf[self.set] = 1.0
        return self.buf[: len(tokens)]


def _timed(obj, attr: str, acc: dict, key: str, events: list | None = None) -> None:
    import torch

    fn = getattr(obj, attr)

    def wrapped(*args, **kwargs):
        t = time.perf_counter()
        if events is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        out = fn(*args, **kwargs)
        if events is not None:
            end.record()
            events.append((start, end))
        acc[key] += time.perf_counter() - t
        return out

    setattr(obj, attr, wrapped)


def _per_step(sched, scheduler_module, acc: dict) -> None:
    """acc["host16"]: the summed host time (step less launch, Sampler and observe) of the steps with 8+ rows,
    acc["steps16"] their count, acc["observe_max"] the longest observe of one step (wraps the already-timed
    step and build_forward_batch)."""
    step, build = sched.step, scheduler_module.build_forward_batch
    rows = [0]

    def counted_build(planned, *args, **kwargs):
        rows[0] = len(planned)
        return build(planned, *args, **kwargs)

    def counted_step():
        before = {k: acc[k] for k in ("step", "launch", "sampler", "observe")}
        rows[0] = 0
        out = step()
        d = {k: acc[k] - v for k, v in before.items()}
        acc["observe_max"] = max(acc["observe_max"], d["observe"])
        if rows[0] >= 8:
            acc["host16"] += d["step"] - d["launch"] - d["sampler"] - d["observe"]
            acc["steps16"] += 1
        return out

    sched.step, scheduler_module.build_forward_batch = counted_step, counted_build


def run_side(args) -> None:
    import torch

    import bench_speculative as B
    import radixlm.runtime.scheduler.scheduler as scheduler_module
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.sampling.sampler import Sampler

    spec_args = argparse.Namespace(k=None, min_acceptance=0.25, ngram_min_match=3, batch_cap=None, new=args.new,
                                   threads=args.threads, dtype=args.dtype)
    acc: dict = collections.defaultdict(float)
    events: list | None = None
    results = {}
    with Engine(args.model_path, **B._engine_options(spec_args), **B._spec_options(spec_args, args.side == "on")
                ) as eng:
        sched, runner = eng.scheduler, eng.runner
        cuda = runner.device.type == "cuda"
        events = [] if cuda else None
        _timed(sched, "step", acc, "step")
        _timed(sched, "_plan", acc, "plan")
        _timed(scheduler_module, "build_forward_batch", acc, "build")
        replay = ReplayForward(runner.dims.vocab_size, eng.tokenizer.eos_token_id, runner.device) if args.host_only \
            else None
        if replay is not None:
            real_forward = runner.forward
            runner.forward = lambda *a, **k: (replay if replay.active else real_forward)(*a, **k)
        _timed(runner, "forward", acc, "launch", events)
        _timed(sched.out, "process", acc, "process")
        _timed(Sampler, "__call__", acc, "sampler")
        if sched.spec is not None:
            _timed(sched.spec, "observe", acc, "observe")
        _per_step(sched, scheduler_module, acc)
        for name in args.workloads:
            prompts, params = B._prompts(eng.tokenizer, name, args.batch), B._params(spec_args, name)
            if replay is not None:  # the stand-in wrote no K/V: the tree's cached prompts are not the model's
                replay.active = False
                eng.flush_cache()
            warm = eng.generate(prompts, params)  # warm-up: graphs and kernels for these shapes
            if replay is not None:  # from here on the recorded outputs stand in for the model
                replay.record([eng.tokenizer(p)["input_ids"] for p in prompts], [r["output_ids"] for r in warm])
                replay.active = True
            best = None
            for _ in range(args.repeats):
                eng.flush_cache()
                eng.generate(prompts, {**params, "max_new_tokens": 1})
                acc.clear()
                if events is not None:
                    events.clear()
                steps0 = sched.num_forward_steps
                t = time.perf_counter()
                out = eng.generate(prompts, params)
                wall = time.perf_counter() - t
                if cuda:
                    torch.cuda.synchronize()
                n = sched.num_forward_steps - steps0
                row = {key: acc[key] / n * 1e3 for key in PHASES}
                row["device"] = sum(a.elapsed_time(b) for a, b in events) / n if cuda else None
                row["host16"] = acc["host16"] / max(1, acc["steps16"]) * 1e3
                row["observe_max"] = acc["observe_max"] * 1e3
                row.update(wall=wall, steps=n, steps16=acc["steps16"], tokens=sum(len(r["output_ids"]) for r in out),
                           same=[r["output_ids"] for r in out] == [r["output_ids"] for r in warm])
                if best is None or wall < best["wall"]:
                    best = row
            results[name] = best
    print(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--workloads", nargs="+", default=["code", "free", "json"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--host-only", action="store_true", help="replay recorded outputs through a stand-in "
                    "forward: the host's time per step alone (module docstring)")
    ap.add_argument("--side", choices=["on", "off"], help="one side's worker (internal)")
    args = ap.parse_args()
    if args.side:
        return run_side(args)
    sides = {}
    for side in ("off", "on"):
        cmd = [sys.executable, __file__, "--side", side, "--batch", str(args.batch), "--repeats", str(args.repeats),
               "--new", str(args.new), "--dtype", args.dtype, "--workloads", *args.workloads]
        cmd += ["--threads", str(args.threads)] if args.threads else []
        cmd += ["--host-only"] if args.host_only else []
        cmd += ["--model-path", args.model_path] if args.model_path else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        sides[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    _print(args, sides)


def _print(args, sides: dict) -> None:
    import torch

    from machine_info import machine_lines

    print("\n".join(machine_lines()))
    print(f"batch {args.batch}, {args.new} new tokens, best of {args.repeats}; threads={args.threads} "
          f"dtype={args.dtype} torch {torch.__version__}; ms per step"
          + ("; host only: recorded outputs replayed through a stand-in forward" if args.host_only else ""))
    head = ["workload", "side", "tok/s", "steps", "step", "device", "idle", "plan", "build", "launch", "observe",
            "process", "sampler", "host", "host16", "obs max", "same"]
    print(" ".join(f"{h:>8s}" for h in head))
    for name in args.workloads:
        for side in ("off", "on"):
            r = sides[side][name]
            dev = r["device"]
            cells = [name, side, f"{r['tokens'] / r['wall']:.0f}", str(r["steps"]), f"{r['step']:.3f}",
                     "-" if dev is None else f"{dev:.3f}", "-" if dev is None else f"{r['step'] - dev:.3f}",
                     *(f"{r[k]:.3f}" for k in ("plan", "build", "launch", "observe", "process", "sampler")),
                     f"{r['step'] - r['launch'] - r['sampler'] - r['observe']:.3f}",
                     f"{r['host16']:.3f} ({r['steps16']:.0f})", f"{r['observe_max']:.2f}", "yes" if r["same"] else "no"]
            print(" ".join(f"{c:>8s}" for c in cells))
        off, on = sides["off"][name], sides["on"][name]
        if args.host_only:  # no model ran: what the host spends per output token, not a speedup
            per = [r["steps"] * (r["step"] - r["launch"] - r["sampler"] - r["observe"]) / r["tokens"] * 1e3
                   for r in (off, on)]
            print(f"{'':8s} host us per output token: off {per[0]:.1f}, on {per[1]:.1f} ({per[1] / per[0]:.2f}x)")
        else:
            print(f"{'':8s} on/off tok/s {on['tokens'] / on['wall'] / (off['tokens'] / off['wall']):.2f}x")


if __name__ == "__main__":
    main()
