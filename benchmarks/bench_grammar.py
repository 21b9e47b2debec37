"""Constrained-decoding benchmark: compile time, mask time per token, jump-forward share (no model).

Runs standalone in one process (compile workers are not used: this measures the compile itself).
Decoding is simulated with the tokenizer: each step samples a random allowed token (random logits
under the grammar mask), steering to the nearest accepting state after --soft-len tokens.

Mask time per token = what the scheduler adds per request and step because of the grammar, on one
[1, V] float32 logits row (the sampler's vocab view; its processor scan runs with or without masks):
  old:    bool [V] allocated + matcher.fill_allowed_mask (GrammarManager before), then what the sampler's
          apply_processors did for that mask: copy the logits + apply_allowed_masks;
  new:    MaskBuilder.build (what GrammarManager.masks runs) + apply_grammar_mask (what the sampler
          runs), on the CPU with the backend's CpuMask layouts where it has them, else the bitmask;
  packed: the same, forced to the packed bitmask (the CUDA layout) and unpacked on the CPU.
The paths take turns, one per step, so each runs after the walk's own work and none after another
path's. In the first (cold) round every step also computes all three, untimed, and compares them;
only the second, warm round is timed (warm: the grammar's masks are built; the CPU caches hold whatever
the walk's own work left, as they hold what a forward pass left in a server, so this is the cost a
step sees). "old", "new" and "new fill" turns are also timed a second time right away ("repeated at
once": caches hot, the code's own cost). "new fill" turns time MaskBuilder.build alone (comparable
with the "bool fill" columns: fill_allowed_mask alone, timed by the walk at every step). "x16" turns
time a batch of 16 requests (this step's matcher
plus copies of the 15 previous steps' matchers: 16 different states, as a decode batch of concurrent
requests has) and report the batch time / 16, i.e. per request.

    python benchmarks/bench_grammar.py                 # SmolLM2 tokenizer (cached), whole corpus
    python benchmarks/bench_grammar.py --tokenizer tiny --seeds 2 --backends outlines,xgrammar
    python benchmarks/bench_grammar.py --corpus --backends outlines,xgrammar,llguidance   # real-world schemas
"--corpus" replaces the hand-written corpus with tests/data/real_schemas/ (see corpus_bench.py): coverage,
compile and mask time per backend, and xgrammar / llguidance used directly, side by side.
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
from collections import deque
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


class MaskTimer:
    """Times the old, new and packed per-token mask paths (see the module docstring) on a matcher."""

    PATHS = ("old", "new", "packed", "old x16", "new x16", "new fill", "greedy", "greedy base")
    AGAIN = ("old", "new", "new fill")  # also timed a second time right away ("... again")
    BATCH = 16

    def __init__(self, vocab_size: int, eos: int):
        import torch

        from radixlm.constrained.bitmask import MaskBuilder
        from radixlm.runtime.model.sampler import Sampler, SamplingRow
        from radixlm.sampling_params import SamplingParams

        self.vocab_size = vocab_size
        self.sampler = Sampler(vocab_size, frozenset({eos}))
        self.greedy_rows = [SamplingRow(SamplingParams(temperature=0.0), [1], [], None, wants_logprob=False)]
        self.cpu = torch.device("cpu")
        logits = torch.randn(1, vocab_size + 7, generator=torch.Generator().manual_seed(0))
        self.logits = logits
        self.work = self.sampler._vocab_view(logits)  # the view the sampler masks
        batch_logits = torch.randn(self.BATCH, vocab_size + 7, generator=torch.Generator().manual_seed(1))
        self.work_batch = batch_logits[:, :vocab_size]
        self.pool: deque = deque(maxlen=self.BATCH - 1)  # copies of recent matchers (other states)
        self.builder = MaskBuilder()
        self.seconds: dict[str, list[float]] = {p: [] for p in (*self.PATHS, *(a + " again" for a in self.AGAIN))}
        self.record = False
        self.check = False
        self._turn = 0

    def __call__(self, matcher) -> None:
        import torch

        if self.check:
            old, new, packed = self._old(matcher), self._new(matcher).clone(), self._packed(matcher)
            if not (torch.equal(old, new) and torch.equal(old, packed)):
                raise RuntimeError("the mask paths disagree")  # not an AssertionError: _walk must not hide it
            if self._greedy(matcher) != [int(old.argmax())] and bool(torch.isfinite(old).any()):
                raise RuntimeError("greedy under the grammar is not the masked argmax")
        self._turn += 1
        path = self.PATHS[self._turn % len(self.PATHS)]
        batch = path.endswith("x16")
        if batch and len(self.pool) < self.BATCH - 1:
            path, batch = self.PATHS[self._turn % 3], False
        run = getattr(self, "_" + path.replace(" x16", "_batch").replace(" ", "_"))
        arg = [matcher, *self.pool] if batch else matcher
        t0 = time.perf_counter()
        run(arg)
        elapsed = time.perf_counter() - t0
        if self.record:
            self.seconds[path].append(elapsed / (self.BATCH if batch else 1))
            if path in self.AGAIN:  # the same call at once again: caches hot, the code's own cost
                t0 = time.perf_counter()
                run(arg)
                self.seconds[path + " again"].append(time.perf_counter() - t0)
        self.pool.append(matcher.copy())

    def _greedy(self, matcher):
        """A greedy request's whole sampler step with its grammar (what the scheduler runs per token)."""
        mask = self.builder.build([matcher], self.logits.shape[-1], self.cpu)
        return self.sampler(self.logits, self.greedy_rows, mask).token_ids

    def _greedy_base(self, matcher):
        """The same step without a grammar (the baseline the "greedy" turns are compared with)."""
        return self.sampler(self.logits, self.greedy_rows).token_ids

    def _new_fill(self, matcher):
        return self.builder.build([matcher], self.vocab_size, self.cpu)

    def _old_batch(self, matchers):
        import torch

        from radixlm.runtime.model.penalties import apply_allowed_masks

        masks = []
        for matcher in matchers:
            mask = torch.empty(self.vocab_size, dtype=torch.bool)
            matcher.fill_allowed_mask(mask)
            masks.append(mask)
        out = self.work_batch.clone()
        apply_allowed_masks(out, list(range(len(matchers))), masks)
        return out

    def _new_batch(self, matchers):
        from radixlm.constrained.bitmask import apply_grammar_mask

        return apply_grammar_mask(self.work_batch, None, self.builder.build(matchers, self.vocab_size, self.cpu))

    def _old(self, matcher):
        import torch

        from radixlm.runtime.model.penalties import apply_allowed_masks

        mask = torch.empty(self.vocab_size, dtype=torch.bool)
        matcher.fill_allowed_mask(mask)
        out = self.work.clone()
        apply_allowed_masks(out, [0], [mask])
        return out

    def _new(self, matcher):
        from radixlm.constrained.bitmask import apply_grammar_mask

        return apply_grammar_mask(self.work, None, self.builder.build([matcher], self.vocab_size, self.cpu))

    def _packed(self, matcher):
        from radixlm.constrained.bitmask import apply_grammar_mask

        masks = self.builder.build([matcher], self.vocab_size, self.cpu, cpu_layouts=False)
        return apply_grammar_mask(self.work, None, masks)


def run(tokenizer, backend_name: str, style: str, seeds: int, soft_len: int) -> dict:
    from radixlm.constrained import GrammarError, GrammarOptions, make_backend

    vocab_size = len(tokenizer)
    backend = make_backend(backend_name, tokenizer, vocab_size, GrammarOptions(compact=style == "compact"))
    timer = MaskTimer(vocab_size, tokenizer.eos_token_id)
    tables = {"states": 0, "rows": 0, "bytes": 0}
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
            timer.record, timer.check = warm, not warm
            for seed in range(seeds):
                for jump in (True, False):
                    walk, status = _walk(grammar, tokenizer, vocab_size, kind, name, seed=seed,
                                         jump_forward=jump, soft_len=soft_len, time_masks=True,
                                         on_step=timer)
                    {"invalid": invalid, "unfinished": unfinished}.get(status, set()).add(name)
                    if walk is None:
                        continue
                    (mask_s if warm else cold_s).extend(walk.mask_seconds)
                    if warm:
                        steps[jump] += walk.num_steps
                        tokens[jump] += len(walk.token_ids)
                        jump_tokens += walk.num_jump_tokens if jump else 0
        fsm = getattr(grammar, "fsm", None)  # outlines: the per-step mask table of this grammar
        if fsm is not None:
            for key, value in fsm.mask_table_stats().items():
                tables[key] += value
            tables["max_rows"] = max(tables.get("max_rows", 0), fsm.mask_table_stats()["rows"])
            tables["max_bytes"] = max(tables.get("max_bytes", 0), fsm.mask_table_stats()["bytes"])
    num_valid = len(_specs()) - len(failures) - len(invalid | unfinished)
    return {"backend": backend_name, "style": style, "valid": f"{num_valid}/{len(_specs())}",
            "invalid": sorted(invalid), "unfinished": sorted(unfinished - invalid), "compile_s": compile_s, "mask_s": mask_s, "cold_s": cold_s, "steps": steps,
            "tokens": tokens, "jump_tokens": jump_tokens, "failures": failures, "slowest": sorted(slowest)[-3:],
            "paths": timer.seconds, "tables": tables}


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
    head = ("backend", "whitespace", "valid specs", "compile p50 ms", "compile p90 ms", "bool fill p50 us",
            "bool fill p90 us", "bool fill p99 us", "cold bool fill p50/p99 us", "steps JF on/off", "fewer steps", "JF token share")
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
    print()
    print("per-token mask time (fill + apply as the scheduler and sampler do it, per request, warm), us:")
    head = ("backend", "whitespace", "batch", "samples", "old p50/p90/p99", "new p50/p90/p99",
            "packed p50/p90/p99", "old/new p50", "old/new p90", "old/new p99")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in results:
        q = {p: [_pct([x * 1e6 for x in r["paths"][p]], f) for f in (.5, .9, .99)] for p in r["paths"]}
        for tag, suffix in (("1", ""), ("16", " x16")):
            cells = ["/".join(f"{v:.1f}" for v in q[p + suffix]) if p + suffix in q else "-"
                     for p in ("old", "new", "packed")]
            ratios = [f"{q['old' + suffix][k] / q['new' + suffix][k]:.1f}x" for k in range(3)]
            print(f"{r['backend']} | {r['style']} | {tag} | {len(r['paths']['new' + suffix])} | "
                  + " | ".join(cells + ratios))
    for r in results:
        fill = [x * 1e6 for x in r["paths"]["new fill"]]
        print(f"fill alone ({r['backend']}/{r['style']}): new MaskBuilder.build p50/p90/p99 "
              + "/".join(f"{_pct(fill, f):.1f}" for f in (.5, .9, .99)) + " us (old: the bool fill columns above)")
    for r in results:
        with_g, base = ([x * 1e6 for x in r["paths"][p]] for p in ("greedy", "greedy base"))
        print(f"greedy sampler step, 1 request ({r['backend']}/{r['style']}), p50/p90/p99 us: with the grammar "
              + "/".join(f"{_pct(with_g, f):.1f}" for f in (.5, .9, .99)) + " (mask build + Sampler), without "
              + "/".join(f"{_pct(base, f):.1f}" for f in (.5, .9, .99))
              + f"; the grammar adds {_pct(with_g, .5) - _pct(base, .5):+.1f} us at p50")
    for r in results:
        again = {p: [x * 1e6 for x in r["paths"][p + " again"]] for p in MaskTimer.AGAIN}
        print(f"repeated at once, caches hot ({r['backend']}/{r['style']}), p50/p90/p99 us: "
              + "; ".join(f"{p} " + "/".join(f"{_pct(v, f):.1f}" for f in (.5, .9, .99)) for p, v in again.items()))
    for r in results:
        t = r["tables"]
        if t["states"]:
            print(f"mask tables ({r['backend']}/{r['style']}): {t['states']} states -> {t['rows']} distinct masks "
                  f"over the corpus, {t['bytes'] / 2**20:.1f} MiB (packed words + additive rows); "
                  f"largest grammar: {t['max_rows']} masks, {t['max_bytes'] / 2**20:.2f} MiB")
    for r in results:
        tag = f"{r['backend']}/{r['style']}"
        print(f"slowest compiles ({tag}): " + ", ".join(f"{n} {t * 1e3:.0f} ms" for t, n in r["slowest"]))
        for f in r["failures"]:
            print(f"compile failed ({tag}) {f}")
        if r["invalid"]:
            print(f"invalid outputs ({tag}): {', '.join(r['invalid'])}")
        if r["unfinished"]:
            print(f"unfinished walks, not judged ({tag}): {', '.join(r['unfinished'])}")


ENGINE_MODES = {"greedy": {"temperature": 0.0}, "sampled (T 0.7, top_p 0.95)": {"temperature": 0.7, "top_p": 0.95}}


def engine_run(num_specs: int, max_new_tokens: int) -> None:
    """The real SmolLM2 Engine, one request at a time over the first corpus specs, greedy and sampled (each
    twice: the second pass is measured, its grammars' masks built): per token, the mask build, the
    sampler with the grammar and (paired) the sampler on the same logits without it, and how the sampler
    settled each constrained row (id list / unmasked argmax allowed / full mask)."""
    import torch

    from radixlm.constrained import bitmask
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model import sampler as sampler_module
    from radixlm.runtime.scheduler.grammar import GrammarManager

    outcome: dict[str, int] = {}
    seconds: dict[str, list[float]] = {"masks": [], "with": [], "without": []}

    def count(key: str, n: int = 1) -> None:
        outcome[key] = outcome.get(key, 0) + n

    def counting_greedy(source, greedy, mask):
        decided, rest = bitmask.greedy_under_grammar(source, greedy, mask)
        for i in (*mask.cpu, *mask.bit_rows):
            if greedy[i]:
                plan = mask.cpu.get(i)
                kind = "id list" if plan is not None and plan.ids_np is not None else "argmax allowed"
                count(kind if i in decided else "full mask")
        return decided, rest

    sample_lists = sampler_module.Sampler._sample_allowed_lists

    def counting_sampled(sampler, source, rows, grammar, decided):
        before = len(decided)
        rest = sample_lists(sampler, source, rows, grammar, decided)
        count("id list", len(decided) - before)
        count("full mask", sum(1 for i in (*grammar.cpu, *grammar.bit_rows)
                               if not rows[i].params.is_greedy and i not in decided))
        return rest

    build_masks = GrammarManager.masks

    def timed_masks(*args):
        t0 = time.perf_counter()
        out = build_masks(*args)
        if out is not None:  # a step with a constrained row
            seconds["masks"].append(time.perf_counter() - t0)
        return out

    call = sampler_module.Sampler.__call__

    def paired(sampler, logits, rows, grammar=None):
        """A constrained call is paired with an unconstrained one on the same logits, in alternating
        order, so that neither always runs with the caches the other left."""
        if grammar is None:
            return call(sampler, logits, rows)
        order = [(grammar, "with"), (None, "without")][:: 1 if len(seconds["with"]) % 2 else -1]
        for mask, key in order:
            t0 = time.perf_counter()
            out = call(sampler, logits, rows, mask)
            seconds[key].append(time.perf_counter() - t0)
            if mask is not None:
                kept = out
        return kept

    sampler_module.greedy_under_grammar = counting_greedy
    sampler_module.Sampler._sample_allowed_lists = counting_sampled
    sampler_module.Sampler.__call__ = paired
    GrammarManager.masks = timed_masks
    specs = _specs()[:num_specs]
    q = lambda xs: "/".join(f"{_pct(xs, f):.1f}" for f in (.5, .9, .99))  # noqa: E731
    with Engine(None, max_total_tokens=16384) as eng:
        prompts = [eng.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Give one short example of {name.replace('_', ' ')}."}],
            tokenize=False, add_generation_prompt=True) for name, _, _ in specs]
        for mode, params in ENGINE_MODES.items():
            for _ in range(2):  # the first pass builds each grammar's mask rows (as its first request)
                for values in seconds.values():
                    values.clear()
                outcome.clear()
                for prompt, (_, kind, spec) in zip(prompts, specs):
                    eng.generate(prompt, {"max_new_tokens": max_new_tokens, **params, kind: spec})
            masks = [x * 1e6 for x in seconds["masks"]]
            with_g, without = ([x * 1e6 for x in seconds[k]] for k in ("with", "without"))
            added = [masks[k] + with_g[k] - without[k] for k in range(min(len(masks), len(with_g)))]
            total = max(1, sum(outcome.values()))
            print(f"\nreal model (SmolLM2, Engine, {mode}, 1 request at a time, {len(specs)} specs, "
                  f"{len(with_g)} constrained tokens, threads {torch.get_num_threads()}), p50/p90/p99 us:")
            print(f"GrammarManager.masks {q(masks)}; Sampler with the grammar {q(with_g)}, the same logits "
                  f"without it {q(without)}; per token the grammar adds (masks + with - without) {q(added)}")
            print("constrained rows settled by: " + ", ".join(f"{k} {v / total:.0%}" for k, v in outcome.items()))


def e2e_side(jump_forward: bool, max_new_tokens: int, compact: bool) -> None:
    """Worker process (--e2e-side): every corpus JSON schema on the real SmolLM2 Engine, greedy, jump-forward
    on or off, one request at a time ("sequential") and all at once ("batch"); prints one JSON line per
    mode (tokens, seconds, forward steps, valid, cut by length)."""
    from radixlm.runtime.engine import Engine
    from tests.constrained.corpus.schemas import SCHEMAS, check_output

    names = sorted(SCHEMAS)
    with Engine(None, max_total_tokens=32768, disable_jump_forward=not jump_forward,
                constrained_json_whitespace_pattern="" if compact else None) as eng:
        prompts = [eng.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Give one short example of {n.replace('_', ' ')} as JSON."}],
            tokenize=False, add_generation_prompt=True) for n in names]
        params = [{"max_new_tokens": max_new_tokens, "temperature": 0, "repetition_penalty": 1.3,
                   "json_schema": json.dumps(SCHEMAS[n])} for n in names]
        eng.generate(prompts, [{**p, "max_new_tokens": 1} for p in params])  # compiles (and caches) every
        for mode in ("sequential", "batch"):  # grammar, so the timed runs measure decoding
            eng.flush_cache()  # the radix cache starts empty
            steps = eng.scheduler.num_forward_steps
            t0 = time.perf_counter()
            if mode == "batch":
                results = eng.generate(prompts, params)
            else:
                results = [eng.generate(p, q) for p, q in zip(prompts, params)]
            seconds = time.perf_counter() - t0
            steps = eng.scheduler.num_forward_steps - steps
            valid = cut = 0
            for name, r in zip(names, results):
                if r["meta_info"]["finish_reason"]["type"] == "length":
                    cut += 1
                    continue
                try:
                    check_output("json_schema", name, r["text"])
                    valid += 1
                except (AssertionError, ValueError):
                    pass
            tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
            print(json.dumps({"mode": mode, "requests": len(names), "tokens": tokens, "seconds": seconds,
                              "steps": steps, "valid": valid, "cut": cut}))


def e2e_run(max_new_tokens: int, repeats: int, styles: list[str]) -> None:
    """End-to-end JSON decode throughput with jump-forward on vs off, per whitespace style; each side in its
    own process (one OpenMP pool per process), the sides alternating per repeat."""
    import subprocess

    for style in styles:
        rows: dict[tuple[str, bool], list[dict]] = {}
        for _ in range(repeats):
            for jump in (True, False):
                cmd = [sys.executable, __file__, "--e2e-side", "on" if jump else "off",
                       "--engine-tokens", str(max_new_tokens), "--e2e-styles", style]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                for line in out.strip().splitlines():
                    if line.startswith("{"):
                        row = json.loads(line)
                        rows.setdefault((row["mode"], jump), []).append(row)
        first = next(iter(rows.values()))[0]
        print(f"\nend-to-end JSON decode, {style} whitespace (SmolLM2 Engine, the {first['requests']} corpus "
              f"schemas, greedy, repetition_penalty 1.3, max_new_tokens {max_new_tokens}, {repeats} repeats, median):")
        # The outputs differ (a jump re-tokenizes), so the wall time of the same requests is the fair
        # comparison; tok/s counts each side's own output tokens.
        print("requests | jump-forward | seconds | forward steps | output tokens | output tok/s | valid / cut by "
              "length | off/on seconds")
        print("--- | --- | --- | --- | --- | --- | --- | ---")
        for mode in ("sequential", "batch"):
            secs = {}
            for jump in (True, False):
                r = rows[(mode, jump)]
                secs[jump] = statistics.median(x["seconds"] for x in r)
                ratio = f"{secs[False] / secs[True]:.2f}x" if not jump else ""
                print(f"{mode} | {'on' if jump else 'off'} | {secs[jump]:.1f} | "
                      f"{statistics.median(x['steps'] for x in r):.0f} | {statistics.median(x['tokens'] for x in r):.0f} | "
                      f"{statistics.median(x['tokens'] / x['seconds'] for x in r):.1f} | "
                      f"{r[-1]['valid']} / {r[-1]['cut']} | {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="default", help="default (SmolLM2), tiny, or a model directory")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--soft-len", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backends", default="outlines", help="comma-separated: outlines,xgrammar")
    parser.add_argument("--engine-specs", type=int, default=0,
                        help="also run the real SmolLM2 Engine on this many corpus specs (0: skip)")
    parser.add_argument("--engine-tokens", type=int, default=64, help="max_new_tokens of the --engine-specs runs")
    parser.add_argument("--e2e", type=int, default=0, metavar="REPEATS",
                        help="also measure end-to-end JSON decode throughput, jump-forward on vs off (0: skip)")
    parser.add_argument("--e2e-styles", default="default,compact", help="JSON whitespace styles of --e2e")
    parser.add_argument("--e2e-side", choices=("on", "off"), help=argparse.SUPPRESS)  # internal: a worker
    parser.add_argument("--corpus", action="store_true", help="the real-world JSON-schema corpus instead")
    parser.add_argument("--corpus-sides", default="xgrammar,llguidance,llguidance-lenient",
                        help="libraries used directly next to --corpus (empty: none)")
    parser.add_argument("--corpus-walks", type=int, default=60, help="schemas walked for mask times in --corpus")
    parser.add_argument("--corpus-limit", type=int, default=0, help="an evenly spaced sample of this many schemas")
    parser.add_argument("--corpus-side", help=argparse.SUPPRESS)  # internal: a direct-library worker
    args = parser.parse_args()
    if args.e2e_side is not None:
        e2e_side(args.e2e_side == "on", args.engine_tokens, args.e2e_styles == "compact")
        return
    if args.corpus_side is not None:
        from benchmarks.corpus_direct import side_main

        side_main(args.corpus_side)
        return
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = _load_tokenizer(args.tokenizer)
    if args.corpus:
        from benchmarks.corpus_bench import corpus_run

        corpus_run(tokenizer, args.backends.split(","), [s for s in args.corpus_sides.split(",") if s],
                   args.threads, args.corpus_walks, limit=args.corpus_limit)
        return
    results = [run(tokenizer, b, style, args.seeds, args.soft_len)
               for b in args.backends.split(",") for style in ("default", "compact")]
    _print(results, args.tokenizer, len(tokenizer))
    print(f"median compile over all: {statistics.median(sum((r['compile_s'] for r in results), [])) * 1e3:.1f} ms")
    if args.engine_specs:
        engine_run(args.engine_specs, args.engine_tokens)
    if args.e2e:
        e2e_run(args.engine_tokens, args.e2e, args.e2e_styles.split(","))


if __name__ == "__main__":
    main()
