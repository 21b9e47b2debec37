"""Tool calling on the Berkeley Function Calling Leaderboard's questions, end to end: `radixlm serve` on the
default model, the official openai client sending BFCL's questions with BFCL's tools (converted as BFCL's
harness converts them for an OpenAI-compatible server), greedy, each answer scored by BFCL's own AST checker.

    .venv/bin/pip install --no-deps bfcl-eval==2026.3.23   # BFCL's data and checker (not its provider SDKs)
    .venv/bin/python benchmarks/bench_tools.py [--limit 40] [--categories simple_python multiple ...]

Three sides, each its own server process started in turn: the llguidance grammar with tool_choice
`required` and with `auto`, and `auto` with the grammar off (`--grammar-backend outlines`: the output is
parsed afterwards, as servers without tool grammars do). Per category and side: how many answers hold a
call, how many of the calls' arguments validate against their schemas, how many BFCL scores correct.

BFCL's checker module imports its table of model configurations, which imports every provider's SDK; the
checker reads one field of it (whether the model's function names had `.` replaced by `_`), so this script
registers a one-entry table under that module's name before importing the checker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import machine_lines  # noqa: E402
from benchmarks.tool_corpus import openai_tool  # noqa: E402

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple")
SIDES = (("grammar, required", "llguidance", "required"), ("grammar, auto", "llguidance", "auto"),
         ("no grammar, auto", "outlines", "auto"))
MODEL_NAME = "radixlm-bench"  # the one entry of the checker's model table


def _checker():
    class Config:
        underscore_to_dot = True  # openai_tool sends `math_factorial` for BFCL's `math.factorial`

    table = types.ModuleType("bfcl_eval.constants.model_config")
    table.MODEL_CONFIG_MAPPING = {MODEL_NAME: Config()}
    sys.modules["bfcl_eval.constants.model_config"] = table
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return lambda functions, output, truth, category: ast_checker(functions, output, truth, Language.PYTHON,
                                                                   category, MODEL_NAME)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load(category: str, limit: int) -> list[tuple[dict, list]]:
    """(entry, ground truth) pairs, evenly spaced over the category."""
    data = resources.files("bfcl_eval") / "data"
    entries = _lines(data / f"BFCL_v4_{category}.json")
    truth = {o["id"]: o["ground_truth"] for o in _lines(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    step = max(1, len(entries) // limit)
    return [(e, truth[e["id"]]) for e in entries[::step][:limit]]


def ask(client, model: str, entry: dict, choice: str, max_tokens: int) -> dict:
    tools = [openai_tool(fn) for fn in entry["function"]]
    res = client.chat.completions.create(model=model, messages=entry["question"][0], tools=tools, tool_choice=choice,
                                         temperature=0, max_tokens=max_tokens)
    msg = res.choices[0].message
    calls = [{c.function.name: json.loads(c.function.arguments)} for c in msg.tool_calls or ()]
    return {"calls": calls, "tokens": res.usage.completion_tokens, "finish": res.choices[0].finish_reason}


def valid_arguments(entry: dict, calls: list[dict]) -> bool:
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in map(openai_tool, entry["function"])}
    return all(name in schemas and jsonschema.Draft202012Validator(schemas[name]).is_valid(args)
               for call in calls for name, args in call.items())


def run_side(backend: str, choice: str, work: dict, args: argparse.Namespace, check) -> dict:
    import openai

    from radixlm.lang.backend.runtime import Runtime

    runtime = Runtime(args.model_path, log_level="warning", port=args.port, grammar_backend=backend,
                      num_threads=args.num_threads)
    try:
        client = openai.OpenAI(base_url=runtime.url + "/v1", api_key="none", max_retries=0, timeout=1800)
        model = client.models.list().data[0].id
        rows = {}
        for category, items in work.items():
            start = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                outs = list(pool.map(lambda it: ask(client, model, it[0], choice, args.max_tokens), items))
            wall = time.perf_counter() - start
            correct = sum(bool(o["calls"]) and check(e["function"], o["calls"], t, category)["valid"]
                          for (e, t), o in zip(items, outs))
            rows[category] = {"n": len(items), "with_call": sum(bool(o["calls"]) for o in outs),
                              "valid_args": sum(bool(o["calls"]) and valid_arguments(e, o["calls"])
                                                for (e, _), o in zip(items, outs)),
                              "correct": correct, "cut": sum(o["finish"] == "length" for o in outs),
                              "tokens": sum(o["tokens"] for o in outs) / len(outs), "wall_s": wall}
        return rows
    finally:
        runtime.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES)
    p.add_argument("--limit", type=int, default=40, help="questions per category (evenly spaced)")
    p.add_argument("--sides", nargs="+", default=[s[0] for s in SIDES], choices=[s[0] for s in SIDES])
    p.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--port", type=int, default=30200)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    check = _checker()
    from importlib.metadata import version

    work = {c: load(c, args.limit) for c in args.categories}
    results = {name: run_side(backend, choice, work, args, check) for name, backend, choice in SIDES
               if name in args.sides}
    print("\n".join(machine_lines()))
    print(f"bfcl-eval {version('bfcl-eval')}, model {args.model_path or 'SmolLM2-135M-Instruct (default)'}, "
          f"greedy, max_tokens {args.max_tokens}, concurrency {args.concurrency}")
    print("| category | side | n | answers with a call | calls' arguments valid | BFCL correct | cut by max_tokens "
          "| tokens / answer | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for category in args.categories:
        for side, rows in results.items():
            r = rows[category]
            print(f"| {category} | {side} | {r['n']} | {r['with_call']} | {r['valid_args']} / {r['with_call']} "
                  f"| {r['correct']} ({100 * r['correct'] / r['n']:.0f}%) | {r['cut']} | {r['tokens']:.0f} "
                  f"| {r['wall_s']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
