"""Replay bench_speculative's workloads through the real SpecController offline: tokens per forward and an
estimated speedup from a measured forward-cost table, in seconds instead of minutes per variant.

    .venv/bin/python benchmarks/replay_speculative.py --record       # greedy outputs + cost table (once)
    .venv/bin/python benchmarks/replay_speculative.py [--k 4] [--batches 1 16] [--workloads code free]

--record runs the engine once with speculation off (--threads 1): each workload's 16 prompts' greedy outputs
(what verification would accept: a draft's longest prefix equal to the recorded continuation), and the
CPU time of one forward of B rows x t tokens after a 256-token context (B = 1..16, t = 1..9). The replay
then runs the batch step by step as the scheduler does (every request proposes through the controller,
accepts its draft's matching prefix plus one token, finishes at max_new_tokens or EOS), and prices each
step by the table (bilinear in rows and tokens per row); "speedup" is the plain-decode cost of the same
outputs over the speculative one. The table is this machine's; the tokens per forward are exact (the
bench's tok/fwd column, up to the first token, which the bench's prefill step produces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speculative import ASSISTANT_PREFIX, WORKLOADS  # noqa: E402

CACHE = Path(os.environ.get("RADIXLM_REPLAY_CACHE", Path.home() / ".cache" / "radixlm" / "spec_replay.json"))
GRID_ROWS = (1, 2, 4, 8, 12, 16)
GRID_TOKENS = (1, 2, 3, 4, 5, 7, 9)


def _prompts(tok, name: str, n: int) -> list[list[int]]:
    make = WORKLOADS[name]
    texts = [make(i) if name == "json" else tok.apply_chat_template(make(i), tokenize=False, add_generation_prompt=True)
             + ASSISTANT_PREFIX.get(name, "") for i in range(n)]
    return [tok(t)["input_ids"] for t in texts]


def record(args) -> None:
    import torch

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.forward import PlannedRow
    from radixlm.runtime.scheduler.batch import build_forward_batch
    from radixlm.runtime.scheduler.request import Req
    from radixlm.sampling_params import SamplingParams

    data = {"new": args.new, "workloads": {}, "costs": {}}
    with Engine(args.model_path, num_threads=1) as eng:
        for name in args.workloads:
            ids = _prompts(eng.tokenizer, name, 16)
            params = {"max_new_tokens": args.new, "temperature": 0, **({"stop": ["\n"]} if name == "json" else {})}
            out = eng.generate(input_ids=ids, sampling_params=params)
            data["workloads"][name] = [{"input_ids": i, "output_ids": o["output_ids"]} for i, o in zip(ids, out)]
        sched = eng.scheduler
        runner, kv = sched.runner, sched.kv
        ctx = 256

        def costs():
            for batch in GRID_ROWS:
                for t in GRID_TOKENS:
                    reqs = [Req(rid=f"r{i}", input_ids=[1] * (ctx + t), params=SamplingParams()) for i in range(batch)]
                    for r in reqs:
                        assert kv.admit(r, 0) and kv.extend(r, ctx + t)
                    fb = build_forward_batch([PlannedRow(r, ctx, t) for r in reqs], kv.table, runner.sm_scale,
                                             runner.device)
                    idx = torch.arange(fb.num_tokens)
                    times = []
                    for _ in range(7):
                        c = time.process_time()
                        runner.forward(fb, idx)
                        times.append(time.process_time() - c)
                    data["costs"][f"{batch},{t}"] = 1000 * statistics.median(times)
                    for r in reqs:
                        kv.allocator.free(kv.row_slots(r).clone())
                        kv.table.free(r.row)
        eng._loop.call(costs)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(data))
    print(f"wrote {CACHE}")
    for batch in GRID_ROWS:
        print(batch, " ".join(f"{data['costs'][f'{batch},{t}']:7.1f}" for t in GRID_TOKENS))


class CostTable:
    """ms of one forward with `rows` rows and `tokens` tokens in all (bilinear in rows, tokens per row)."""

    def __init__(self, costs: dict[str, float]):
        self.c = {tuple(map(int, k.split(","))): v for k, v in costs.items()}

    def __call__(self, rows: int, tokens: int) -> float:
        per = min(max(tokens / rows, 1.0), GRID_TOKENS[-1])
        r0 = max(b for b in GRID_ROWS if b <= rows)
        r1 = min((b for b in GRID_ROWS if b >= rows), default=GRID_ROWS[-1])
        t0 = max(t for t in GRID_TOKENS if t <= per)
        t1 = min(t for t in GRID_TOKENS if t >= per)

        def at(b):
            lo, hi = self.c[(b, t0)], self.c[(b, t1)]
            return lo if t1 == t0 else lo + (hi - lo) * (per - t0) / (t1 - t0)
        if r0 == r1:
            return at(r0)
        return at(r0) + (at(r1) - at(r0)) * (rows - r0) / (r1 - r0)


def replay(args, data, tok, name: str, batch: int, cost: CostTable) -> dict:
    from dataclasses import replace

    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.messages import FinishReason
    from radixlm.runtime.scheduler.request import Req
    from radixlm.runtime.speculative import controller
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer
    from radixlm.sampling_params import SamplingParams

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=args.k,
                               speculative_ngram_min_match=args.ngram_min_match,
                               speculative_min_acceptance=args.min_acceptance)
    ctl = SpecController(config, NgramProposer(config, tok), context_len=8192)
    ctl.cost_aware = not args.plain_budget
    if args.large_max is not None:
        controller.T = replace(controller.T, large_batch_max_draft=args.large_max)  # the controller's tuning
    items = data["workloads"][name][:batch]
    reqs, want = [], {}
    for i, item in enumerate(items):
        r = Req(rid=f"{name}{i}", input_ids=item["input_ids"], params=SamplingParams(max_new_tokens=data["new"]))
        r.output_ids = item["output_ids"][:1]  # the prefill step's token
        want[r.rid] = item["output_ids"]
        reqs.append(r)
    running = [r for r in reqs if len(r.output_ids) < len(want[r.rid])]
    for r in reqs:
        if r not in running:
            ctl.on_finish(r)
    steps = on_ms = off_ms = 0.0
    proposed = accepted = 0
    for n in range(1, max(len(w) for w in want.values())):  # plain decode: one token per active request
        active = sum(len(w) > n for w in want.values())
        off_ms += cost(active, active)
    while running:
        drafts = ctl.propose(running, running)
        steps += 1
        on_ms += cost(len(running), sum(1 + len(d) for d in drafts))
        for req, draft in zip(list(running), drafts):
            full, pos = want[req.rid], len(req.output_ids)
            ok = 0
            while ok < len(draft) and pos + ok < len(full) and draft[ok] == full[pos + ok]:
                ok += 1
            emitted = min(ok + 1, len(full) - pos)
            req.output_ids.extend(full[pos : pos + emitted])
            ctl.on_verified(req, len(draft), ok, emitted)
            proposed += len(draft)
            accepted += ok
            if len(req.output_ids) >= len(full):
                req.finish = FinishReason("length", length=len(full))
                ctl.on_finish(req)
                running.remove(req)
    tokens = sum(len(w) - 1 for w in want.values())
    ctl.check_integrity(idle=True)
    return {"tok_fwd": tokens / max(1, steps) / batch, "accept": accepted / proposed if proposed else 0.0,
            "proposed": proposed, "speedup": off_ms / on_ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--k", type=int, default=None, help="speculative_num_draft_tokens (default: the engine's)")
    ap.add_argument("--ngram-min-match", type=int, default=3)
    ap.add_argument("--min-acceptance", type=float, default=0.25)
    ap.add_argument("--plain-budget", action="store_true", help="tuning.cost_aware off (no first-token gate)")
    ap.add_argument("--large-max", type=int, default=None, help="tuning.large_batch_max_draft")
    ap.add_argument("--workloads", nargs="+", default=["json", "code", "chat", "free"], choices=list(WORKLOADS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = ap.parse_args()
    if args.record:
        return record(args)
    from transformers import AutoTokenizer

    data = json.loads(CACHE.read_text())
    path = args.model_path or str(Path.home() / ".cache" / "radixlm" / "models" / "SmolLM2-135M-Instruct")
    tok = AutoTokenizer.from_pretrained(path)
    cost = CostTable(data["costs"])
    print(f"{'workload':10s} {'tok/fwd':>8s} {'accept':>7s} {'proposed':>8s} {'est. speedup':>12s}")
    for name in args.workloads:
        for batch in args.batches:
            r = replay(args, data, tok, name, batch, cost)
            print(f"{name + '/b' + str(batch):10s} {r['tok_fwd']:8.2f} {100 * r['accept']:6.0f}% {r['proposed']:8d} "
                  f"{r['speedup']:12.2f}")


if __name__ == "__main__":
    main()
