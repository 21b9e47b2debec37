"""Speculative decoding under grammars (tiny random model): drafts are cut at the first token the grammar
refuses, every verified position is sampled under the grammar's mask, jump-forward composes; outputs
validate and greedy outputs equal the plain engine's."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm.runtime.engine import Engine

REGEX = r"(The item (red|green|blue) costs [1-9][0-9]? dollars\. ){2,4}"
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "minItems": 2, "maxItems": 4, "items": {
    "type": "object", "properties": {"name": {"enum": ["red", "green"]}, "n": {"enum": [1, 2, 3]}},
    "required": ["name", "n"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False}
PROMPTS = ["The item red costs 3 dollars. The item", "JSON:"]


def run(engine, params):
    return [engine.generate(p, params) for p in PROMPTS]


@pytest.mark.parametrize("jump_forward", [True, False])
def test_grammar_outputs_validate_and_equal_plain(tiny_llama_dir, jump_forward):
    cases = [{"max_new_tokens": 300, "temperature": 0, "regex": REGEX},
             {"max_new_tokens": 300, "temperature": 0, "json_schema": json.dumps(SCHEMA)}]
    results = {}
    for name, spec in (("plain", {}), ("spec", {"speculative_algorithm": "NGRAM"})):
        with Engine(str(tiny_llama_dir), max_total_tokens=4096, grammar_num_workers=1,
                    disable_jump_forward=not jump_forward, **spec) as eng:
            results[name] = [run(eng, p) for p in cases]
            results[name + "_again"] = [run(eng, p) for p in cases]  # drafts from the cached outputs
            if spec:
                assert eng.scheduler.spec.stats.num_accepted > 0
                sampled = [eng.generate(p, {**cases[0], "max_new_tokens": 300, "temperature": 1.0, "sampling_seed": i})
                           for i, p in enumerate(PROMPTS)]
                assert all(re.fullmatch(REGEX, r["text"]) for r in sampled), [r["text"] for r in sampled]
            eng.check_integrity()
    for name in ("plain", "spec", "spec_again"):
        regex_runs, json_runs = results[name]
        for r in regex_runs:
            assert re.fullmatch(REGEX, r["text"]), r["text"]
        for r in json_runs:
            jsonschema.validate(json.loads(r["text"]), SCHEMA)
    texts = {name: [[r["text"] for r in runs] for runs in results[name]] for name in results}
    assert texts["spec"] == texts["plain"] and texts["spec_again"] == texts["plain"]
