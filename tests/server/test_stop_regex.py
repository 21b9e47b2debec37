"""stop_regex over HTTP: native /generate (streaming and not) and /v1 completions and chat, where it is
an extra body field (the `openai` client's extra_body), as in SGLang. On the shared server."""

from __future__ import annotations

import json
import re

import openai
import pytest

from .conftest import assert_healthy

GREEDY = {"max_new_tokens": 24, "temperature": 0}


def _pattern(text: str) -> str:
    """A regex (a character class, not a plain string) that first matches 4 characters mid-text."""
    return re.escape(text[8:11]) + "."


def test_native_generate_streaming_and_not(client, server):
    full = client.post("/generate", json={"text": "The quick", "sampling_params": GREEDY}).json()["text"]
    pattern = _pattern(full)
    expected = full[: re.search(pattern, full).start()]
    body = {"text": "The quick", "sampling_params": {**GREEDY, "stop_regex": [pattern]}}
    res = client.post("/generate", json=body).json()
    assert res["text"] == expected
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    with client.stream("POST", "/generate", json={**body, "stream": True}) as stream:
        texts = [json.loads(l[6:])["text"] for l in stream.iter_lines() if l.startswith("data: {")]
    assert texts[-1] == expected and all(expected.startswith(t) for t in texts), texts
    bad = client.post("/generate", json={"text": "x", "sampling_params": {"stop_regex": ["(unclosed"]}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop_regex"
    assert_healthy(server)


def test_v1_completions_take_stop_regex_as_an_extra_field(oai, model, server):
    base = oai.completions.create(model=model, prompt="The quick", max_tokens=24, temperature=0).choices[0].text
    pattern = _pattern(base)
    expected = base[: re.search(pattern, base).start()]
    res = oai.completions.create(model=model, prompt="The quick", max_tokens=24, temperature=0,
                                 extra_body={"stop_regex": [pattern]})
    assert res.choices[0].text == expected and res.choices[0].finish_reason == "stop"
    streamed = oai.completions.create(model=model, prompt="The quick", max_tokens=24, temperature=0, stream=True,
                                      extra_body={"stop_regex": [pattern]})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=model, prompt="x", max_tokens=2, extra_body={"stop_regex": ["["]})
    assert_healthy(server)


def test_v1_chat_takes_stop_regex_as_an_extra_field(oai, model, server):
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=24,
                  temperature=0)
    base = oai.chat.completions.create(**kwargs).choices[0].message.content
    pattern = _pattern(base)
    expected = base[: re.search(pattern, base).start()]
    res = oai.chat.completions.create(**kwargs, extra_body={"stop_regex": pattern})
    assert res.choices[0].message.content == expected and res.choices[0].finish_reason == "stop"
    streamed = oai.chat.completions.create(**kwargs, stream=True, extra_body={"stop_regex": [pattern]})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected
    assert_healthy(server)
