"""Tool-call parsers on outputs in each family's syntax (as Qwen2.5, Hermes, Llama 3.2 and Mistral write
them), malformed text included: it must come back as plain content, never raise."""

from __future__ import annotations

import json

import pytest

from radixlm.tools.parsers import fallback, hermes, llama3, mistral
from radixlm.tools.parsers.base import content_outside
from radixlm.tools.parsers.registry import family_for, resolve

QWEN25 = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "calculator", "arguments": {"a": 2, "b": 3, "op": "+"}}\n</tool_call>')
HERMES_WITH_TEXT = ('Let me check that for you.\n<tool_call>\n{"arguments": {"city": "Tokyo"}, "name": "get_weather"}'
                    '\n</tool_call>')
LLAMA32 = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA31_TAG = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "calculator", ' \
              '"parameters": {"a": 1, "b": 2, "op": "*"}}'
MISTRAL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "calculator", ' \
          '"arguments": {"a": 4, "b": 2, "op": "/"}}]'

MALFORMED = [
    "",
    "The weather in Paris is sunny.",
    "<tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",  # cut
    "<tool_call>\nnot json at all\n</tool_call>",
    "<tool_call>\n{\"arguments\": {}}\n</tool_call>",  # no name
    "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": [1, 2]}\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing junk </tool_call>",
    "[TOOL_CALLS][{\"name\": \"f\"",
    "[TOOL_CALLS]{}",
    "[1, 2, 3]",
    "{\"name\": \"f\", \"parameters\": {}} and then some text",
    "<|python_tag|>print('hi')",
    "{\"name\": \"f\"}",
    "\x00\ud7ff<tool_call>\ue000",
]


def test_hermes_qwen25_parallel_calls():
    calls = hermes.parse(QWEN25)
    assert [c.name for c in calls] == ["get_weather", "calculator"]
    assert json.loads(calls[0].arguments) == {"city": "Paris", "unit": "celsius"}
    assert calls[1].arguments == '{"a": 2, "b": 3, "op": "+"}'  # the model's own text, byte for byte
    assert content_outside(QWEN25, calls) == ""


def test_hermes_keeps_text_and_any_key_order():
    calls = hermes.parse(HERMES_WITH_TEXT)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Tokyo"})]
    assert content_outside(HERMES_WITH_TEXT, calls) == "Let me check that for you."


def test_hermes_stringified_arguments():
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
    assert [(c.name, json.loads(c.arguments)) for c in hermes.parse(text)] == [("f", {"x": 1})]


def test_llama3_plain_and_python_tag():
    assert [(c.name, json.loads(c.arguments)) for c in llama3.parse(LLAMA32)] == [("get_weather", {"city": "Paris"})]
    calls = llama3.parse(LLAMA31_TAG)
    assert [c.name for c in calls] == ["get_weather", "calculator"]
    assert content_outside(LLAMA31_TAG, calls) == ""


def test_mistral_array_with_and_without_tag():
    calls = mistral.parse(MISTRAL)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome"}), ("calculator", {"a": 4, "b": 2, "op": "/"})]
    assert content_outside(MISTRAL, calls) == ""
    bare = MISTRAL[len("[TOOL_CALLS]"):]
    assert [c.name for c in mistral.parse(bare)] == ["get_weather", "calculator"]
    assert content_outside("Sure. " + MISTRAL, mistral.parse("Sure. " + MISTRAL)) == "Sure."


def test_fallback_reads_every_family():
    for text, first in ((QWEN25, "get_weather"), (MISTRAL, "get_weather"), (LLAMA32, "get_weather")):
        assert fallback.parse(text)[0].name == first


@pytest.mark.parametrize("module", [hermes, llama3, mistral, fallback])
@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_text_is_plain_content(module, text):
    calls = module.parse(text)
    assert calls == [] or all(isinstance(json.loads(c.arguments), dict) for c in calls)
    if text in ("", "The weather in Paris is sunny."):
        assert calls == []
    assert isinstance(content_outside(text, calls), str)


def test_registry_picks_family_from_template():
    assert family_for("auto", "{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert family_for("auto", "...[TOOL_CALLS]...") == "mistral"
    assert family_for("auto", "...<|python_tag|>...") == "llama3"
    assert family_for("auto", "no tool syntax") == "fallback"
    assert family_for("qwen25", None) == "qwen25"
    assert resolve("qwen25", None)[0].trigger == "<tool_call>"
    with pytest.raises(ValueError):
        family_for("nope", None)
