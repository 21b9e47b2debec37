"""gen(..., tools=[...]) in a @function program: on the in-process Engine (llguidance backend, the tiny
random model: the grammar alone guarantees the calls) the calls come back as dicts in meta_info and the
program loops over them; bad tools fail at the program line.

The engine tests use tools whose arguments have bounded spellings: a JSON number's fraction and a string's
escapes have no length bound, and the random model, sampling, wrote digits until max_tokens cut the call
(seen in CI)."""

from __future__ import annotations

import json

import jsonschema
import pytest

import radixlm as sgl
from radixlm.lang.tools import parse_tool_calls, tools_prompt
from tests.server.tools.conftest import TOOLS

INT = {"type": "integer", "minimum": -999, "maximum": 999}
BOUNDED_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,24}$"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
BOUNDED_CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Compute a op b",
    "parameters": {"type": "object", "properties": {"a": INT, "b": INT, "op": {"enum": ["+", "-", "*", "/"]}},
                   "required": ["a", "b", "op"], "additionalProperties": False}}}
BOUNDED = [BOUNDED_WEATHER, BOUNDED_CALCULATOR]
BOUNDED_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}


@pytest.fixture(scope="module")
def llg_engine(tiny_llama_dir):
    from radixlm.runtime.engine import Engine

    eng = Engine(model_path=str(tiny_llama_dir), grammar_backend="llguidance")
    yield eng
    eng.shutdown()


@sgl.function
def tool_loop(s, question):
    s += "Question: " + question + "\n"  # the tiny model's context is short: no tool prompt
    s += sgl.gen("call", tools=BOUNDED, tool_choice="required", max_tokens=160, temperature=0.7)
    for call in s.get_meta_info("call")["tool_calls"]:
        s += f"\n<tool_response>\n{json.dumps({'name': call['name'], 'ok': True})}\n</tool_response>\n"
    s += "Answer: " + sgl.gen("answer", max_tokens=8, tools=BOUNDED, tool_choice="none")


def test_tool_loop_on_the_engine(llg_engine):
    states = tool_loop.run_batch([{"question": q} for q in ("weather in Paris?", "2 + 3?", "7 / 2?")],
                                 backend=llg_engine)
    total = 0
    for state in states:
        calls = state.get_meta_info("call")["tool_calls"]
        assert calls, state["call"]
        for call in calls:
            assert call["id"].startswith("call_") and isinstance(call["arguments"], dict)
            jsonschema.validate(call["arguments"], BOUNDED_SCHEMAS[call["name"]])
        total += len(calls)
        assert state.get_meta_info("answer")["tool_calls"] == []
        assert "<tool_response>" in state.text()
    assert total >= 3


def test_named_choice_on_the_engine(llg_engine):
    @sgl.function
    def named(s):
        s += "Compute something.\n" + sgl.gen("c", tools=BOUNDED, max_tokens=160,
                                             tool_choice={"type": "function", "function": {"name": "calculator"}})

    calls = named.run(backend=llg_engine, temperature=0).get_meta_info("c")["tool_calls"]  # greedy: one outcome
    assert calls and {c["name"] for c in calls} == {"calculator"}


def test_bad_tools_fail_at_the_program_line():
    from radixlm.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        sgl.gen("x", tools=[{"type": "function", "function": {"name": "bad name"}}])
    with pytest.raises(InvalidRequestError):
        sgl.gen("x", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "missing"}})


def test_tools_prompt_lists_the_tools():
    prompt = tools_prompt(TOOLS)
    assert "<tools>" in prompt and '"name": "calculator"' in prompt and "<tool_call>" in prompt


def test_parse_keeps_only_valid_calls():
    text = ('<tool_call>\n{"name": "calculator", "arguments": {"a": 1, "b": 2, "op": "+"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calculator", "arguments": {"a": "x"}}\n</tool_call>')
    calls = parse_tool_calls(text, TOOLS, "auto")
    assert [(c["name"], c["arguments"]) for c in calls] == [("calculator", {"a": 1, "b": 2, "op": "+"})]


def test_text_after_the_call_ends_the_gen(llg_engine):
    """A logit bias pushes the model to write `T`: inside the call the grammar keeps the call valid, after it
    the `T` ends the gen at once (trimmed), leaving one call instead of more forced by the grammar."""
    bias = {llg_engine.tokenizer.encode("T", add_special_tokens=False)[0]: 40.0}

    @sgl.function
    def one(s):
        s += "Q: weather?\n" + sgl.gen("call", tools=BOUNDED, tool_choice="required", max_tokens=160, temperature=0,
                                      logit_bias=bias)

    state = one.run(backend=llg_engine)
    meta = state.get_meta_info("call")
    assert state["call"].endswith("</tool_call>") and len(meta["tool_calls"]) == 1, state["call"]
    assert meta["finish_reason"]["type"] == "stop", meta["finish_reason"]
