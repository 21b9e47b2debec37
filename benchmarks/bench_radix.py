"""RadixAttention benchmark: radix cache on vs off vs HF transformers (sequential `generate`), one run.

    .venv/bin/python benchmarks/bench_radix.py [--model-path DIR] [--threads N] [--quick] [--skip-hf]

Workloads (issue "RadixAttention"):
  (a) few-shot: one shared ~1,000-token prefix + 64 short questions, 16 new tokens each;
  (b) multi-turn chat: 16 conversations x 4 turns (each turn resends the whole history);
  (c) fork: one prefix, 8 branches of 32 new tokens.
Prints hit rate and throughput (generated tokens / wall second) with ratios against cache-off and HF.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Callable

import torch
import transformers

import radixlm
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import resolve_model_path

WORDS = ("apple river stone cloud garden music paper window summer forest light ocean bread "
         "mountain silver engine planet story winter coffee letter bridge market yellow").split()


def text_of(n_words: int, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (n_words,), generator=g))


@dataclass
class Workload:
    name: str
    run: Callable[[Callable], int]  # run(generate) -> generated tokens; generate(prompts, new) -> (texts, n)


def few_shot(prefix_words: int, questions: int) -> Workload:
    prefix = "Answer each question with one word.\n" + "\n".join(
        f"Q: {text_of(12, i)}? A: {WORDS[i % len(WORDS)]}" for i in range(prefix_words // 14))
    prompts = [f"{prefix}\nQ: {text_of(8, 1000 + q)}? A:" for q in range(questions)]
    return Workload("(a) few-shot", lambda generate: generate(prompts, 16)[1])


def chat(convs: int, turns: int) -> Workload:
    def run(generate) -> int:
        histories = [f"System: you are helpful.\nUser {c}: {text_of(30, c)}\n" for c in range(convs)]
        total = 0
        for t in range(turns):  # every turn resends the whole history plus the model's real replies
            prompts = [h + "Assistant:" for h in histories]
            replies, n = generate(prompts, 16)
            total += n
            histories = [p + r + f"\nUser {c}: {text_of(20, 100 * t + c)}\n"
                         for c, (p, r) in enumerate(zip(prompts, replies))]
        return total
    return Workload("(b) multi-turn chat", run)


def fork(prefix_words: int, branches: int) -> Workload:
    prefix = "Plan a trip.\n" + text_of(prefix_words, 7)
    prompts = [f"{prefix}\nIdea {b + 1}:" for b in range(branches)]
    return Workload("(c) fork", lambda generate: generate(prompts, 32)[1])


def timed(wl: Workload, generate) -> tuple[float, int]:
    t = time.perf_counter()
    tokens = wl.run(generate)
    return time.perf_counter() - t, tokens


def engine_runner(engine: Engine):
    def generate(prompts: list[str], new: int):
        res = engine.generate(prompts, {"max_new_tokens": new, "temperature": 0, "ignore_eos": True})
        return [r["text"] for r in res], sum(r["meta_info"]["completion_tokens"] for r in res)
    return generate


def hf_runner(model, tok):
    def generate(prompts: list[str], new: int):
        texts, n = [], 0
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                 do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
            texts.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
            n += out.shape[1] - ids.shape[1]
        return texts, n
    return generate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke run)")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    model_dir = resolve_model_path(args.model_path)
    if args.quick:
        workloads = [few_shot(300, 8), chat(4, 3), fork(200, 4)]
    else:
        workloads = [few_shot(1000, 64), chat(16, 4), fork(600, 8)]
    results = {}
    for label, opts in (("on", {}), ("off", {"disable_radix_cache": True})):
        with Engine(str(model_dir), num_threads=threads, max_total_tokens=65536, chunked_prefill_size=1024,
                    **opts) as engine:
            for wl in workloads:
                engine.flush_cache()
                before = dict(engine.cache_stats())
                secs, toks = timed(wl, engine_runner(engine))
                after = engine.cache_stats()
                prompt = after["prompt_tokens"] - before["prompt_tokens"]
                hit = (after["cached_tokens"] - before["cached_tokens"]) / prompt if prompt else 0.0
                results[(wl.name, label)] = (toks / secs, hit)
    if not args.skip_hf:
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        for wl in workloads:
            secs, toks = timed(wl, hf_runner(hf, tok))
            results[(wl.name, "hf")] = (toks / secs, 0.0)
    print(f"\nmodel {model_dir.name} fp32 | threads {threads} | torch {torch.__version__} | transformers "
          f"{transformers.__version__} | radixlm {radixlm.__version__}")
    print(f"{'workload':<22}{'hit rate':>9}{'on tok/s':>10}{'off tok/s':>10}{'HF tok/s':>10}{'on/off':>8}{'on/HF':>8}")
    for wl in workloads:
        on, hit = results[(wl.name, "on")]
        off, _ = results[(wl.name, "off")]
        hf = results.get((wl.name, "hf"), (float("nan"), 0))[0]
        print(f"{wl.name:<22}{hit:>8.1%}{on:>10.1f}{off:>10.1f}{hf:>10.1f}{on / off:>7.2f}x{on / hf:>7.2f}x")


if __name__ == "__main__":
    main()
