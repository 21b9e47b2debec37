"""Frontend program workloads (the SGLang paper's kinds, sized for 2 CPU cores): radix cache on vs off.

    .venv/bin/python benchmarks/bench_programs.py [--model-path DIR] [--num-threads N] [--quick] [--repeats N]
                                                  [--no-server]

Workloads: few-shot `select` over 64 questions (run_batch; every item shares the few-shot prefix),
fork-heavy tree-of-thought (fork(3) twice per question), multi-turn chat (every turn extends the last).
Configurations, run one after the other on the same machine and threads:
  radixlm    the in-process Engine backend, radix cache on (the system as shipped);
  engine-nc  the same Engine backend with disable_radix_cache=True (isolates the cache);
  openai-nc  the same programs through the OpenAI backend against a radixlm server launched with
             --disable-radix-cache (the issue's baseline; skipped, and said so, if no server starts).
Prints wall time per workload, ratios against radixlm, hit rates, threads and versions.
Runs in the user's process; the openai-nc server is a child process group.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from typing import Any, Callable

import radixlm as sgl

CONTINENTS = ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]
EXAMPLES = [("Kenya", "Africa"), ("Japan", "Asia"), ("Italy", "Europe"), ("Canada", "North America"),
            ("Chile", "South America"), ("Fiji", "Oceania"), ("Morocco", "Africa"), ("Norway", "Europe")]
COUNTRIES = ["France", "Brazil", "India", "Egypt", "Mexico", "Australia", "China", "Peru", "Spain", "Nigeria",
             "Germany", "Argentina", "Thailand", "Ghana", "Cuba", "Sweden", "Vietnam", "Colombia", "Poland",
             "Ethiopia", "Iran", "Portugal", "Kenya", "Chile", "Greece", "Mongolia", "Senegal", "Ireland",
             "Bolivia", "Nepal", "Angola", "Finland", "Panama", "Iraq", "Tunisia", "Austria", "Ecuador",
             "Laos", "Mali", "Belgium", "Jamaica", "Samoa", "Turkey", "Uganda", "Denmark", "Uruguay", "Oman",
             "Zambia", "Hungary", "Honduras", "Qatar", "Libya", "Croatia", "Paraguay", "Yemen", "Sudan",
             "Romania", "Guatemala", "Bhutan", "Namibia", "Ukraine", "Venezuela", "Tonga", "Somalia"]
FEW_SHOT = "Answer with the continent each country is in.\n\n" + "".join(
    f"Country: {c}\nContinent: {k}\n\n" for c, k in EXAMPLES)
PROBLEMS = ["Tom has 3 apples and buys 5 more. How many apples does he have?",
            "A train travels 60 km per hour for 2 hours. How far does it go?",
            "Anna reads 12 pages a day. How many pages does she read in a week?",
            "A box holds 6 eggs. How many eggs are in 4 boxes?"]
SYSTEM = ("You are a friendly travel assistant. You give short, practical answers about cities, food, "
          "transport and culture. You never answer with more than two sentences, and you ask no questions.")
CITIES = ["Paris", "Tokyo", "Rome", "Cairo", "Lima", "Sydney", "Berlin", "Madrid", "Oslo", "Delhi", "Hanoi",
          "Dublin", "Vienna", "Quito", "Athens", "Seoul"]
TURNS = ["I am visiting {city} next month. What should I see first?", "What local food should I try?",
         "How do I get around the city?"]


@sgl.function
def continent(s, country):
    s += FEW_SHOT + f"Country: {country}\nContinent: " + sgl.select("answer", choices=CONTINENTS)


@sgl.function
def tree_of_thought(s, question, num_branches, max_tokens):
    s += sgl.user(question)
    s += sgl.assistant("Let me think about it in several ways.")
    plans = s.fork(num_branches)
    plans += sgl.user("Propose one short plan to solve it.")
    plans += sgl.assistant(sgl.gen("plan", max_tokens=max_tokens))
    for plan in plans:
        runs = plan.fork(num_branches)
        runs += sgl.user("Carry out the plan and give the final number.")
        runs += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens))
        runs.join()
    plans.join()


@sgl.function
def chat(s, city, max_tokens):
    s += sgl.system(SYSTEM)
    for i, turn in enumerate(TURNS):
        s += sgl.user(turn.format(city=city))
        s += sgl.assistant(sgl.gen(f"reply_{i}", max_tokens=max_tokens))


def workloads(quick: bool) -> list[tuple[str, Callable[[Any], Any]]]:
    # ignore_eos: every configuration generates exactly the same number of tokens, whatever it samples
    # (branches sample at temperature 0.8 so they differ, as tree-of-thought wants).
    n_select, n_tot, n_chat, tokens = (16, 2, 6, 12) if quick else (64, 4, 16, 24)
    return [
        (f"few-shot select x{n_select}", lambda b: continent.run_batch(
            [{"country": c} for c in COUNTRIES[:n_select]], backend=b)),
        (f"tree-of-thought 3x3 x{n_tot}", lambda b: tree_of_thought.run_batch(
            [{"question": q, "num_branches": 3, "max_tokens": tokens} for q in PROBLEMS[:n_tot]],
            temperature=0.8, ignore_eos=True, backend=b)),
        (f"multi-turn chat 3 turns x{n_chat}", lambda b: chat.run_batch(
            [{"city": c, "max_tokens": tokens} for c in CITIES[:n_chat]], temperature=0, ignore_eos=True,
            backend=b)),
    ]


def measure(backend: Any, counters: Callable[[], tuple[float, float]], flush: Callable[[], Any],
            quick: bool, repeats: int) -> dict[str, tuple[float, float]]:
    """Best wall seconds of `repeats` runs and hit rate (cached / prompt tokens, from the runtime's
    counters, over all runs) per workload. The best run, because on a shared machine other jobs only
    ever add time."""
    results = {}
    for name, work in workloads(quick):
        prompt0, cached0 = counters()
        times = []
        for _ in range(repeats):
            flush()  # workloads and repeats do not share prefixes; start each from an empty cache
            t0 = time.perf_counter()
            work(backend)
            times.append(time.perf_counter() - t0)
        prompt1, cached1 = counters()
        results[name] = (min(times), (cached1 - cached0) / max(prompt1 - prompt0, 1))
        print(f"  {name}: {' '.join(f'{t:.1f}s' for t in times)}", file=sys.stderr)
    return results


def _stats_counters(get_stats: Callable[[], dict[str, Any]]) -> Callable[[], tuple[float, float]]:
    def counters() -> tuple[float, float]:
        stats = get_stats()
        return stats.get("prompt_tokens", 0), stats.get("cached_tokens", 0)
    return counters


def run_engine(model_path: str | None, num_threads: int, quick: bool, repeats: int, disable_radix_cache: bool):
    with sgl.Engine(model_path, num_threads=num_threads, disable_radix_cache=disable_radix_cache) as engine:
        engine.generate("warm up", {"max_new_tokens": 2})
        return measure(engine, _stats_counters(engine.cache_stats), engine.flush_cache, quick, repeats)


def run_openai_server(model_path: str | None, num_threads: int, quick: bool, repeats: int):
    """The same programs through the OpenAI backend against a radixlm server without the radix cache."""
    from radixlm.lang.backend.openai import OpenAI

    try:
        runtime = sgl.Runtime(model_path, served_model_name="bench", num_threads=num_threads,
                              disable_radix_cache=True, log_level="error", launch_timeout=300)
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"  openai-nc skipped: the radixlm server did not start ({e})", file=sys.stderr)
        return None
    try:
        # The model's own template (as the server reports it), so both backends build the same prompts.
        backend = OpenAI("bench", base_url=runtime.url + "/v1", api_key="EMPTY", max_retries=0, timeout=600,
                         chat_template=runtime.endpoint.chat_template)
        stats = lambda: runtime.get_server_info().get("cache_stats", {})  # noqa: E731
        return measure(backend, _stats_counters(stats), runtime.endpoint.flush_cache, quick, repeats)
    finally:
        runtime.shutdown()


def print_table(columns: dict[str, dict[str, tuple[float, float]] | None], threads: int, repeats: int) -> None:
    import torch
    import transformers

    names = list(columns["radixlm"])
    present = {k: v for k, v in columns.items() if v is not None}
    others = [k for k in present if k != "radixlm"]
    header = ["workload"] + [f"{k} s" for k in present] + [f"{k}/radixlm" for k in others] + \
        [f"hit {k}" for k in present]
    rows = []
    for name in names:
        base = present["radixlm"][name][0]
        rows.append([name] + [f"{present[k][name][0]:.1f}" for k in present] +
                    [f"{present[k][name][0] / base:.2f}x" for k in others] +
                    [f"{present[k][name][1]:.0%}" for k in present])
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths]] + rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    missing = [k for k, v in columns.items() if v is None]
    if missing:
        print(f"not measured: {', '.join(missing)} (see stderr)")
    print(f"\nbest of {repeats} run(s) per cell; threads: {threads} torch thread(s) per runtime, "
          f"{torch.get_num_threads()} in this process;\nradixlm {sgl.__version__}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, python {platform.python_version()}, {platform.machine()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct")
    p.add_argument("--num-threads", type=int, default=1,
                   help="torch threads of every runtime (1 on 2 cores: a server's other processes need a core)")
    p.add_argument("--quick", action="store_true", help="smaller workloads (about a quarter)")
    p.add_argument("--repeats", type=int, default=1, help="runs per workload; the best time is reported")
    p.add_argument("--no-server", action="store_true", help="skip the OpenAI-backend-against-a-server column")
    args = p.parse_args(argv)
    columns: dict[str, Any] = {}
    for name, disable in (("radixlm", False), ("engine-nc", True)):
        print(f"{name}:", file=sys.stderr)
        columns[name] = run_engine(args.model_path, args.num_threads, args.quick, args.repeats, disable)
    if not args.no_server:
        print("openai-nc:", file=sys.stderr)
        columns["openai-nc"] = run_openai_server(args.model_path, args.num_threads, args.quick, args.repeats)
    print_table(columns, args.num_threads, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
