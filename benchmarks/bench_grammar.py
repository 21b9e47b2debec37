"""Constrained-decoding benchmark: compile time, mask time per token, jump-forward share (no model).

Runs standalone in one process (compile workers are not used: this measures the compile itself).
Decoding is simulated with the tokenizer: each step samples a random allowed token (random logits
under the grammar mask), steering to the nearest accepting state after --soft-len tokens.

    python benchmarks/bench_grammar.py                 # SmolLM2 tokenizer (cached), whole corpus
    python benchmarks/bench_grammar.py --tokenizer tiny --seeds 2 --backends outlines,xgrammar
"valid specs" counts corpus specs whose every simulated output finished and validated; specs with
an invalid output, and those whose walks did not finish (the driver steers xgrammar by heuristic),
are listed under the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _load_tokenizer(name: str):
    if name == "tiny":
        from radixlm.testing import build_tokenizer

        return build_tokenizer(tempfile.mkdtemp(prefix="bench-tok-"))
    from radixlm.runtime.model.loader import load_tokenizer

    return load_tokenizer(None if name == "default" else name)


def _specs() -> list[tuple[str, str, str]]:
    from tests.constrained.corpus.schemas import REGEXES, SCHEMAS

    specs = [(n, "json_schema", json.dumps(s)) for n, s in sorted(SCHEMAS.items())]
    specs += [(n, "regex", r) for n, r in sorted(REGEXES.items())]
    return specs


def _walk(grammar, tokenizer, vocab_size: int, kind: str, name: str, **kw):
    """One walk and "ok" / "unfinished" (max tokens reached: the driver could not steer to an end) /
    "invalid" (the output breaks the spec; walk None if the matcher itself broke)."""
    from radixlm.constrained.simulate import random_walk
    from tests.constrained.corpus.schemas import check_output

    try:
        walk = random_walk(grammar.matcher(), tokenizer, vocab_size, **kw)
        if not walk.finished:
            return walk, "unfinished"
        try:
            check_output(kind, name, walk.text)
        except (AssertionError, ValueError):
            return walk, "invalid"
        return walk, "ok"
    except (AssertionError, ValueError):
        return None, "invalid"


def run(tokenizer, backend_name: str, style: str, seeds: int, soft_len: int) -> dict:
    from radixlm.constrained import GrammarError, GrammarOptions, make_backend

    vocab_size = len(tokenizer)
    backend = make_backend(backend_name, tokenizer, vocab_size, GrammarOptions(compact=style == "compact"))
    compile_s, mask_s, cold_s, failures = [], [], [], []
    invalid: set[str] = set()
    unfinished: set[str] = set()
    slowest: list[tuple[float, str]] = []
    steps = {True: 0, False: 0}
    tokens = {True: 0, False: 0}
    jump_tokens = 0
    for name, kind, spec in _specs():
        t0 = time.perf_counter()
        try:
            grammar = backend.compile(kind, spec)
        except GrammarError as e:
            failures.append(f"{name}: {e}")
            continue
        compile_s.append(time.perf_counter() - t0)
        slowest.append((compile_s[-1], name))
        # Two identical rounds: the first visits states cold (mask rows built on first use), the
        # second is the steady state of a grammar many requests share.
        for warm in (False, True):
            for seed in range(seeds):
                for jump in (True, False):
                    walk, status = _walk(grammar, tokenizer, vocab_size, kind, name, seed=seed,
                                         jump_forward=jump, soft_len=soft_len, time_masks=True)
                    {"invalid": invalid, "unfinished": unfinished}.get(status, set()).add(name)
                    if walk is None:
                        continue
                    (mask_s if warm else cold_s).extend(walk.mask_seconds)
                    if warm:
                        steps[jump] += walk.num_steps
                        tokens[jump] += len(walk.token_ids)
                        jump_tokens += walk.num_jump_tokens if jump else 0
    num_valid = len(_specs()) - len(failures) - len(invalid | unfinished)
    return {"backend": backend_name, "style": style, "valid": f"{num_valid}/{len(_specs())}",
            "invalid": sorted(invalid), "unfinished": sorted(unfinished - invalid), "compile_s": compile_s, "mask_s": mask_s, "cold_s": cold_s, "steps": steps,
            "tokens": tokens, "jump_tokens": jump_tokens, "failures": failures, "slowest": sorted(slowest)[-3:]}


def _print(results: list[dict], tokenizer_name: str, vocab_size: int) -> None:
    import outlines_core
    import torch

    version = getattr(outlines_core, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("outlines_core")
    try:
        from importlib.metadata import version as _v

        xgr = _v("xgrammar")
    except Exception:  # noqa: BLE001 - optional
        xgr = "not installed"
    print(f"outlines-core {version} | xgrammar {xgr} | torch {torch.__version__} | threads {torch.get_num_threads()} "
          f"| tokenizer {tokenizer_name} ({vocab_size} tokens) | {len(_specs())} specs")
    head = ("backend", "whitespace", "valid specs", "compile p50 ms", "compile p90 ms", "mask p50 us", "mask p90 us", "mask p99 us",
            "cold mask p50/p99 us", "steps JF on/off", "fewer steps", "JF token share")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in results:
        c = [x * 1e3 for x in r["compile_s"]]
        m = [x * 1e6 for x in r["mask_s"]]
        cold = [x * 1e6 for x in r["cold_s"]]
        on, off = r["steps"][True], r["steps"][False]
        share = r["jump_tokens"] / max(1, r["tokens"][True])
        print(f"{r['backend']} | {r['style']} | {r['valid']} | {_pct(c, .5):.1f} | {_pct(c, .9):.1f} | {_pct(m, .5):.1f} | {_pct(m, .9):.1f} | "
              f"{_pct(m, .99):.1f} | {_pct(cold, .5):.0f}/{_pct(cold, .99):.0f} | {on}/{off} | {1 - on / max(1, off):.0%} | {share:.0%}")
    for r in results:
        tag = f"{r['backend']}/{r['style']}"
        print(f"slowest compiles ({tag}): " + ", ".join(f"{n} {t * 1e3:.0f} ms" for t, n in r["slowest"]))
        for f in r["failures"]:
            print(f"compile failed ({tag}) {f}")
        if r["invalid"]:
            print(f"invalid outputs ({tag}): {', '.join(r['invalid'])}")
        if r["unfinished"]:
            print(f"unfinished walks, not judged ({tag}): {', '.join(r['unfinished'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="default", help="default (SmolLM2), tiny, or a model directory")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--soft-len", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backends", default="outlines", help="comma-separated: outlines,xgrammar")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = _load_tokenizer(args.tokenizer)
    results = [run(tokenizer, b, style, args.seeds, args.soft_len)
               for b in args.backends.split(",") for style in ("default", "compact")]
    _print(results, args.tokenizer, len(tokenizer))
    print(f"median compile over all: {statistics.median(sum((r['compile_s'] for r in results), [])) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
