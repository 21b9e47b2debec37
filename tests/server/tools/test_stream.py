"""Streaming: deltas of growing text concatenate to the non-streamed message (content, tool calls with
their arguments growing chunk by chunk, reasoning), whatever the chunk boundaries."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from radixlm.constrained.base import GrammarOptions
from radixlm.runtime.config import GrammarConfig, ServerConfig
from radixlm.runtime.server.chat_agent import ChatAgent
from radixlm.runtime.server.reasoning import PARSERS, ReasoningStream
from radixlm.tools.plan import plan_tools
from tests.server.tools.conftest import TOOLS

TOKENIZER = SimpleNamespace(chat_template="{{ messages }}", added_tokens_decoder={}, all_special_tokens=["<|im_end|>"])
CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "calculator", "arguments": {"a": 2, "b": 3.5, "op": "*"}}\n</tool_call>')


def _chunks(text: str, seed: int) -> list[str]:
    rng, out, pos = random.Random(seed), [], 0
    while pos < len(text):
        pos = min(len(text), pos + rng.randint(1, 6))
        out.append(text[:pos])
    return out or [""]


def _agent(choice="auto", backend="llguidance", reasoning=None):
    return ChatAgent({"tools": TOOLS, "tool_choice": choice}, TOKENIZER,
                     ServerConfig(reasoning_parser=reasoning), GrammarConfig(grammar_backend=backend))


def _stream(agent, text, seed):
    stream, deltas = agent.stream(), []
    prefixes = _chunks(text, seed)
    for k, prefix in enumerate(prefixes):
        deltas += list(stream.feed(prefix, k == len(prefixes) - 1))
    return stream, deltas


def _assemble(deltas):
    content, reasoning, calls = "", "", {}
    for d in deltas:
        content += d.get("content", "")
        reasoning += d.get("reasoning_content", "")
        for call in d.get("tool_calls", []):
            slot = calls.setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
            slot["id"] = slot["id"] or call.get("id")
            fn = call.get("function", {})
            slot["name"] = slot["name"] or fn.get("name")
            slot["arguments"] += fn.get("arguments", "")
    return content, reasoning, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])  # constrained: incremental; else: whole
@pytest.mark.parametrize("prefix", ["", "Checking. "])
@pytest.mark.parametrize("seed", range(4))
def test_stream_equals_message(backend, prefix, seed):
    agent = _agent(backend=backend)
    text = prefix + CALLS
    message, reason = agent.tools.message(text, "stop")
    assert reason == "tool_calls"
    stream, deltas = _stream(agent, text, seed)
    content, _, calls = _assemble(deltas)
    assert content.strip() == (message["content"] or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert all(c["id"].startswith("call_") for c in calls)
    assert stream.finish_reason("stop") == "tool_calls"
    if backend == "llguidance":  # arguments grow over several deltas
        assert sum(1 for d in deltas for c in d.get("tool_calls", []) if "id" not in c) > 2


def test_partial_trigger_is_held_then_released():
    agent = _agent()
    _, deltas = _stream(agent, "a < b, and <tool", 0)
    assert _assemble(deltas)[0] == "a < b, and <tool"  # the end flushes what might have been a trigger


def test_invalid_arguments_stay_content_without_grammar():
    agent = _agent(backend="outlines")
    text = '<tool_call>\n{"name": "calculator", "arguments": {"a": "two"}}\n</tool_call>'
    message, reason = agent.tools.message(text, "stop")
    assert message == {"role": "assistant", "content": text} and reason == "stop"
    assert _assemble(_stream(agent, text, 1)[1])[0] == text


def test_required_on_other_backends_is_400():
    from radixlm.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as exc:
        plan_tools({"tools": TOOLS, "tool_choice": "required"}, TOKENIZER, "auto", "outlines", GrammarOptions())
    assert exc.value.param == "tool_choice"


@pytest.mark.parametrize("name,text,thought,content", [
    ("qwen3", "<think>\nThe user wants weather.\n</think>\n\nIt is sunny.", "The user wants weather.", "It is sunny."),
    ("qwen3", "It is sunny.", None, "It is sunny."),
    ("qwen3", "<think>still thinking", "still thinking", ""),
    ("deepseek-r1", "The user wants weather.</think>It is sunny.", "The user wants weather.", "It is sunny."),
    ("deepseek-r1", "<think>a</think>b", "a", "b"),
    ("deepseek-r1", "cut before the end", "cut before the end", ""),
])
def test_reasoning_split_and_stream(name, text, thought, content):
    parser = PARSERS[name]
    assert parser.split(text) == (thought, content)
    for seed in range(3):
        stream, got_thought, got_content = ReasoningStream(parser), "", ""
        prefixes = _chunks(text, seed)
        for k, prefix in enumerate(prefixes):
            delta, content_so_far = stream.feed(prefix, k == len(prefixes) - 1)
            got_thought += delta
        assert got_thought.strip() == (thought or "")
        assert content_so_far == content


def test_reasoning_then_tool_call_stream():
    agent = _agent(reasoning="qwen3")
    text = "<think>weather tool</think>\n" + CALLS
    choice = agent.finish_choice({"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"})
    assert choice["message"]["reasoning_content"] == "weather tool"
    assert choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) == 2
    _, deltas = _stream(agent, text, 2)
    content, reasoning, calls = _assemble(deltas)
    assert reasoning == "weather tool" and content == "" and len(calls) == 2
    assert json.loads(calls[1]["arguments"]) == {"a": 2, "b": 3.5, "op": "*"}
