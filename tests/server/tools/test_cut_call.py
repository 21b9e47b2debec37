"""A forced tool call cut by max_tokens: the non-streamed message carries the calls streaming sends (the last
one partial) with finish_reason "length", never the raw call markup as content."""

from __future__ import annotations

import json

import pytest

from tests.server.tools.conftest import TOOLS
from tests.server.tools.test_stream import CALLS, _agent, _assemble, _stream

NAMED = {"type": "function", "function": {"name": "calculator"}}


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_cut_message_equals_the_stream_at_every_cut(choice):
    agent = _agent(choice)
    start = CALLS.index("<tool_call>") + len("<tool_call>")
    for cut in range(start, len(CALLS)):
        text = CALLS[:cut]
        message, reason = agent.tools.message(text, "length")
        assert reason == "length" and message["content"] is None, (text, message)
        _, deltas = _stream(agent, text, cut)
        streamed = [(c["name"], c["arguments"]) for c in _assemble(deltas)[2]]
        got = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert got == streamed, text
        assert all(c["id"].startswith("call_") for c in message.get("tool_calls", []))


def test_cut_after_free_text_keeps_the_text_as_content():
    agent = _agent("auto")
    text = "Let me check. " + CALLS[:60]
    message, reason = agent.tools.message(text, "length")
    assert message["content"] == "Let me check." and reason == "length"
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"


def test_forced_call_cut_by_max_tokens_over_http(client):
    body = {"messages": [{"role": "user", "content": "Compute 2 times 3."}], "tools": TOOLS,
            "tool_choice": NAMED, "max_tokens": 48, "temperature": 0}
    plain = client.post("/v1/chat/completions", json=body)
    assert plain.status_code == 200, plain.text
    choice = plain.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None, choice
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "calculator" and call["id"].startswith("call_")
    events = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as res:
        for line in res.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    _, _, [streamed] = _assemble(deltas)
    assert (streamed["name"], streamed["arguments"]) == (call["function"]["name"], call["function"]["arguments"])
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_anthropic_blocks_keep_a_cut_call():
    """/v1/messages reads the same message: the cut call stays an (incomplete) tool_use block, never a 500."""
    from radixlm.runtime.server.anthropic_format import content_blocks

    message, _ = _agent("required").tools.message(CALLS[:60], "length")  # inside the arguments
    [block] = content_blocks(message)
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and block["input"] == {}
