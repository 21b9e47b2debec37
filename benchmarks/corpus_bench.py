"""`bench_grammar.py --corpus`: the real-world schema corpus (tests/data/real_schemas/) per grammar backend
through radixlm (coverage, compile time, mask time on short walks, walk outputs valid, valid instances
accepted) and, side by side, xgrammar and llguidance used directly (corpus_direct.py).

Runs in the benchmark's main process; radixlm compiles go through a GrammarCache (one worker, one compile
at a time, the serving limit), so a compile's time is what a request waits for it, loading included.
"""

from __future__ import annotations

import collections
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from benchmarks.corpus_direct import SIDES, direct_side
from benchmarks.machine_info import cpu_line
from benchmarks.schema_corpus import (CorpusSchema, check_instances, compile_corpus, load_corpus,
                                      output_errors, refusal_reason, validator_for)

def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _walks(results: dict, accepted: list[CorpusSchema], tokenizer: Any, num_schemas: int) -> dict:
    from radixlm.constrained.simulate import random_walk

    mask_s: list[float] = []
    finished = valid = 0
    step = max(1, len(accepted) // max(1, num_schemas))
    for item in accepted[::step][:num_schemas]:
        try:
            walk = random_walk(results[item.name].grammar.matcher(), tokenizer, len(tokenizer), seed=0,
                               max_tokens=96, soft_len=32, time_masks=True)
        except AssertionError:  # an empty mask or a refused allowed token: a broken grammar, not valid
            finished += 1
            continue
        mask_s += walk.mask_seconds
        if walk.finished:
            finished += 1
            valid += not output_errors(validator_for(item.schema), walk.text)
    return {"mask_s": mask_s, "finished": finished, "valid": valid}


def radixlm_side(name: str, tokenizer: Any, corpus: list[CorpusSchema], walk_schemas: int, timeout_s: float) -> dict:
    from radixlm.constrained import GrammarOptions, make_backend

    backend = make_backend(name, tokenizer, len(tokenizer), GrammarOptions())
    results = compile_corpus(backend, corpus, timeout_s=timeout_s, sequential=True)
    accepted = [c for c in corpus if results[c.name].grammar is not None]
    checks = [k for c in accepted for k in check_instances(results[c.name].grammar, tokenizer, c)]
    unrepresentable = sum(1 for k in checks if not k.judged)
    checks = [k for k in checks if k.judged]
    refusals = collections.Counter(refusal_reason(r.error) for r in results.values() if r.error is not None)
    return {"name": name, "accepted": len(accepted), "total": len(corpus),
            "timeouts": sum(1 for r in results.values() if r.error is not None and r.error.code == "grammar_timeout"),
            "compile_s": [r.seconds for r in results.values()],
            "instances": (sum(1 for k in checks if k.refused_at < 0), len(checks)), "unrepresentable": unrepresentable,
            "refused_instances": [f"{k.name}: {k.context}" for k in checks if k.refused_at >= 0],
            "refusals": refusals, **_walks(results, accepted, tokenizer, walk_schemas)}


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _ms(values: list[float]) -> str:
    return "/".join(f"{_pct(values, q) * 1e3:.1f}" for q in (.5, .9, .99))


def _print(rows: list[dict], direct: dict[str, list[dict]], corpus: list, threads: int, timeout_s: float) -> None:
    import torch

    print(f"\nreal-world JSON schemas: {len(corpus)} schemas | outlines-core {_version('outlines_core')} | xgrammar "
          f"{_version('xgrammar')} | llguidance {_version('llguidance')} | torch {torch.__version__} | threads "
          f"{threads} | {cpu_line()}")
    print(f"\nthrough radixlm (SmolLM2 tokenizer, default whitespace, {timeout_s:g} s compile limit, one compile at a time):")
    head = ("backend", "coverage", "timeouts", "compile p50/p90/p99 ms (every schema)", "mask p50/p99 us",
            "walk outputs valid / finished", "valid instances accepted")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        ok, n = r["instances"]
        masks = r["mask_s"]
        print(f"{r['name']} | {r['accepted']}/{r['total']} ({r['accepted'] / r['total']:.1%}) | {r['timeouts']} | "
              f"{_ms(r['compile_s'])} | {_pct(masks, .5) * 1e6:.0f}/{_pct(masks, .99) * 1e6:.0f} | "
              f"{r['valid']}/{r['finished']} | {ok}/{n} ({ok / max(1, n):.1%})")
    if direct:
        print("\nthe libraries directly (their own JSON-schema compilers on the raw schema, no radixlm; SmolLM2 "
              "tokenizer; each in its own process; 10 s limit per compile; llguidance timed to its first mask):")
        head = ("library", "coverage", "timeouts", "compile p50/p90/p99 ms (every schema)")
        print(" | ".join(head))
        print(" | ".join("---" for _ in head))
        for side, res in direct.items():
            ok = sum(1 for x in res if x["ok"])
            timeouts = sum(1 for x in res if x["error"].startswith("timeout"))
            print(f"{side} | {ok}/{len(res)} ({ok / max(1, len(res)):.1%}) | {timeouts} | {_ms([x['seconds'] for x in res])}")
    for r in rows:
        print(f"\nmost frequent refusals ({r['name']}):")
        for reason, count in r["refusals"].most_common(12):
            print(f"  {count:4d}  {reason}")
        for line in r["refused_instances"][:8]:
            print(f"  valid instance refused: {line[:200]}")
    for side, res in direct.items():
        reasons = collections.Counter(x["error"][:90] for x in res if not x["ok"])
        print(f"\nmost frequent refusals ({side}, directly): " + "; ".join(f"{c}x {e}" for e, c in reasons.most_common(6)))


def corpus_run(tokenizer: Any, backends: list[str], sides: list[str], threads: int, walk_schemas: int,
               timeout_s: float = 5.0, limit: int = 0) -> None:
    full = load_corpus()
    indices = list(range(len(full)))
    if limit:  # an evenly spaced sample (quick runs)
        indices = indices[:: max(1, len(full) // limit)][:limit]
    corpus = [full[i] for i in indices]
    rows = []
    for b in backends:  # each row as soon as it is measured (a long run still reports what it has)
        rows.append(radixlm_side(b, tokenizer, corpus, walk_schemas, timeout_s))
        _print(rows[-1:], {}, corpus, threads, timeout_s)
    print("\n---- all together ----")
    direct = {s: direct_side(s, indices, threads=threads) for s in sides if s in SIDES}
    _print(rows, {k: v for k, v in direct.items() if v}, corpus, threads, timeout_s)
