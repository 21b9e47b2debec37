"""`--reasoning-parser qwen3` on the real SmolLM2 (llguidance backend): outputs without a thought block keep
their content, and constraints (response_format, tools) still hold with the optional thought in front of
their grammar. Splitting real `<think>` blocks is covered by test_stream.py (the same ChatAgent code)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.conftest import TENANT_KEYS, ServerProcess
from tests.server.tools.conftest import SCHEMAS, TOOLS

pytestmark = pytest.mark.slow
MODEL = "smollm2"
ASK = [{"role": "user", "content": "Give me a city and its country as JSON."}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "country": {"type": "string", "maxLength": 20}},
          "required": ["city", "country"], "additionalProperties": False}


@pytest.fixture(scope="module")
def oai():
    srv = ServerProcess(None, "--served-model-name", MODEL, "--grammar-backend", "llguidance", "--num-threads", "1",
                        "--reasoning-parser", "qwen3").wait_ready()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=300)
    srv.stop()
    srv.remove_tmpdir()


def test_plain_chat_keeps_content(oai):
    res = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=16, temperature=0)
    msg = res.choices[0].message
    assert msg.content and getattr(msg, "reasoning_content", None) is None
    chunks = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=16, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content


def test_response_format_after_optional_thought(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
    res = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=48, temperature=0.7, n=4, seed=2,
                                      response_format=fmt)
    for choice in res.choices:
        details = choice.model_extra["finish_details"]
        if choice.finish_reason == "length":
            continue
        assert details == {"json_schema_valid": True}, details
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_tools_after_optional_thought(oai):
    res = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}],
                                      tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                      max_tokens=64, temperature=0)
    choice = res.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
