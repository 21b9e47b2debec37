"""Speculative decoding (NGRAM) on vs off on the real model: decode tok/s, acceptance, tokens per forward.

    .venv/bin/python benchmarks/bench_speculative.py [--model-path DIR] [--repeats 3] [--new 128]
    .venv/bin/python benchmarks/bench_speculative.py --live --warmup --threads 1 --repeats 12
    .venv/bin/python benchmarks/bench_speculative.py --forward-costs      # verify-row cost vs k
    .venv/bin/python benchmarks/bench_speculative.py --live --warmup --threads 1 --oracle   # the ceiling

Workloads (issue 19), greedy, chat template, at batch 1 and batch 16 (16 different variants):
  (a) json:  extract the fields of a record as JSON after one example (few-shot completion, stops at the
             end of the line; the values are copied from the record),
  (b) code:  a code edit that repeats most of a function given in the prompt (the assistant turn starts
             with the code fence, as code-edit tools prefill it: without it SmolLM2-135M answers 12 of the
             16 variants with a sentence and a new, short function that repeats little; `code-chat` is
             that variant, kept for comparison),
  (c) chat:  a multi-turn chat whose last question asks to repeat an earlier answer with a change,
  (d) free:  free text (a story), where the prompt says little about the answer: the worst case.
Each side (speculation on, off) runs in its own worker process, loaded once; with --rounds N the pair of
workers runs N times, the side that starts alternating, and the median of the per-round ratios is reported
with their range (on a shared machine load drifts between the two sides of one round). With --live both
workers stay alive (--serve) and each timed run goes to one of them in turn, a pair (off, on or on, off)
seconds apart per repeat: the drift over minutes, which --rounds only averages, cancels within each pair's
ratio, while each side keeps its own process. The "cpu ratio"
compares tokens per second of the worker process's CPU time (all its threads): with --threads 1 on an idle
machine it equals the wall-clock ratio, and on a loaded one it leaves out the time other processes held the
core (memory-bandwidth contention still counts). Per repeat the cache (and the n-gram corpus) is flushed,
the prompts are prefilled (max_new_tokens=1, so decode is what is timed), then the batch is generated; the
median over repeats is reported. Output ids of both sides are compared (greedy speculation is exact: they
must be identical).

--interleaved runs both sides in one process, toggling speculation between repeats. With --warmup each side
(each worker, or each side of the interleaved process) first runs every workload once untimed: a verify
step's token count is a new GEMM shape the first time, and oneDNN builds its kernel once per process,
which the first timed spec-on runs would otherwise pay for.

--oracle gives the on side drafts that are the target's own greedy continuation (OracleProposer: every
draft accepted, as many tokens as the controller's rules ask for): the ceiling of speculation on this
machine, which the n-gram proposer's steps and rejected tokens are measured against.

--cpu-cuts keeps, on the on side, the draft cuts that price a draft token by its compute on verify steps
that a CUDA graph pads to 1 + k tokens a row anyway (SpecController.padded_rows = 0: the rules before
session 40), for an A/B of those steps on a GPU (scripts/gpu_check.sh); on a CPU nothing changes.

--forward-costs times one forward of B rows x (1 + k) tokens (k = 0..8, B = 1, 16) against a 512-token
context: what a verify row costs on this machine relative to a plain decode row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

NAMES = ["Alice Johnson", "Bruno Diaz", "Chen Wei", "Dana Smith", "Emeka Obi", "Farah Khan", "Gustav Berg",
         "Hana Sato", "Ivan Petrov", "Julia Rossi", "Kofi Mensah", "Lena Novak", "Marco Silva", "Nina Larsen",
         "Omar Haddad", "Priya Nair"]
CITIES = ["Lisbon", "Denver", "Osaka", "Leeds", "Lagos", "Lahore", "Malmo", "Kyoto", "Kazan", "Turin",
          "Accra", "Brno", "Porto", "Bergen", "Amman", "Kochi"]


def json_prompt(i: int) -> str:
    """Few-shot extraction (a completion prompt: SmolLM2-135M does not follow the instruction reliably in
    chat form, but it follows a format): the answer copies every value from the record."""
    def record(j: int) -> str:
        name, city = NAMES[j % 16], CITIES[j % 16]
        return (f"Full name: {name}. Email: {name.split()[0].lower()}.{j}@example.com. City: {city}. "
                f"Phone: +1-555-01{j:02d}. Account: ACC-{1000 + 37 * j}.")

    def answer(j: int) -> str:
        name, city = NAMES[j % 16], CITIES[j % 16]
        return (f'{{"name": "{name}", "email": "{name.split()[0].lower()}.{j}@example.com", "city": "{city}", '
                f'"phone": "+1-555-01{j:02d}", "account": "ACC-{1000 + 37 * j}"}}')

    shot = (i + 5) % 16
    return f"Record: {record(shot)}\nJSON: {answer(shot)}\nRecord: {record(i)}\nJSON:"


CODE = '''def summarize(records, key, limit=10):
    """Return the top entries of records grouped by key."""
    counts = {}
    for record in records:
        value = record.get(key)
        if value is None:
            continue
        counts[value] = counts.get(value, 0) + 1
    ordered = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    result = []
    for value, count in ordered[:limit]:
        result.append({"value": value, "count": count})
    return result
'''


def code_prompt(i: int) -> list[dict]:
    new = ["rows", "items", "entries", "data"][i % 4] + ("" if i < 4 else str(i))
    return [{"role": "user", "content": f"Here is a Python function:\n\n```python\n{CODE}```\n\nRewrite the whole "
             f"function with the parameter `records` renamed to `{new}`. Output only the code."}]


def chat_prompt(i: int) -> list[dict]:
    city = CITIES[i % 16]
    return [{"role": "user", "content": f"Plan a one-day trip to {city}."},
            {"role": "assistant", "content": f"Morning: walk through the old town of {city} and visit the main "
             f"market. Noon: lunch at a local restaurant near the river. Afternoon: visit the city museum and "
             f"the cathedral. Evening: dinner with a view over {city} and a short walk along the harbour."},
            {"role": "user", "content": "Repeat the plan exactly, but replace the museum with a park."}]


def free_prompt(i: int) -> list[dict]:
    topic = ["a lighthouse keeper", "a lost robot", "a mountain village", "a night train"][i % 4]
    return [{"role": "user", "content": f"Write a short original story about {topic} in {CITIES[i % 16]}."}]


WORKLOADS = {"json": json_prompt, "code": code_prompt, "chat": chat_prompt, "free": free_prompt,
             "code-chat": code_prompt}
ASSISTANT_PREFIX = {"code": "```python\n"}  # the start of the assistant's answer, after the chat template


def run_worker(args) -> None:
    """One side, every workload and batch in turn (--rounds: one process per side and round)."""
    from radixlm.runtime.engine import Engine

    results = {}
    with Engine(args.model_path, **_engine_options(args), **_spec_options(args, args.side == "on")) as eng:
        _prepare(eng, args)
        for name in args.workloads:
            for batch in args.batches:
                prompts, params = _prompts(eng.tokenizer, name, batch), _params(args, name)
                if args.warmup:  # untimed, as --interleaved --warmup: this workload's new GEMM shapes built once
                    eng.flush_cache()
                    eng.generate(prompts, params)
                runs = [_timed_run(eng, prompts, params) for _ in range(args.repeats)]
                results[f"{name}/b{batch}"] = _summary(runs, batch)
    print(json.dumps(results))


def serve_worker(args) -> None:
    """One side kept alive for --live: loads once (and warms every workload up with --warmup), then answers
    each line "name batch" on stdin with one timed run's result as a JSON line."""
    from radixlm.runtime.engine import Engine

    with Engine(args.model_path, **_engine_options(args), **_spec_options(args, args.side == "on")) as eng:
        _prepare(eng, args)
        if args.warmup:
            for name in args.workloads:
                for batch in args.batches:
                    eng.flush_cache()
                    eng.generate(_prompts(eng.tokenizer, name, batch), _params(args, name))
        print("ready", flush=True)
        for line in sys.stdin:
            name, batch = line.split()
            run = _timed_run(eng, _prompts(eng.tokenizer, name, int(batch)), _params(args, name))
            print(json.dumps(_summary([run], int(batch))), flush=True)


class OracleProposer:
    """--oracle: drafts that are the target's own greedy continuation (what the request will produce, from an
    untimed spec-off run of the same prompts), as many tokens as the controller's rules ask for. The on side
    then shows what speculation can give on this machine with every draft accepted: the ceiling the n-gram
    proposer is measured against (its steps and rejected tokens are what separate the two)."""

    cheap = True

    def __init__(self, truth: dict[tuple[int, ...], list[int]]):
        self.truth = truth

    def propose(self, reqs, ks, copying, large_batch=False):
        out = []
        for req, k in zip(reqs, ks):
            done = len(req.output_ids)
            tokens = self.truth.get(tuple(req.input_ids), [])[done: done + k]
            out.append((list(tokens), len(req.input_ids) + done, None, len(tokens)))  # a match longer than any rule asks
        return out

    def observe(self, reqs) -> None: ...

    def on_verified(self, req, proposed: int, accepted: int) -> None: ...

    def on_finish(self, req) -> None: ...

    def flush(self) -> None: ...

    def check_integrity(self, idle: bool) -> None: ...


def _prepare(eng, args) -> None:
    """A worker's engine as its side runs: --oracle's proposer on the on side, --cpu-cuts."""
    if args.oracle and args.side == "on":
        _install_oracle(eng, args)
    if args.cpu_cuts and eng.scheduler.spec is not None:
        eng.scheduler.spec.padded_rows = 0


def _install_oracle(eng, args) -> None:
    """Replace the on side's proposer with an OracleProposer knowing every workload's greedy outputs."""
    from radixlm.runtime.generate_input import prepare_generate

    sched = eng.scheduler
    spec, sched.spec = sched.spec, None
    truth = {}
    for name in args.workloads:
        for batch in args.batches:
            prompts, params = _prompts(eng.tokenizer, name, batch), _params(args, name)
            ids = [p.msg.input_ids for p in prepare_generate(eng.tokenizer, eng.limits, text=prompts)[0]]
            for prompt_ids, out in zip(ids, eng.generate(input_ids=ids, sampling_params=params)):
                truth[tuple(prompt_ids)] = out["output_ids"]
    sched.spec = spec
    spec.proposer = OracleProposer(truth)


def _engine_options(args) -> dict:
    """What both sides share: threads (CPU) and dtype (auto: fp32 on CPU, bf16 on CUDA)."""
    return {"num_threads": args.threads, "dtype": args.dtype}


def _spec_options(args, on: bool) -> dict:
    if not on:
        return {}
    return {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": args.k,
            "speculative_min_acceptance": args.min_acceptance,
            "speculative_ngram_min_match": args.ngram_min_match,
            "speculative_max_batch_draft_tokens": args.batch_cap}


def _params(args, name: str) -> dict:
    return {"max_new_tokens": args.new, "temperature": 0, **({"stop": ["\n"]} if name == "json" else {})}


def _timed_run(eng, prompts: list[str], params: dict) -> dict:
    """Flush the cache (and the n-gram corpus), prefill the prompts (max_new_tokens=1), then time the batch:
    wall clock, this process's CPU time, forward steps and speculation counters of the decode alone."""
    eng.flush_cache()
    eng.generate(prompts, {"max_new_tokens": 1, "temperature": 0})
    steps0, s0 = eng.scheduler.num_forward_steps, _spec_totals(eng)
    t, c = time.perf_counter(), time.process_time()
    out = eng.generate(prompts, params)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    s1 = _spec_totals(eng)
    return {"wall": wall, "cpu": cpu, "steps": eng.scheduler.num_forward_steps - steps0,
            "proposed": s1[0] - s0[0], "accepted": s1[1] - s0[1], "output_ids": [r["output_ids"] for r in out]}


def _summary(runs: list[dict], batch: int) -> dict:
    """Medians over repeats (the counters and outputs of the last: greedy runs repeat them)."""
    last = runs[-1]
    tokens = sum(len(ids) for ids in last["output_ids"])
    proposed, accepted = last["proposed"], last["accepted"]
    return {"tok_s": tokens / statistics.median(r["wall"] for r in runs), "tokens": tokens, "steps": last["steps"],
            "tok_cpu_s": tokens / statistics.median(r["cpu"] for r in runs),
            "tokens_per_forward": tokens / max(1, last["steps"]) / batch,
            "acceptance": accepted / proposed if proposed else None, "proposed": proposed,
            "output_ids": last["output_ids"]}


def interleaved(args) -> None:
    """One process, speculation toggled between repeats (off, on, on, off, ...): on a machine whose load
    drifts, each ratio compares runs seconds apart instead of processes minutes apart."""
    from radixlm.runtime.engine import Engine

    spec = _spec_options(args, on=True)
    print(f"load {os.getloadavg()[0]:.1f}  threads={args.threads}  dtype={args.dtype}  k={args.k}  new={args.new}"
          f"  pairs={args.repeats}  warmup={args.warmup}")
    print(f"{'workload':10s} {'ratio':>6s} {'range':>11s} {'cpu ratio':>9s} {'accept':>7s} {'tok/fwd':>8s} same")
    with Engine(args.model_path, **_engine_options(args), **spec) as eng:
        sched, ctl = eng.scheduler, eng.scheduler.spec

        def toggle(on: bool) -> None:
            sched.spec = ctl if on else None
        for name in args.workloads:
            for batch in args.batches:
                prompts = _prompts(eng.tokenizer, name, batch)
                params = _params(args, name)
                runs = {False: [], True: []}
                # --warmup: one untimed run of each side first. A verify step's token count is a new GEMM
                # shape the first time it occurs, and oneDNN builds (JITs) a kernel for each new shape once
                # per process (16 rows + 21 draft tokens: 116 ms the first time, 79-83 ms after); without it
                # the first pair's spec-on run pays for every shape its steps meet (json at batch 16: 3.6 s
                # vs 2.6-2.7 s warm), which a serving process pays once.
                for on in (True, False) if args.warmup else ():
                    eng._loop.call(lambda: toggle(on))
                    eng.flush_cache()
                    eng.generate(prompts, params)
                for i in range(args.repeats):
                    for on in ((False, True) if i % 2 == 0 else (True, False)):
                        eng._loop.call(lambda: toggle(on))
                        eng.flush_cache()
                        eng.generate(prompts, {"max_new_tokens": 1, "temperature": 0})
                        steps0, s0 = sched.num_forward_steps, _spec_totals(eng)
                        t, c = time.perf_counter(), time.process_time()
                        out = eng.generate(prompts, params)
                        runs[on].append((time.perf_counter() - t, time.process_time() - c, out,
                                         sched.num_forward_steps - steps0, _spec_totals(eng), s0))
                eng._loop.call(lambda: toggle(True))
                ratios = [a[0] / b[0] for a, b in zip(runs[False], runs[True])]
                cpu = [a[1] / b[1] for a, b in zip(runs[False], runs[True])]
                _, _, out, steps, s1, s0 = runs[True][0]
                proposed, accepted = s1[0] - s0[0], s1[1] - s0[1]
                acc = f"{100 * accepted / proposed:.0f}%" if proposed else "-"
                tokens = sum(len(r["output_ids"]) for r in out)
                same = all([r["output_ids"] for r in a[2]] == [r["output_ids"] for r in b[2]]
                           for a, b in zip(runs[False], runs[True]))
                print(f"{name + '/b' + str(batch):10s} {statistics.median(ratios):6.2f} "
                      f"{min(ratios):5.2f}-{max(ratios):4.2f} {statistics.median(cpu):9.2f} {acc:>7s} "
                      f"{tokens / max(1, steps) / batch:8.2f} {same}", flush=True)
    print(f"load {os.getloadavg()[0]:.1f}")


def live(args) -> None:
    """Both sides alive at once, each in its own worker process (--serve), loaded and warmed up once; every
    pair of timed runs (one a side, the side that starts alternating) runs back to back, seconds apart, so
    the load's and the machine's drift over minutes cancels in each pair's ratio, as in --interleaved, while
    the two sides keep their own processes (their own OpenMP pools and heaps). One pair per --repeats."""
    workers = {side: _start_worker(args, side) for side in ("off", "on")}
    try:
        for proc in workers.values():  # both loaded and warmed up before anything is timed
            _expect_ready(proc)
        print(f"load {os.getloadavg()[0]:.1f}  threads={args.threads}  dtype={args.dtype}  k={args.k}  new={args.new}"
              f"  pairs={args.repeats}  warmup={args.warmup}  min_match={args.ngram_min_match}"
              f"  batch_cap={args.batch_cap}  cpu_cuts={args.cpu_cuts}  (live workers)")
        print(f"{'workload':10s} {'off tok/s':>10s} {'on tok/s':>10s} {'ratio':>6s} {'range':>11s} {'cpu ratio':>9s} "
              f"{'range':>11s} {'accept':>7s} {'tok/fwd':>8s} same", flush=True)
        for name in args.workloads:
            for batch in args.batches:
                runs = {"off": [], "on": []}
                for i in range(args.repeats):
                    for side in (("off", "on") if i % 2 == 0 else ("on", "off")):
                        runs[side].append(_ask(workers[side], name, batch)[f"{name}/b{batch}"])
                _print_row(f"{name}/b{batch}", runs["off"], runs["on"])
        print(f"load {os.getloadavg()[0]:.1f}")
    finally:
        for proc in workers.values():
            try:
                proc.stdin.close()
            except OSError:  # a worker that died (its error is already reported)
                pass
            proc.wait()


def _start_worker(args, side: str) -> subprocess.Popen:
    return subprocess.Popen(_worker_cmd(args, side, "--serve"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=os.environ)


def _expect_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    if line.strip() != "ready":
        sys.exit(f"a worker did not start (exit {proc.wait()}): {line[-2000:]}")


def _ask(proc: subprocess.Popen, name: str, batch: int) -> dict:
    proc.stdin.write(f"{name} {batch}\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        sys.exit(f"a worker died (exit {proc.wait()})")
    return {f"{name}/b{batch}": json.loads(line)}


def _print_row(key: str, off: list[dict], on: list[dict]) -> None:
    """Per pair (or round) ratios of on vs off: median and range, by wall clock and by CPU time."""
    ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(off, on)]
    cpu = [b["tok_cpu_s"] / a["tok_cpu_s"] for a, b in zip(off, on)]
    acc = "-" if on[0]["acceptance"] is None else f"{100 * on[0]['acceptance']:.0f}%"
    same = all(a["output_ids"] == b["output_ids"] for a, b in zip(off, on))
    print(f"{key:10s} {statistics.median(a['tok_s'] for a in off):10.1f} "
          f"{statistics.median(b['tok_s'] for b in on):10.1f} {statistics.median(ratios):6.2f} "
          f"{min(ratios):5.2f}-{max(ratios):4.2f} {statistics.median(cpu):9.2f} {min(cpu):5.2f}-{max(cpu):4.2f} "
          f"{acc:>7s} {on[0]['tokens_per_forward']:8.2f} {same}", flush=True)


def _prompts(tok, name: str, batch: int) -> list[str]:
    make = WORKLOADS[name]
    return [make(i) if name == "json" else
            tok.apply_chat_template(make(i), tokenize=False, add_generation_prompt=True)
            + ASSISTANT_PREFIX.get(name, "") for i in range(batch)]


def _spec_totals(eng) -> tuple[int, int]:
    spec = eng.scheduler.spec
    return (spec.stats.num_proposed, spec.stats.num_accepted) if spec is not None else (0, 0)


def forward_costs(args) -> None:
    """One forward of B rows x (1 + k) new tokens after a 512-token context, median of 7 (CPU time)."""
    import torch

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.forward import PlannedRow
    from radixlm.runtime.scheduler.batch import build_forward_batch
    from radixlm.runtime.scheduler.request import Req
    from radixlm.sampling_params import SamplingParams

    with Engine(args.model_path, **_engine_options(args)) as eng:
        sched = eng.scheduler
        runner, kv = sched.runner, sched.kv
        ctx = 512

        def run():
            print("batch  k  tokens  cpu ms/forward  vs k=0", flush=True)
            for batch in (1, 16):
                base = None
                for k in range(9):
                    reqs = [Req(rid=f"r{i}", input_ids=[1] * (ctx + k + 1), params=SamplingParams())
                            for i in range(batch)]
                    for r in reqs:
                        assert kv.admit(r, 0) and kv.extend(r, ctx + k + 1)
                    rows = [PlannedRow(r, ctx, k + 1) for r in reqs]
                    fb = build_forward_batch(rows, kv.table, runner.sm_scale, runner.device)
                    idx = torch.arange(fb.num_tokens)
                    times = []
                    for _ in range(7):  # process CPU time: the other processes' share of a loaded core left out
                        t = time.process_time()
                        runner.forward(fb, idx)
                        times.append(time.process_time() - t)
                    ms = 1000 * statistics.median(times)
                    base = base or ms
                    print(f"{batch:5d} {k:2d} {fb.num_tokens:7d} {ms:11.1f}  {ms / base:6.2f}x", flush=True)
                    for r in reqs:
                        kv.allocator.free(kv.row_slots(r).clone())
                        kv.table.free(r.row)
                        kv.tree.dec_lock_ref(r.last_node) if r.last_node is not None and kv.tree else None
        eng._loop.call(run)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--k", type=int, default=None, help="speculative_num_draft_tokens (default: the engine's)")
    ap.add_argument("--threads", type=int, default=None, help="num_threads of both sides (default: the engine's)")
    ap.add_argument("--dtype", default="auto", help="model dtype of both sides (auto: fp32 on CPU, bf16 on CUDA)")
    ap.add_argument("--workloads", nargs="+", default=["json", "code", "chat", "free"], choices=list(WORKLOADS))
    ap.add_argument("--min-acceptance", type=float, default=0.25, help="speculative_min_acceptance (0: never pause)")
    ap.add_argument("--ngram-min-match", type=int, default=3, help="speculative_ngram_min_match")
    ap.add_argument("--batch-cap", type=int, default=None, help="speculative_max_batch_draft_tokens")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=1, help="off/on worker pairs, alternating (median ratio of rounds)")
    ap.add_argument("--worker", dest="side", choices=["on", "off"])
    ap.add_argument("--serve", dest="serve_side", choices=["on", "off"], help="a --live worker (internal)")
    ap.add_argument("--live", action="store_true",
                    help="both sides' workers alive at once, timed runs alternating between them in pairs "
                         "(pairs = --repeats)")
    ap.add_argument("--oracle", action="store_true",
                    help="the on side drafts the true greedy continuation (every draft accepted): the ceiling")
    ap.add_argument("--cpu-cuts", action="store_true",
                    help="the on side cuts drafts by their compute on padded verify graphs too (module docstring)")
    ap.add_argument("--forward-costs", action="store_true")
    ap.add_argument("--interleaved", action="store_true",
                    help="one process toggling speculation between repeats (pairs = --repeats)")
    ap.add_argument("--warmup", action="store_true",
                    help="one untimed run of each workload and side before the timed ones (new GEMM shapes "
                         "built once, as in a serving process)")
    args = ap.parse_args()
    if args.oracle and (args.interleaved or args.forward_costs):
        ap.error("--oracle is for the worker modes (the default, --rounds, --live)")
    if args.forward_costs:
        return forward_costs(args)
    if args.serve_side:
        args.side = args.serve_side
        return serve_worker(args)
    if args.side:
        return run_worker(args)
    from machine_info import machine_lines

    print("\n".join(machine_lines()), flush=True)
    if args.interleaved:
        return interleaved(args)
    if args.live:
        return live(args)
    loads = [os.getloadavg()[0]]
    rounds = []  # per round: {side: results}; which side runs first alternates, so drift hits both alike
    for i in range(args.rounds):  # off first in even rounds, on first in odd ones
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        rounds.append({side: _run_side(args, side) for side in order})
        loads.append(os.getloadavg()[0])
    print(f"load (1-min, per round): {' '.join(f'{x:.1f}' for x in loads)}  threads={args.threads}  k={args.k}  "
          f"new={args.new}  repeats={args.repeats}  rounds={args.rounds}  min_match={args.ngram_min_match}  "
          f"batch_cap={args.batch_cap}  cpu_cuts={args.cpu_cuts}")
    print(f"{'workload':10s} {'off tok/s':>10s} {'on tok/s':>10s} {'ratio':>6s} {'range':>11s} {'cpu ratio':>9s} "
          f"{'range':>11s} {'accept':>7s} {'tok/fwd':>8s} same")
    for key in rounds[0]["off"]:
        _print_row(key, [r["off"][key] for r in rounds], [r["on"][key] for r in rounds])


def _worker_cmd(args, side: str, mode: str = "--worker") -> list[str]:
    cmd = [sys.executable, __file__, mode, side, "--repeats", str(args.repeats), "--new", str(args.new),
           *(["--k", str(args.k)] if args.k else []), "--batches", *map(str, args.batches),
           "--workloads", *args.workloads, *(["--warmup"] if args.warmup else []),
           *(["--oracle"] if args.oracle else []), *(["--cpu-cuts"] if args.cpu_cuts else []),
           "--min-acceptance", str(args.min_acceptance), "--ngram-min-match", str(args.ngram_min_match)]
    if args.batch_cap:
        cmd += ["--batch-cap", str(args.batch_cap)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    cmd += ["--dtype", args.dtype]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    return cmd


def _run_side(args, side: str) -> dict:
    proc = subprocess.run(_worker_cmd(args, side), capture_output=True, text=True, env=os.environ)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
