"""The llguidance backend next to outlines (and xgrammar when installed), on the SmolLM2 tokenizer:

  --corpus   the real-schema corpus (tests/data/real_schemas/): coverage, compile p50/p90/p99 through the
             GrammarCache (one worker, one compile at a time, the serving 5 s limit), what building a
             matcher costs in the scheduler process (llguidance: the LLMatcher built from the worker's
             grammar text in the dispatcher thread, then a deep copy per request), valid-instance
             acceptance;
  --masks    per-token mask cost along seeded random walks over tests/constrained/corpus (47 schemas):
             MaskBuilder.build for a lone request (what GrammarManager.masks does on the CPU) and
             fill_bitmask into a batch row, p50/p90/p99 in us; decode steps with and without jump-forward.

    python benchmarks/bench_llguidance.py --masks
    python benchmarks/bench_llguidance.py --corpus --backends llguidance outlines
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

V = 49152


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def row(values: list[float], scale: float = 1e6) -> str:
    return " / ".join(f"{pct(values, q) * scale:.1f}" for q in (0.5, 0.9, 0.99))


def tokenizer():
    from radixlm.runtime.model.loader import load_tokenizer

    return load_tokenizer(None)


def bench_masks(backends: list[str], seeds: int) -> None:
    """Every backend replays the same token sequences (outlines' seeded walks, jump-forward off), so
    each times the same states; the first replay is cold (llguidance builds lexer states lazily), the
    second warm."""
    import torch

    from radixlm.constrained import GrammarOptions, make_backend
    from radixlm.constrained.bitmask import MaskBuilder, num_words
    from radixlm.constrained.simulate import random_walk
    from tests.constrained.corpus.schemas import SCHEMAS

    tok = tokenizer()
    cpu = torch.device("cpu")
    print(f"\nper-token mask cost, SmolLM2 (V = {V}), {len(SCHEMAS)} corpus schemas x {seeds} seeds, the same "
          "tokens for every backend, p50 / p90 / p99 us")
    print("| style | backend | steps | build cold | build warm | fill_bitmask warm | id-list share | steps JF on / off |")
    print("|---|---|---|---|---|---|---|---|")
    for style in ("default", "compact"):
        options = GrammarOptions(compact=style == "compact")
        made = {name: make_backend(name, tok, V, options) for name in backends}
        walks = []
        for spec in SCHEMAS.values():
            grammar = made["outlines"].compile("json_schema", json.dumps(spec))
            walks += [(spec, random_walk(grammar.matcher(), tok, V, seed=s, jump_forward=False).token_ids)
                      for s in range(seeds)]
        for name, backend in made.items():
            stats = {"cold": [], "warm": [], "fill": [], "lists": 0, "steps": [0, 0]}
            builder, words = MaskBuilder(), torch.zeros(num_words(V), dtype=torch.int32)
            for spec, ids in walks:
                try:
                    grammar = backend.compile("json_schema", json.dumps(spec))
                except Exception:  # noqa: BLE001 - a refused schema is not timed
                    continue
                for key in ("cold", "warm"):
                    _replay(grammar.matcher(), ids, builder, words, cpu, stats, key)
                for i, jf in enumerate((True, False)):
                    stats["steps"][i] += random_walk(grammar.matcher(), tok, V, seed=0, jump_forward=jf).num_steps
            share = stats["lists"] / max(1, len(stats["warm"]))
            print(f"| {style} | {name} | {len(stats['warm'])} | {row(stats['cold'])} | {row(stats['warm'])} |"
                  f" {row(stats['fill'])} | {share:.0%} | {stats['steps'][0]} / {stats['steps'][1]} |")


def _replay(matcher, ids, builder, words, cpu, stats, key) -> None:
    for token in ids:
        probe = matcher.copy()  # a fresh copy has not computed this state's mask yet
        t0 = time.perf_counter()
        mask = builder.build([probe], V, cpu)
        stats[key].append(time.perf_counter() - t0)
        if key == "warm":
            stats["lists"] += bool(mask is not None and mask.cpu and mask.cpu[0].ids is not None)
            probe = matcher.copy()
            t0 = time.perf_counter()
            probe.fill_bitmask(words)
            stats["fill"].append(time.perf_counter() - t0)
        if not matcher.accept_token(token):  # (llguidance allows only canonical tokens of forced text)
            return


def bench_corpus(backends: list[str], limit: int | None) -> None:
    from benchmarks.schema_corpus import check_instances, compile_corpus, load_corpus, refusal_reason
    from radixlm.constrained import GrammarOptions, make_backend

    tok = tokenizer()
    corpus = load_corpus()[:limit]
    print(f"\nreal-schema corpus: {len(corpus)} schemas, SmolLM2 tokenizer, GrammarCache (1 worker, sequential, 5 s)")
    print("| backend | accepted | compile p50 / p90 / p99 ms | max ms | instances accepted | top refusals |")
    print("|---|---|---|---|---|---|")
    for name in backends:
        backend = make_backend(name, tok, V, GrammarOptions())
        results = compile_corpus(backend, corpus, sequential=True)
        ok = [r for r in results.values() if r.grammar is not None]
        times = [r.seconds for r in results.values()]
        reasons: dict[str, int] = {}
        for r in results.values():
            if r.error is not None:
                key = refusal_reason(r.error)
                reasons[key] = reasons.get(key, 0) + 1
        top = "; ".join(f"{n}x {k}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
        taken = total = 0
        by_name = {c.name: c for c in corpus}
        for r in ok:
            for check in check_instances(r.grammar, tok, by_name[r.name]):
                total += 1
                taken += check.refused_at == -1
        print(f"| {name} | {len(ok)}/{len(corpus)} | {row(times, 1e3)} | {max(times) * 1e3:.0f} |"
              f" {taken}/{total} | {top} |")
        if name == "llguidance":
            matcher_build_cost(backend, corpus, ok)


def matcher_build_cost(backend, corpus, ok) -> None:
    """What the scheduler process pays: LLMatcher from grammar text (runs in the dispatcher thread,
    llguidance releases the GIL) and the per-request deep copy (runs on the scheduler loop)."""
    from radixlm.constrained.llguidance_compile import compile_serialized

    by_name = {c.name: c for c in corpus}
    build, copy = [], []
    for r in ok:
        data = compile_serialized("json_schema", json.dumps(by_name[r.name].schema), backend.options, backend._payload)
        t0 = time.perf_counter()
        grammar = backend.load(data)
        build.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        grammar.matcher()
        copy.append(time.perf_counter() - t0)
    print(f"\nllguidance in the scheduler process ({len(build)} schemas), p50 / p90 / p99 / max:")
    print(f"  LLMatcher from the worker's text (dispatcher thread): {row(build, 1e3)} / {max(build) * 1e3:.1f} ms")
    print(f"  matcher() = deep copy (scheduler loop): {row(copy)} / {max(copy) * 1e6:.1f} us")
    print(f"  mean build {statistics.mean(build) * 1e3:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--masks", action="store_true")
    parser.add_argument("--corpus", action="store_true")
    parser.add_argument("--backends", nargs="+", default=["outlines", "llguidance"],
                        help="outlines first: its walks are the token sequences every backend replays")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="first N corpus schemas only")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.masks:
        bench_masks(args.backends, args.seeds)
    if args.corpus:
        bench_corpus(args.backends, args.limit)


if __name__ == "__main__":
    main()
