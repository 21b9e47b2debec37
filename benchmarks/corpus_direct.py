"""xgrammar and llguidance used directly (their own JSON-schema compilers, no radixlm) on the real-schema
corpus: one process per library and variant, one compile at a time, killed and restarted past the limit.

The parent (`direct_side`) sends corpus indices on the child's stdin and reads one JSON line per compile;
the child is `bench_grammar.py --corpus-side LIB` (`side_main` here).
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

SIDES = {"xgrammar": "xgrammar", "llguidance": "llguidance", "llguidance-lenient": "llguidance"}
START_LIMIT_S = 300.0  # imports + tokenizer tables on a loaded machine


def _xgrammar_compiler(tokenizer: Any) -> Callable[[str], None]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    return lambda text: compiler.compile_json_schema(text)


def _llguidance_compiler(tokenizer: Any, lenient: bool) -> Callable[[str], None]:
    import llguidance as llg
    import llguidance.hf
    import llguidance.torch

    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    bitmask = llguidance.torch.allocate_token_bitmask(1, len(tokenizer))
    overrides = {"lenient": True} if lenient else None

    def compile_one(text: str) -> None:
        # Counted until the first mask: the matcher builds its lexer lazily.
        grammar = llg.LLMatcher.grammar_from_json_schema(text, overrides=overrides)
        matcher = llg.LLMatcher(lltok, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())

    return compile_one


def side_main(side: str) -> None:
    """Child process: compile the corpus schemas whose indices arrive on stdin, one JSON line each."""
    from benchmarks.schema_corpus import load_corpus, spec_text
    from radixlm.runtime.model.loader import load_tokenizer

    tokenizer = load_tokenizer(None)
    corpus = load_corpus()
    if side == "xgrammar":
        compile_one = _xgrammar_compiler(tokenizer)
    else:
        compile_one = _llguidance_compiler(tokenizer, lenient=side == "llguidance-lenient")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        i = int(line)
        t0 = time.perf_counter()
        try:
            compile_one(spec_text(corpus[i]))
            ok, error = True, ""
        except Exception as e:  # noqa: BLE001 - each library refuses in its own way
            ok, error = False, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        print(json.dumps({"i": i, "ok": ok, "seconds": time.perf_counter() - t0, "error": error}), flush=True)


class _Child:
    def __init__(self, side: str, threads: int):
        import os

        script = Path(__file__).resolve().parent / "bench_grammar.py"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "RAYON_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([sys.executable, str(script), "--corpus-side", side], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        if (self.read(START_LIMIT_S) or {}).get("ready") is not True:
            self.kill()
            raise RuntimeError(f"{side}: the side process did not start")

    def read(self, limit_s: float) -> dict | None:
        if not self.sel.select(limit_s):
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"crashed": True}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def direct_side(side: str, indices: list[int], limit_s: float = 10.0, threads: int = 1) -> list[dict]:
    """One result per corpus index: {"ok", "seconds", "error"}; a compile past limit_s is a timeout."""
    if SIDES[side] not in _installed():
        return []
    child = _Child(side, threads)
    out = []
    for i in indices:
        child.proc.stdin.write(f"{i}\n")
        child.proc.stdin.flush()
        row = child.read(limit_s)
        if row is None or row.get("crashed"):  # past the limit, or the process died: start a fresh one
            child.kill()
            error = f"timeout ({limit_s:g} s)" if row is None else f"crashed (exit {child.proc.returncode})"
            row = {"i": i, "ok": False, "seconds": limit_s if row is None else 0.0, "error": error}
            child = _Child(side, threads)
        out.append(row)
    child.proc.stdin.close()
    child.kill()
    return out


def _installed() -> set[str]:
    import importlib.util

    return {m for m in ("xgrammar", "llguidance") if importlib.util.find_spec(m) is not None}
