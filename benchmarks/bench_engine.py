"""Engine vs HF transformers `generate` on the same weights, threads and machine, in one run.

    .venv/bin/python benchmarks/bench_engine.py [--model-path DIR] [--threads N] [--quick]

Workloads (issue "Engine core"): decode tok/s at batch 1; aggregate tok/s for 32 concurrent requests
(128 prompt tokens, 64 new); prefill tok/s for a 1024-token prompt. HF's batch uses left padding, the
way a user would batch with `generate`. Prints a table with ratios (radixlm / HF).

One more row is what concurrent users really send: 32 requests with ragged prompts (32..224 tokens, mean
128) and ragged output budgets (16..112 new tokens, mean 64). HF's batch pads every prompt to the longest
and decodes every row for the largest budget; only the tokens each request asked for are counted.
`--layouts` adds columns: radixlm with each other weight layout (row, column, blocks; "auto" is the
measured choice, runtime/model/weight_layout.py), to show what the layouts buy.

Each side (HF, and radixlm per layout) runs in its own worker process, loaded once: torch work of
several threads in one process would share libgomp's thread accounting and slow every side
(runtime/engine_loop.py); a standalone user program has one such thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import transformers

import radixlm
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import resolve_model_path
from radixlm.runtime.model.weight_layout import LAYOUTS


def make_prompt_ids(tok, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    vocab = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    return [vocab[int(i)] for i in torch.randint(len(vocab), (n,), generator=g)]


def hf_decode_tps(model, ids: list[int], new: int) -> float:
    x = torch.tensor([ids])
    model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=4, do_sample=False)  # warm-up
    t = time.perf_counter()
    model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new, do_sample=False)
    return new / (time.perf_counter() - t)


def hf_batch_tps(model, tok, prompts: list[list[int]], new: int) -> float:
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    t = time.perf_counter()
    model.generate(**batch, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=tok.pad_token_id)
    return len(prompts) * new / (time.perf_counter() - t)


def hf_ragged_tps(model, tok, prompts: list[list[int]], budgets: list[int]) -> float:
    """One padded `generate` over all prompts, run to the largest budget; useful tokens per second."""
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    top = max(budgets)
    t = time.perf_counter()
    model.generate(**batch, max_new_tokens=top, min_new_tokens=top, do_sample=False, pad_token_id=tok.pad_token_id)
    return sum(budgets) / (time.perf_counter() - t)


def hf_prefill_tps(model, ids: list[int]) -> float:
    x = torch.tensor([ids])
    with torch.inference_mode():
        model(x[:, :16])
        t = time.perf_counter()
        model(x)
    return len(ids) / (time.perf_counter() - t)


def ours_decode_tps(engine: Engine, ids: list[int], new: int) -> float:
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    engine.generate(input_ids=ids, sampling_params={**params, "max_new_tokens": 4})  # warm-up
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(input_ids=ids, sampling_params=params)
    return new / (time.perf_counter() - t)


def ours_batch_tps(engine: Engine, prompts: list[list[int]], new: int) -> float:
    engine.flush_cache()
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    t = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    return len(prompts) * new / (time.perf_counter() - t)


def ours_ragged_tps(engine: Engine, prompts: list[list[int]], budgets: list[int]) -> float:
    engine.flush_cache()
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in budgets]
    t = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    return sum(budgets) / (time.perf_counter() - t)


def ragged_workload(tok, nreq: int, plen: int, new: int) -> tuple[list[list[int]], list[int]]:
    """Prompt lengths uniform in [plen/4, 7 plen/4] and budgets in [new/4, 7 new/4] (means plen, new)."""
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(plen // 4, 7 * plen // 4 + 1, (nreq,), generator=g).tolist()
    budgets = torch.randint(new // 4, 7 * new // 4 + 1, (nreq,), generator=g).tolist()
    return [make_prompt_ids(tok, n, 200 + i) for i, n in enumerate(lens)], budgets


def ours_prefill_tps(engine: Engine, ids: list[int]) -> float:
    engine.flush_cache()
    engine.generate(input_ids=ids[:16], sampling_params={"max_new_tokens": 0})
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})
    return len(ids) / (time.perf_counter() - t)


def workloads(tok, quick: bool) -> list[tuple[str, Callable[[Engine], float], Callable[[Any], float]]]:
    """(name, ours(engine), hf(model)) per workload; the same prompts in every process (fixed seeds)."""
    new, nreq, plen, long_len = (16, 8, 64, 256) if quick else (64, 32, 128, 1024)
    one = make_prompt_ids(tok, 8, 0)
    batch = [make_prompt_ids(tok, plen, 1 + i) for i in range(nreq)]
    ragged, budgets = ragged_workload(tok, nreq, plen, new)
    long_prompt = make_prompt_ids(tok, long_len, 99)
    return [
        (f"decode tok/s, batch 1 ({new} new)", lambda e: ours_decode_tps(e, one, new),
         lambda hf: hf_decode_tps(hf, one, new)),
        (f"throughput tok/s, {nreq} reqs x {plen} prompt, {new} new", lambda e: ours_batch_tps(e, batch, new),
         lambda hf: hf_batch_tps(hf, tok, batch, new)),
        (f"throughput tok/s, {nreq} ragged reqs (mean {plen}/{new})", lambda e: ours_ragged_tps(e, ragged, budgets),
         lambda hf: hf_ragged_tps(hf, tok, ragged, budgets)),
        (f"prefill tok/s, {long_len}-token prompt", lambda e: ours_prefill_tps(e, long_prompt),
         lambda hf: hf_prefill_tps(hf, long_prompt)),
    ]


def serve_side(side: str, model_dir: str, threads: int, quick: bool) -> None:
    """Worker process of one side ("hf" or a radixlm weight layout): load once, then run the workload whose
    index arrives on each stdin line and print its tok/s."""
    torch.set_num_threads(threads)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    if side == "hf":
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        runs = [lambda hf=hf: hf(model) for _, _, hf in workloads(tok, quick)]
    else:
        engine = Engine(model_dir, num_threads=threads, max_total_tokens=32 * 400 + 2048,
                        chunked_prefill_size=2048, weight_layout=side)
        runs = [lambda ours=ours: ours(engine) for _, ours, _ in workloads(tok, quick)]
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(runs[int(line)]()), flush=True)


class Side:
    """A worker process (this script with --side): each side has its own process, so its torch threads
    are the only OpenMP pool there, as in a standalone program (engine_loop.py says why that matters)."""

    def __init__(self, side: str, model_dir: str, threads: int, quick: bool):
        cmd = [sys.executable, __file__, "--side", side, "--model-path", model_dir, "--threads", str(threads)]
        self.proc = subprocess.Popen(cmd + (["--quick"] if quick else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {side} worker did not start")

    def run(self, index: int) -> float:
        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke run)")
    ap.add_argument("--layouts", action="store_true", help="also run radixlm with the other weight layouts")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats per workload (median shown)")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)  # internal: a worker process
    args = ap.parse_args()
    threads = args.threads or torch.get_num_threads()
    model_dir = str(resolve_model_path(args.model_path))
    if args.side is not None:
        serve_side(args.side, model_dir, threads, args.quick)
        return
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    names = [name for name, _, _ in workloads(tok, args.quick)]
    layouts = ("auto", *(x for x in LAYOUTS if x != "auto")) if args.layouts else ("auto",)
    sides = {side: Side(side, model_dir, threads, args.quick) for side in (*layouts, "hf")}
    # Each repeat measures every side of a workload back to back (one process at a time), so slow phases
    # of a shared machine hit both sides of a ratio; the table shows medians and the per-repeat ratios' range.
    runs: list[dict[str, list[float]]] = []
    for index in range(len(names)):
        got: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.repeats):
            for side, worker in sides.items():
                got[side].append(worker.run(index))
        runs.append(got)
    for worker in sides.values():
        worker.close()
    print(f"\nmodel {Path(model_dir).name} fp32 | threads {threads} | torch {torch.__version__} | transformers "
          f"{transformers.__version__} | radixlm {radixlm.__version__} | {platform.processor() or platform.machine()}"
          f" | median of {args.repeats} | each side in its own process")
    extra = "".join(f"{layout:>10}" for layout in layouts[1:])
    spread = f"{'ratio range':>16}" if args.repeats > 1 else ""
    print(f"{'workload':<52}{'radixlm':>10}{extra}{'HF':>10}{'ratio':>8}{spread}")
    for name, got in zip(names, runs):
        med = {side: statistics.median(v) for side, v in got.items()}
        row = "".join(f"{med[layout]:>10.1f}" for layout in layouts[1:])
        ratios = [a / b for a, b in zip(got["auto"], got["hf"])]
        rng = f"{min(ratios):>9.2f}-{max(ratios):.2f}x" if args.repeats > 1 else ""
        print(f"{name:<52}{med['auto']:>10.1f}{row}{med['hf']:>10.1f}{med['auto'] / med['hf']:>7.2f}x{rng}")


if __name__ == "__main__":
    main()
