"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official `anthropic` client:
on the shared tiny-model server where the output does not matter (shapes, auth, errors, streaming, usage and
the radix cache), on the real SmolLM2 where it does (answers, stop reasons, tool calls in every tool_choice,
every returned tool input validated against its input_schema)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import pytest

from .conftest import TENANT_KEYS, ServerProcess, assert_healthy

A = TENANT_KEYS[0]
WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 24},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": False}}
CALCULATOR = {"name": "calculator", "description": "Compute a op b", "input_schema": {
    "type": "object", "properties": {"a": {"type": "number", "minimum": -1e6, "maximum": 1e6},
                                     "b": {"type": "number", "minimum": -1e6, "maximum": 1e6},
                                     "op": {"type": "string", "enum": ["+", "-", "*", "/"]}},
    "required": ["a", "b", "op"], "additionalProperties": False}}
TOOLS = [WEATHER, CALCULATOR]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris? Also, what is 12 times 7?"}]


def _client(url: str, key: str = A) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=300)


def _sampling(kw: dict) -> dict:
    """The client's create() no longer names the sampling fields: they go in extra_body (the server reads them)."""
    extra = {k: kw.pop(k) for k in ("temperature", "top_p", "top_k", "seed") if k in kw}
    return {**kw, "extra_body": extra} if extra else kw


def _tool_uses(msg) -> list:
    return [b for b in msg.content if b.type == "tool_use"]


def _validated(msg) -> int:
    """Every finished tool_use input validates against its tool's schema (the number of those); a call cut by
    max_tokens (the last block) holds the arguments written so far. The stop reason says whether there are calls."""
    uses = _tool_uses(msg)
    cut = uses[-1:] if msg.stop_reason == "max_tokens" else []
    for use in uses:
        assert use.id.startswith("toolu_")
        if use in cut:
            assert set(use.input) <= set(SCHEMAS[use.name]["properties"]), use
        else:
            jsonschema.validate(use.input, SCHEMAS[use.name])
    assert (msg.stop_reason == "tool_use") == bool(uses) or msg.stop_reason == "max_tokens", msg
    return len(uses) - len(cut)


def _comparable(msg) -> dict:
    """A message without what differs between two runs of one request (ids, cache hits)."""
    content = [{k: v for k, v in b.model_dump().items() if k != "id"} for b in msg.content]
    return {"content": content, "stop_reason": msg.stop_reason, "stop_sequence": msg.stop_sequence,
            "output_tokens": msg.usage.output_tokens, "model": msg.model}


def _error_shape(body: dict, kind: str) -> None:
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"], body


# ---- the tiny-model server: shapes, auth, errors -------------------------------------------------
@pytest.fixture(scope="module")
def claude(server):
    return _client(server.url)


@pytest.fixture(scope="module")
def model(server):
    return httpx.get(server.url + "/v1/models", headers=server.headers(), timeout=10).json()["data"][0]["id"]


def test_create_shape_multi_turn_and_count_tokens(claude, model):
    messages = [*ASK, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "18 C"}]},
            {"type": "text", "text": "And the product?", "cache_control": {"type": "ephemeral"}}]}]
    kw = {"model": model, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
          "messages": messages, "tools": TOOLS}
    msg = claude.messages.create(max_tokens=8, metadata={"user_id": "u1"}, **_sampling({"temperature": 0, **kw}))
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use") and msg.usage.output_tokens <= 8
    assert all(b.type in ("text", "tool_use") for b in msg.content)
    usage = msg.usage
    counted = claude.messages.count_tokens(**kw).input_tokens
    assert counted == usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    without_tools = claude.messages.count_tokens(model=model, messages=messages, system=kw["system"])
    assert 0 < without_tools.input_tokens < counted  # the tool prompt is part of the rendering


def test_repeated_long_prompt_reads_the_cache(claude, model):
    system = "You are a meticulous assistant. " * 60
    kw = {"model": model, "system": system, "max_tokens": 2,
          "messages": [{"role": "user", "content": "Summarise the rules above."}]}
    first = claude.messages.create(**kw)
    second = claude.messages.create(**kw)
    total = claude.messages.count_tokens(model=model, system=system, messages=kw["messages"]).input_tokens
    assert second.usage.cache_read_input_tokens > total // 2, second.usage
    for msg in (first, second):
        assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == total
        assert msg.usage.cache_creation_input_tokens == 0


def test_stream_events_and_final_message_equal_create(claude, server, model):
    kw = {"model": model, "max_tokens": 12, "messages": ASK, "extra_body": {"temperature": 0}}
    with claude.messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and "message_delta" in events
    assert _comparable(final) == _comparable(claude.messages.create(**kw))
    raw = {k: v for k, v in kw.items() if k != "extra_body"}
    with httpx.stream("POST", server.url + "/v1/messages", json={**raw, "stream": True, "temperature": 0},
                      headers={"x-api-key": A, "anthropic-version": "2023-06-01"}, timeout=60) as res:
        lines = [line for line in res.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert len(names) == len([line for line in lines if line.startswith("data: ")])  # one data line per event


def test_x_api_key_bearer_and_wrong_key(server, model):
    kw = {"model": model, "max_tokens": 2, "messages": ASK}
    assert _client(server.url).messages.create(**kw).content is not None  # x-api-key
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=A, max_retries=0, timeout=60)
    assert bearer.messages.count_tokens(model=model, messages=ASK).input_tokens > 0
    for call in (lambda c: c.messages.create(**kw), lambda c: c.messages.count_tokens(model=model, messages=ASK)):
        with pytest.raises(anthropic.AuthenticationError) as err:
            call(_client(server.url, "wrong-key"))
        assert err.value.status_code == 401
        _error_shape(err.value.body, "authentication_error")
    res = httpx.post(server.url + "/v1/messages", json=kw, timeout=10)  # no key at all
    assert res.status_code == 401 and res.headers["x-request-id"]
    _error_shape(res.json(), "authentication_error")


BAD_REQUESTS = [
    ({"messages": ASK}, "max_tokens"),  # max_tokens is required, as on Anthropic's API
    ({"max_tokens": "8", "messages": ASK}, "max_tokens"),
    ({"max_tokens": 0, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "image"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "tool_use_id"),
    ({"max_tokens": 8, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"max_tokens": 8, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
     "nope"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"name": "f", "input_schema": "object"}]}, "input_schema"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash"),
    ({"max_tokens": 8, "messages": ASK, "temperature": -1}, "temperature"),
    ({"max_tokens": 8, "messages": ASK, "stop_sequences": "END"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": ASK, "system": [{"type": "image"}]}, "system"),
    ({"max_tokens": 10 ** 12, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": ASK, "top_k": -5}, "top_k"),
    ({"max_tokens": 8, "messages": ASK, "thinking": "yes"}, "thinking"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "any"},
      "tools": [{"name": "f", "input_schema": {"type": "object", "$ref": "http://x"}}]}, "$ref"),
]


@pytest.mark.parametrize("body, mentioned", BAD_REQUESTS)
def test_bad_requests_are_anthropic_400s(server, model, body, mentioned):
    with pytest.raises(anthropic.BadRequestError) as err:
        _client(server.url).post("/v1/messages", body={"model": model, **body}, cast_to=object)
    assert err.value.status_code == 400
    _error_shape(err.value.body, "invalid_request_error")
    assert mentioned in err.value.body["error"]["message"], err.value.body


def test_transport_errors_on_messages_paths_are_anthropic_shaped(server):
    headers = {"x-api-key": A, "content-type": "application/json"}
    url = server.url + "/v1/messages"
    cases = [(httpx.post(url, content=b"{not json", headers=headers, timeout=10), 400, "invalid_request_error"),
             (httpx.post(url + "/count_tokens", content=b"[1]", headers=headers, timeout=10), 400,
              "invalid_request_error"),
             (httpx.post(url, content=b'{"messages": "' + b"a" * (9 << 20) + b'"}', headers=headers, timeout=30),
              413, "request_too_large"),
             (httpx.get(url, headers=headers, timeout=10), 405, "invalid_request_error"),
             (httpx.post(url + "/batches/x", json={}, headers=headers, timeout=10), 404, "not_found_error")]
    for res, status, kind in cases:
        assert res.status_code == status, res.text
        _error_shape(res.json(), kind)
        assert res.json()["request_id"] in res.headers["x-request-id"]
    with pytest.raises(anthropic.NotFoundError) as err:
        _client(server.url).messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=ASK)
    _error_shape(err.value.body, "not_found_error")
    other = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", headers=headers, timeout=10)
    assert other.status_code == 400 and other.json()["error"]["code"] == "invalid_json"  # OpenAI shape kept
    assert_healthy(server)


def test_a_prefill_is_continued(claude, model):
    kw = {"model": model, "max_tokens": 6}
    asked = claude.messages.count_tokens(model=model, messages=ASK).input_tokens
    prefilled = [*ASK, {"role": "assistant", "content": "The weather"}]
    assert claude.messages.count_tokens(model=model, messages=prefilled).input_tokens > asked
    msg = claude.messages.create(messages=prefilled, **kw)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens > asked


def test_listed_in_openapi(server):
    spec = httpx.get(server.url + "/openapi.json", headers=server.headers(), timeout=10).json()
    for path, schema in (("/v1/messages", "MessagesBody"), ("/v1/messages/count_tokens", "MessagesCountBody")):
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/" + schema)
    body = spec["components"]["schemas"]["MessagesBody"]
    assert {"messages", "max_tokens"} <= set(body["required"])
    assert {"system", "tools", "tool_choice", "stop_sequences", "stream"} <= set(body["properties"])


# ---- the real SmolLM2: answers, stop reasons, tool calls -----------------------------------------
@pytest.fixture(scope="module")
def smol():
    srv = ServerProcess(None, "--served-model-name", "smollm2", "--grammar-backend", "llguidance",
                        "--num-threads", "1").wait_ready()
    yield _client(srv.url)
    srv.stop()
    srv.remove_tmpdir()


def _create(smol, **kw):
    return smol.messages.create(model="smollm2", **_sampling({"messages": ASK, "max_tokens": 64, "temperature": 0,
                                                                **kw}))


@pytest.mark.slow
def test_smol_answers_with_and_without_system(smol):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    plain = _create(smol, messages=question, max_tokens=24)
    assert plain.content[0].type == "text" and "Paris" in plain.content[0].text
    assert plain.stop_reason in ("end_turn", "max_tokens")
    system = [{"type": "text", "text": "You are a pirate."}, {"type": "text", "text": "Answer like one."}]
    pirate = _create(smol, messages=question, max_tokens=24, system=system)
    assert pirate.content[0].type == "text" and pirate.content[0].text
    counted = [smol.messages.count_tokens(model="smollm2", messages=question, **kw).input_tokens
               for kw in ({}, {"system": system})]
    assert counted[0] == plain.usage.input_tokens + plain.usage.cache_read_input_tokens
    assert counted[1] == pirate.usage.input_tokens + pirate.usage.cache_read_input_tokens != counted[0]


@pytest.mark.slow
def test_smol_stop_sequence_and_max_tokens(smol):
    kw = {"messages": [{"role": "user", "content": "List five fruits, separated by commas."}], "max_tokens": 40}
    full = _create(smol, **kw).content[0].text
    word = full.split()[2]
    cut = _create(smol, stop_sequences=["@@never@@", word], **kw)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", word)
    assert cut.content[0].text == full[:full.index(word)]
    short = _create(smol, **{**kw, "max_tokens": 3})
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3 and short.stop_sequence is None


@pytest.mark.slow
@pytest.mark.parametrize("choice", [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "calculator"},
                                    {"type": "none"}], ids=["auto", "any", "tool", "none"])
def test_smol_tool_choices(smol, choice):
    msgs = [_create(smol, tools=TOOLS, tool_choice=choice, temperature=0.8, seed=k, max_tokens=48) for k in range(2)]
    for msg in msgs:
        calls = _validated(msg)
        if choice["type"] in ("any", "tool"):
            assert msg.stop_reason == "tool_use" and calls >= 1
            assert choice["type"] != "tool" or {u.name for u in _tool_uses(msg)} == {"calculator"}
        if choice["type"] == "none":
            assert calls == 0 and msg.content[0].type == "text"
    single = _create(smol, tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert _validated(single) == 1


@pytest.mark.slow
def test_smol_sampled_tool_inputs_always_validate(smol):
    """>= 50 sampled calls (temperature 1, a seed each): every tool_use input validates against its schema."""
    prompts = ["What is the weather in Tokyo?", "Compute 3.5 minus 8.", "Is it raining in Lima, in fahrenheit?",
               "Multiply 41 by 9.", "Weather for Oslo please.", "Divide 100 by 7."]

    def ask(k: int):
        choice = {"type": "any"} if k % 2 else {"type": "tool", "name": "calculator"}
        return _create(smol, messages=[{"role": "user", "content": prompts[k % len(prompts)]}], tools=TOOLS,
                       tool_choice={**choice, "disable_parallel_tool_use": True}, max_tokens=72, temperature=1.0,
                       top_p=0.95, seed=k)

    with ThreadPoolExecutor(12) as pool:
        msgs = list(pool.map(ask, range(60)))
    validated = sum(_validated(m) for m in msgs)
    assert all(m.stop_reason in ("tool_use", "max_tokens") for m in msgs)
    assert validated >= 50, validated


@pytest.mark.slow
def test_smol_tool_loop_multi_turn(smol):
    first = _create(smol, tools=TOOLS, tool_choice={"type": "tool", "name": "calculator"})
    (use,) = _tool_uses(first)
    result = {"result": 84}
    messages = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": json.dumps(result)}]}]
    second = _create(smol, messages=messages, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=32)
    assert second.content[0].type == "text" and second.content[0].text
    assert second.stop_reason in ("end_turn", "max_tokens")
    failed = [*messages[:-1], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                             "content": "division by zero", "is_error": True}]}]
    assert _create(smol, messages=failed, tools=TOOLS, max_tokens=16).content


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}},
                                {"tools": TOOLS, "tool_choice": {"type": "auto"}}], ids=["text", "tool", "auto"])
def test_smol_stream_equals_create(smol, kw):
    with smol.messages.stream(model="smollm2", messages=ASK, max_tokens=64, extra_body={"temperature": 0},
                              **kw) as stream:
        json_pieces = sum(1 for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        final = stream.get_final_message()
    assert _comparable(final) == _comparable(_create(smol, **kw))
    if kw.get("tool_choice", {}).get("type") == "tool":
        assert final.stop_reason == "tool_use" and json_pieces >= 2  # the input streams as it grows
        _validated(final)
