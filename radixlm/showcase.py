"""`radixlm showcase`: four frontend programs on the default model, then the cache hit rate they achieved.

Runs in the user's process, with the in-process Engine (no server). The programs are the kinds the
frontend exists for: a few-shot classifier with `select` run as a batch (every item shares the
few-shot prefix), a fork/join that explains each tip in its own branch (every branch shares the
conversation before the fork), a JSON-schema constrained `gen`, and a multi-turn chat (every turn
extends the last). The hit rate printed at the end is the share of prompt tokens the radix cache
served during these programs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import radixlm as sgl
from radixlm.runtime.cli import add_engine_args, engine_options

CLASSES = ["mammal", "bird", "fish", "reptile", "insect"]
FEW_SHOT = ("Classify each animal as a mammal, bird, fish, reptile or insect.\n\n"
            "Animal: eagle\nClass: bird\n\nAnimal: salmon\nClass: fish\n\n"
            "Animal: cobra\nClass: reptile\n\nAnimal: horse\nClass: mammal\n\n"
            "Animal: bee\nClass: insect\n\n")
ANIMALS = ["dolphin", "parrot", "shark", "ant", "lizard", "tiger"]
CHARACTER_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24},
                   "age": {"type": "integer", "minimum": 1, "maximum": 999},
                   "weapon": {"type": "string", "maxLength": 24}},
    "required": ["name", "age", "weapon"],
    "additionalProperties": False,
}
TIPS = ["Start with simple recipes", "Taste as you cook", "Keep your knives sharp"]
CHAT_TURNS = ["What is the capital of France?", "Name one famous museum there.", "What is it known for?"]


@sgl.function
def classify_animal(s, animal):
    s += FEW_SHOT + f"Animal: {animal}\nClass: " + sgl.select("cls", choices=CLASSES)


@sgl.function
def explain_tips(s, topic, tips):
    s += sgl.user(f"Here are {len(tips)} tips for {topic}: " + " ".join(f"{i + 1}. {t}." for i, t in enumerate(tips)))
    s += sgl.assistant("Got it.")
    branches = s.fork(len(tips))  # the conversation so far is prefilled once; every branch reuses it
    for i, branch in enumerate(branches):
        branch += sgl.user(f'Explain tip {i + 1}, "{tips[i]}", in one sentence.')
        branch += sgl.assistant(sgl.gen("detail", max_tokens=32, stop="."))
    branches.join()  # each branch's "detail" lands in a list on the parent, in branch order


@sgl.function
def invent_character(s):
    s += sgl.user("Invent a fantasy hero. Reply in JSON with name, age and weapon.")
    s += sgl.assistant(sgl.gen("character", max_tokens=80, json_schema=CHARACTER_SCHEMA))


@sgl.function
def chat(s, turns):
    for i, question in enumerate(turns):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"reply_{i}", max_tokens=40))


def _section(title: str, body: Callable[[], None]) -> None:
    print(f"\n== {title}")
    t0 = time.perf_counter()
    body()
    print(f"   ({time.perf_counter() - t0:.1f}s)")


def _few_shot(engine: Any) -> None:
    states = classify_animal.run_batch([{"animal": a} for a in ANIMALS], backend=engine)
    for animal, state in zip(ANIMALS, states):
        print(f"   {animal:>8} -> {state['cls']}")


def _fork_join(engine: Any) -> None:
    state = explain_tips.run(topic="learning to cook", tips=TIPS, temperature=0, backend=engine)
    for tip, detail in zip(TIPS, state["detail"]):
        print(f"   {tip}: {detail.strip()}.")


def _json_schema(engine: Any) -> None:
    import jsonschema

    state = invent_character.run(temperature=0, backend=engine)
    text = state["character"]
    try:
        jsonschema.validate(json.loads(text), CHARACTER_SCHEMA)
        verdict = "valid against the schema"
    except (ValueError, jsonschema.ValidationError) as e:  # printed, not hidden: the showcase is a check too
        verdict = f"INVALID: {e}"
    print(f"   {text}\n   ({verdict})")


def _chat(engine: Any) -> None:
    state = chat.run(turns=CHAT_TURNS, temperature=0, backend=engine)
    for message in state.messages()[1:]:  # [0] is the system prompt the model's template adds
        print(f"   {message['role']:>9}: {message['content'].strip()}")


def _stats_delta(before: dict[str, float], after: dict[str, float]) -> tuple[int, int, int]:
    """(requests, prompt tokens, cached tokens) between two engine.cache_stats() snapshots."""
    def delta(key: str) -> int:
        return int(after.get(key, 0) - before.get(key, 0))
    return delta("num_requests"), delta("prompt_tokens"), delta("cached_tokens")


def run_showcase(engine: Any) -> float:
    """Run the four programs on `engine`, print answers and statistics; returns the hit rate achieved."""
    info = engine.get_server_info()
    print(f"radixlm showcase: {info['model_path']} ({info['device']}, {info['dtype']}, "
          f"{info['num_threads']} threads)")
    before = engine.cache_stats()
    t0 = time.perf_counter()
    _section("few-shot classification with select (run_batch)", lambda: _few_shot(engine))
    _section("fork / join: one branch per tip", lambda: _fork_join(engine))
    _section("gen with a JSON schema", lambda: _json_schema(engine))
    _section("multi-turn chat", lambda: _chat(engine))
    requests, prompt_tokens, cached = _stats_delta(before, engine.cache_stats())
    hit_rate = cached / prompt_tokens if prompt_tokens else 0.0
    print(f"\n{requests} requests, {prompt_tokens} prompt tokens, {cached} served from the radix cache")
    print(f"cache hit rate: {hit_rate:.1%}  (total {time.perf_counter() - t0:.1f}s)")
    return hit_rate


def add_args(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)


def cmd_showcase(args: argparse.Namespace, engine: Any = None) -> int:
    if engine is not None:
        run_showcase(engine)
        return 0
    t0 = time.perf_counter()
    with sgl.Engine(args.model_path, **engine_options(args)) as owned:
        print(f"(model loaded in {time.perf_counter() - t0:.1f}s)")
        run_showcase(owned)
    return 0


def main(argv: list[str] | None = None, engine: Any = None) -> int:
    """`radixlm showcase [engine flags]`; `engine` runs the programs on an already loaded Engine."""
    parser = argparse.ArgumentParser(prog="radixlm showcase", description=__doc__.splitlines()[0])
    add_args(parser)
    return cmd_showcase(parser.parse_args(argv), engine)


if __name__ == "__main__":
    raise SystemExit(main())
