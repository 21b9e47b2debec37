"""JSON-schema and EBNF requests through the real Engine: the llguidance backend end to end (compiled in
worker processes, masks and jump-forward in the scheduler), and `ebnf` on the default outlines backend."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm.errors import InvalidRequestError
from radixlm.runtime.engine import Engine
from radixlm.runtime.server.bodies import CompletionBody, decode_body
from radixlm.runtime.server.openai_format import sampling_params

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["ok", "n", "tags"], "additionalProperties": False}
GBNF = 'root ::= "answer: " ("yes" | "no") ", score " [0-9]{1,2}\n'
LARK = 'start: "answer: " CHOICE ", score " /[0-9]{1,2}/\nCHOICE: "yes" | "no"\n'
LANGUAGE = r"answer: (yes|no), score [0-9]{1,2}"
RECURSIVE = 'root ::= item\nitem ::= "(" item ")" | "x"\n'


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=8192, grammar_num_workers=1, grammar_backend="llguidance") as eng:
        yield eng
        eng.check_integrity()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(engine, temperature):
    params = [{"max_new_tokens": 64, "temperature": temperature, "sampling_seed": i, "json_schema": json.dumps(SCHEMA)}
              for i in range(4)]
    for r in engine.generate(["JSON:"] * 4, params):
        assert r["meta_info"]["finish_reason"]["type"] == "stop", r
        jsonschema.validate(json.loads(r["text"]), SCHEMA)
        assert r["meta_info"].get("jump_forward_tokens", 0) > 0  # `{"ok": ` and the like are forced
    engine.check_integrity()


@pytest.mark.parametrize("spec", [GBNF, LARK, RECURSIVE], ids=["gbnf", "lark", "recursive"])
def test_ebnf_outputs_match(engine, spec):
    params = [{"max_new_tokens": 48, "temperature": 1.0, "sampling_seed": i, "ebnf": spec} for i in range(3)]
    for r in engine.generate(["Q:"] * 3, params):
        if spec is RECURSIVE:
            if r["meta_info"]["finish_reason"]["type"] == "length":  # nesting can run to the token limit
                assert re.fullmatch(r"\(*x?\)*", r["text"]), r["text"]
                continue
            depth = r["text"].index("x")
            assert r["text"] == "(" * depth + "x" + ")" * depth
        else:
            assert re.fullmatch(LANGUAGE, r["text"]), r["text"]
    engine.check_integrity()


def test_bad_ebnf_is_a_clear_error(engine):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate("x", {"max_new_tokens": 8, "ebnf": 'root ::= ("a"'})
    assert (info.value.param, info.value.code) == ("ebnf", "invalid_grammar")
    assert engine.generate("x", {"max_new_tokens": 4, "temperature": 0})["text"] is not None


def test_ebnf_on_the_default_backend(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, grammar_num_workers=1) as eng:
        r = eng.generate("Q:", {"max_new_tokens": 48, "temperature": 0, "ebnf": GBNF})
        assert re.fullmatch(LANGUAGE, r["text"]), r["text"]
        # Recursion (a context-free language): a finished text is balanced; a random tiny model may keep
        # opening until max_new_tokens, and what it leaves is then a prefix of a balanced text.
        for seed in range(4):
            nested = eng.generate("Q:", {"max_new_tokens": 32, "temperature": 1.0, "sampling_seed": seed,
                                         "ebnf": RECURSIVE})
            text, depth = nested["text"], nested["text"].count("(")
            if nested["meta_info"]["finish_reason"]["type"] == "stop":
                assert text == "(" * depth + "x" + ")" * depth, text
            else:
                assert re.fullmatch(r"\(*(x\)*)?", text) and text.count(")") <= depth, text
        eng.check_integrity()


def test_openai_requests_pass_ebnf_through():
    body = decode_body(json.dumps({"ebnf": GBNF}).encode(), CompletionBody)  # as the /v1 route decodes it
    assert sampling_params(body, 16)["ebnf"] == GBNF
