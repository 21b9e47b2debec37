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
    print("| style | backend | steps | build cold | build warm | fill_bitmask warm | id-list share | states with forced"
          " text / forced chars | walk steps JF on / off |")
    print("|---|---|---|---|---|---|---|---|---|")
    for style in ("default", "compact"):
        options = GrammarOptions(compact=style == "compact")
        made = {name: make_backend(name, tok, V, options) for name in backends}
        walks = []
        for spec in SCHEMAS.values():
            grammar = made["outlines"].compile("json_schema", json.dumps(spec))
            walks += [(spec, random_walk(grammar.matcher(), tok, V, seed=s, jump_forward=False).token_ids)
                      for s in range(seeds)]
        for name, backend in made.items():
            stats = {"cold": [], "warm": [], "fill": [], "lists": 0, "steps": [0, 0], "forced": [0, 0]}
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
                  f" {row(stats['fill'])} | {share:.0%} | {stats['forced'][0]} / {stats['forced'][1]} |"
                  f" {stats['steps'][0]} / {stats['steps'][1]} |")


def _replay(matcher, ids, builder, words, cpu, stats, key) -> None:
    for token in ids:
        probe = matcher.copy()  # a fresh copy has not computed this state's mask yet
        t0 = time.perf_counter()
        mask = builder.build([probe], V, cpu)
        stats[key].append(time.perf_counter() - t0)
        if key == "warm":
            stats["lists"] += bool(mask is not None and mask.cpu and mask.cpu[0].ids is not None)
            forced = matcher.jump_forward()
            stats["forced"][0] += bool(forced)
            stats["forced"][1] += len(forced or "")
            probe = matcher.copy()
            t0 = time.perf_counter()
            probe.fill_bitmask(words)
            stats["fill"].append(time.perf_counter() - t0)
        if not matcher.accept_token(token):  # (llguidance allows only canonical tokens of forced text)
            return


def compile_sequential(backend, corpus, timeout_s: float = 5.0) -> dict:
    """name -> (grammar or None, GrammarError or None, seconds from submit to result: the worker's compile
    plus the scheduler-side load, i.e. what a request waits in the grammar queue)."""
    from radixlm.constrained import GrammarError
    from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig
    from benchmarks.schema_corpus import spec_text

    out = {}
    config = GrammarCacheConfig(num_workers=1, compile_timeout_s=timeout_s, max_entries=len(corpus) + 1)
    with GrammarCache(backend, config) as cache:
        cache.submit("regex", "warm").exception()  # the worker started and imported its library
        for item in corpus:
            t0 = time.perf_counter()
            fut = cache.submit("json_schema", spec_text(item))
            error = fut.exception()
            seconds = time.perf_counter() - t0
            if error is not None and not isinstance(error, GrammarError):
                raise error
            out[item.name] = (None if error else fut.result(), error, seconds)
    return out


def bench_corpus(backends: list[str], limit: int | None) -> None:
    from benchmarks.schema_corpus import check_instances, load_corpus, refusal_reason
    from radixlm.constrained import GrammarOptions, make_backend

    tok = tokenizer()
    corpus = load_corpus()[:limit]
    print(f"\nreal-schema corpus: {len(corpus)} schemas, SmolLM2 tokenizer, GrammarCache (1 worker, one at a time, 5 s)")
    print("| backend | accepted | compile p50 / p90 / p99 ms (accepted) | max ms | instances accepted | top refusals |")
    print("|---|---|---|---|---|---|")
    by_name = {c.name: c for c in corpus}
    for name in backends:
        backend = make_backend(name, tok, V, GrammarOptions())
        results = compile_sequential(backend, corpus)
        ok = {n: r for n, r in results.items() if r[0] is not None}
        times = [r[2] for r in ok.values()]
        reasons: dict[str, int] = {}
        for _, error, _ in results.values():
            if error is not None:
                key = refusal_reason(error)
                reasons[key] = reasons.get(key, 0) + 1
        top = "; ".join(f"{n}x {k}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:4])
        taken = total = 0
        for n, (grammar, _, _) in ok.items():
            for check in check_instances(grammar, tok, by_name[n]):
                if check.refused_at == -2:  # schema_corpus.UNREPRESENTABLE: the tokenizer cannot write it
                    continue
                total += 1
                taken += check.refused_at == -1
        print(f"| {name} | {len(ok)}/{len(corpus)} | {row(times, 1e3)} | {max(times) * 1e3:.0f} |"
              f" {taken}/{total} | {top} |", flush=True)
        if name == "llguidance":
            matcher_build_cost(backend, corpus, list(ok))


def matcher_build_cost(backend, corpus, names) -> None:
    """What the scheduler process pays: LLMatcher from grammar text (runs in the dispatcher thread,
    llguidance releases the GIL) and the per-request deep copy (runs on the scheduler loop)."""
    from radixlm.constrained.llguidance_compile import compile_serialized

    by_name = {c.name: c for c in corpus}
    build, copy = [], []
    for n in names:
        data = compile_serialized("json_schema", json.dumps(by_name[n].schema), backend.options, backend._payload)
        t0 = time.perf_counter()
        grammar = backend.load(data)
        build.append(time.perf_counter() - t0)
        samples = []
        for _ in range(5):  # min of 5: single samples here catch preemption on a loaded machine
            t0 = time.perf_counter()
            grammar.matcher()
            samples.append(time.perf_counter() - t0)
        copy.append(min(samples))
    print(f"\nllguidance in the scheduler process ({len(build)} schemas), p50 / p90 / p99 / max:")
    print(f"  LLMatcher from the worker's text (dispatcher thread): {row(build, 1e3)} / {max(build) * 1e3:.1f} ms")
    print(f"  matcher() = deep copy + buffers (scheduler loop, min of 5): {row(copy)} / {max(copy) * 1e6:.1f} us")
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
