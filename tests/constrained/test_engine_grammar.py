"""Constrained decoding through the engine: outputs always satisfy the spec, jump-forward saves forward
passes, bad grammars fail with a 400-class error while the engine keeps serving."""

from __future__ import annotations

import json
import re
import threading

import pytest

from radixlm.errors import InvalidRequestError
from radixlm.runtime.engine import Engine
from tests.constrained.corpus.schemas import REGEXES, SCHEMAS, check_output

BOUNDED_REGEXES = {k: v for k, v in REGEXES.items() if k != "repeat_group"}  # (ab)+ may run to length


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=8192, grammar_num_workers=1) as eng:
        yield eng
        eng.check_integrity()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_outputs_always_match(engine, temperature):
    names = list(BOUNDED_REGEXES)
    params = [{"max_new_tokens": 64, "temperature": temperature, "sampling_seed": i, "regex": BOUNDED_REGEXES[n]}
              for i, n in enumerate(names)]
    res = engine.generate(["Answer:"] * len(names), params)
    for name, r in zip(names, res):
        assert r["meta_info"]["finish_reason"]["type"] == "stop", (name, r)
        assert re.fullmatch(BOUNDED_REGEXES[name], r["text"]), (name, r["text"])
    engine.check_integrity()


def test_seeded_constrained_sampling_ignores_the_batch(engine):
    """A seeded, sampled, constrained request (its rows settled from allowed-id lists) gives the same
    tokens alone and next to other rows (free, greedy-constrained, unseeded constrained): its draws depend
    only on its seed."""
    mine = {"max_new_tokens": 32, "temperature": 1.0, "top_p": 0.9, "sampling_seed": 42,
            "regex": BOUNDED_REGEXES["email"]}
    alone = engine.generate("Answer:", mine)["output_ids"]
    others = [{"max_new_tokens": 32, "temperature": 0.8, "sampling_seed": 3},
              {"max_new_tokens": 32, "temperature": 0.0, "regex": BOUNDED_REGEXES["unicode_words"]},
              {"max_new_tokens": 32, "temperature": 1.0, "regex": "[a-z ]{4,40}"}]  # unseeded: global draws
    batch = engine.generate(["Answer:", "Other:", "Words:", "Text:"], [mine, *others])
    assert batch[0]["output_ids"] == alone
    assert re.fullmatch(BOUNDED_REGEXES["email"], batch[0]["text"])
    engine.check_integrity()


def test_choices_pick_one_of_them(engine):
    choices = ["red", "green", "blue sky", "blue"]
    for seed in range(4):
        r = engine.generate("Color:", {"choices": choices, "temperature": 1.0, "sampling_seed": seed})
        assert r["text"] in choices


def test_json_schema_output_validates(engine):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    r = engine.generate("JSON:", {"max_new_tokens": 40, "temperature": 0, "json_schema": json.dumps(schema)})
    import jsonschema

    jsonschema.validate(json.loads(r["text"]), schema)


def test_jump_forward_saves_forward_passes(tiny_llama_dir):
    regex = r"The answer is (yes|no)\. Thank you for asking\."
    steps, texts = {}, {}
    for jf in (False, True):
        with Engine(str(tiny_llama_dir), max_total_tokens=2048, disable_jump_forward=not jf,
                    grammar_num_workers=1) as eng:
            before = eng.scheduler.num_forward_steps
            r = eng.generate("Q:", {"max_new_tokens": 64, "temperature": 0, "regex": regex})
            steps[jf] = eng.scheduler.num_forward_steps - before
            texts[jf] = r["text"]
            assert (r["meta_info"].get("jump_forward_tokens", 0) > 0) == jf
            eng.check_integrity()
    assert all(re.fullmatch(regex, t) for t in texts.values()), texts
    assert steps[True] < steps[False] / 2, steps


def test_streaming_with_jump_forward_only_grows(engine):
    regex = r"\{\"name\": \"(Ann|Bob)\", \"age\": [1-9][0-9]\}"
    full = engine.generate("P:", {"max_new_tokens": 40, "temperature": 0, "regex": regex})
    chunks = [c["text"] for c in engine.generate("P:", {"max_new_tokens": 40, "temperature": 0, "regex": regex},
                                                  stream=True)]
    assert all(b.startswith(a) for a, b in zip(chunks, chunks[1:]))
    assert chunks[-1] == full["text"] and re.fullmatch(regex, full["text"])


@pytest.mark.parametrize("params, param, code", [
    ({"regex": "(unclosed"}, "regex", "invalid_grammar"),
    ({"json_schema": "{not json"}, "json_schema", "invalid_grammar"),
    ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"$ref": "http://x/y.json"}}})},
     "json_schema", "invalid_grammar"),
    ({"json_schema": json.dumps({"type": "strnig"})}, "json_schema", "invalid_grammar"),
])
def test_bad_grammar_is_a_clear_error_and_others_keep_running(engine, params, param, code):
    result: dict = {}

    def other():
        result["text"] = engine.generate("Hello", {"max_new_tokens": 8, "temperature": 0})["text"]

    t = threading.Thread(target=other)
    t.start()
    with pytest.raises(InvalidRequestError) as info:
        engine.generate("x", {"max_new_tokens": 8, **params})
    t.join(timeout=60)
    assert info.value.param == param and info.value.code == code
    assert "text" in result
    engine.check_integrity()


@pytest.mark.slow
@pytest.mark.parametrize("jump_forward", [True, False])
def test_smollm2_corpus_always_valid(jump_forward):
    """Every schema and regex of the corpus on the real model: outputs validate; jump-forward counted."""
    specs = [("json_schema", n) for n in SCHEMAS] + [("regex", n) for n in REGEXES]
    with Engine(None, max_total_tokens=32768, disable_jump_forward=not jump_forward) as eng:
        tok = eng.tokenizer
        prompts, params = [], []
        for kind, name in specs:
            spec = json.dumps(SCHEMAS[name]) if kind == "json_schema" else REGEXES[name]
            ask = f"Give one short example of {name.replace('_', ' ')} as {'JSON' if kind == 'json_schema' else 'text'}."
            prompts.append(tok.apply_chat_template([{"role": "user", "content": ask}], tokenize=False,
                                                   add_generation_prompt=True))
            # Greedy decoding of a 135M model loops inside unbounded numbers/arrays/strings ("1000000...");
            # a mild repetition penalty lets most such outputs end. The grammar guarantees validity either
            # way; what a length cut leaves is a valid prefix.
            params.append({"max_new_tokens": 256, "temperature": 0, "repetition_penalty": 1.3, kind: spec})
        before = eng.scheduler.num_forward_steps
        res = eng.generate(prompts, params)
        steps = eng.scheduler.num_forward_steps - before
        truncated = []
        for (kind, name), r in zip(specs, res):
            if r["meta_info"]["finish_reason"]["type"] == "length":
                truncated.append(name)  # a 135M model can loop inside an unbounded array or string
                continue
            check_output(kind, name, r["text"])
        print("cut by max_new_tokens:", truncated)
        # llguidance (the default) also allows keys the schemas do not list (JSON Schema's default), where
        # the model may loop in a free string: a few more cuts than with outlines' listed-keys-only grammars.
        assert len(truncated) <= len(specs) // 5, truncated
        forced = sum(r["meta_info"].get("jump_forward_tokens", 0) for r in res)
        assert (forced > 0) == jump_forward
        eng.check_integrity()
    print(f"jump_forward={jump_forward}: {steps} forward steps, {forced} forced tokens")


def test_finished_json_outputs_report_validation(engine):
    """meta_info says whether a finished json_schema output validates; a cut output is reported, not
    passed off as valid; requests without a schema get no such field."""
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["n"], "additionalProperties": False})
    done = engine.generate("JSON:", {"json_schema": schema, "max_new_tokens": 64, "temperature": 0})
    assert done["meta_info"]["finish_reason"]["type"] == "stop"
    assert done["meta_info"]["json_schema_valid"] is True and "json_schema_error" not in done["meta_info"]
    cut = engine.generate("JSON:", {"json_schema": schema, "max_new_tokens": 2, "temperature": 0})
    assert cut["meta_info"]["finish_reason"]["type"] == "length"
    assert cut["meta_info"]["json_schema_valid"] is False
    assert cut["meta_info"]["json_schema_error"].startswith("incomplete")
    stream = list(engine.generate("JSON:", {"json_schema": schema, "max_new_tokens": 64, "temperature": 0},
                                  stream=True))
    assert "json_schema_valid" not in stream[0]["meta_info"] or len(stream) == 1
    assert stream[-1]["meta_info"]["json_schema_valid"] is True
    free = engine.generate("Text:", {"max_new_tokens": 2})
    assert "json_schema_valid" not in free["meta_info"]
    engine.check_integrity()
