"""/v1/responses (OpenAI's Responses API) through the official `openai` client and the OpenAI Agents SDK: the
request runs the chat pipeline (same prompt, same greedy output as /v1/chat/completions), tool calls and
json_schema outputs validate against their schemas over many sampled requests, the typed stream parses in
the client, stored responses continue (with a radix-cache hit) per tenant, and every mistake is a 400/404
in OpenAI's error shape. Pure translation units first, then the shared tiny-model server, then SmolLM2."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from radixlm.errors import InvalidRequestError
from radixlm.runtime.config import GrammarConfig, ServerConfig
from radixlm.runtime.server.bodies import ResponsesBody
from radixlm.runtime.server.chat_agent import ChatAgent
from radixlm.runtime.server.errors import APIError
from radixlm.runtime.server.responses_format import (chat_tool_choice, chat_tools, echo_fields, response_format,
                                                     to_messages)
from radixlm.runtime.server.responses_output import OutputBuilder, message_deltas, response_object
from radixlm.runtime.server.responses_store import ResponseStore, StoredResponse

from .conftest import TENANT_KEYS, ServerProcess, assert_healthy

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": False}}
CALCULATOR = {"type": "function", "name": "calculator", "description": "Compute a op b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999},
                                     "b": {"type": "integer", "minimum": -999, "maximum": 999},
                                     "op": {"type": "string", "enum": ["+", "-", "*", "/"]}},
    "required": ["a", "b", "op"], "additionalProperties": False}}
TOOLS = [WEATHER, CALCULATOR]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
EVENTS = TypeAdapter(ResponseStreamEvent)


# ---- translation units (no server) ------------------------------------------------------------------
def test_items_become_chat_messages():
    items = [{"role": "developer", "content": "be terse"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                             {"type": "input_text", "text": "b"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hm"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\": 1}"},
             {"type": "function_call_output", "call_id": "c2", "output": "42"}]
    assert to_messages(items) == [
        {"role": "system", "content": "be terse"}, {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "hm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "42", "name": "g"}]


@pytest.mark.parametrize("items, words", [
    ([{"type": "web_search_call"}], "input[0]: items of type 'web_search_call'"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "input[0].content[0]"),
    ([{"role": "tool", "content": "x"}], "input[0].role"),
    ([{"role": ["user"], "content": "x"}], "input[0].role"),  # unhashable: not a TypeError (a 500)
    ([{"role": {"r": 1}, "content": "x"}], "input[0].role"),
    ([{"type": "function_call", "call_id": "c", "name": "f"}], "input[0].arguments"),
    (["text"], "input[0] must be an object")])
def test_bad_items_are_named(items, words):
    with pytest.raises(InvalidRequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        to_messages(items)


def test_tools_choice_and_format_translate():
    assert chat_tools([WEATHER])[0]["function"] == {k: WEATHER[k] for k in ("name", "description", "parameters")}
    with pytest.raises(InvalidRequestError, match="unsupported tool types: file_search, web_search"):
        chat_tools([WEATHER, {"type": "web_search"}, {"type": "file_search"}])
    assert chat_tool_choice({"type": "function", "name": "f"}) == {"type": "function", "function": {"name": "f"}}
    assert chat_tool_choice("required") == "required"
    with pytest.raises(InvalidRequestError, match="'web_search_preview'"):
        chat_tool_choice({"type": "web_search_preview"})
    fmt = {"type": "json_schema", "name": "p", "schema": PERSON, "strict": True}
    assert response_format({"format": fmt}) == {"type": "json_schema", "json_schema": {
        "name": "p", "schema": PERSON, "strict": True}}
    assert response_format({"format": {"type": "json_object"}}) == {"type": "json_object"}
    assert response_format({"verbosity": "low"}) is None


def test_builder_events_and_items():
    builder = OutputBuilder(response_object("m", echo_fields(ResponsesBody(input="x"))))
    events = builder.opening()
    for delta in [{"reasoning_content": "hmm"}, {"content": "Hi"}, {"content": "!"},
                  {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "f", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": 1}"}}]}]:
        events += builder.feed(delta)
    meta = {"prompt_tokens": 5, "completion_tokens": 7, "cached_tokens": 2}
    events += builder.finish("tool_calls", meta)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        EVENTS.validate_python(event)  # every event in the client's own types, strictly
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "completed" and final.output_text == "Hi!"
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == "{\"a\": 1}" and final.output[2].call_id == "call_1"
    assert final.usage.total_tokens == 12 and final.usage.input_tokens_details.cached_tokens == 2
    again = OutputBuilder(response_object("m", {}))
    for delta in message_deltas({"content": "Hi!", "reasoning_content": "hmm", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}):
        again.feed(delta)
    again.finish("tool_calls", meta)
    strip = [{k: v for k, v in i.items() if k != "id"} for i in again.items]
    assert strip == [{k: v for k, v in i.items() if k != "id"} for i in builder.items]


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_parser_output_is_a_reasoning_item(stream):
    agent = ChatAgent({}, None, ServerConfig(reasoning_parser="qwen3"), GrammarConfig())
    builder = OutputBuilder(response_object("m", echo_fields(ResponsesBody(input="x"))))
    text = "<think>Paris is in France.</think>It is Paris."
    if stream:  # the text as it grows, through the chat layer's per-choice stream
        choice = agent.stream()
        for end in range(1, len(text) + 1):
            for delta in choice.feed(text[:end], end == len(text)):
                builder.feed(delta)
    else:
        message = agent.finish_choice({"message": {"role": "assistant", "content": text},
                                       "finish_reason": "stop"})["message"]
        for delta in message_deltas(message):
            builder.feed(delta)
    events = builder.finish("stop", {"prompt_tokens": 3, "completion_tokens": 9, "cached_tokens": 0}, 5)
    final = Response.model_validate(events[-1]["response"])
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "Paris is in France." and final.output_text == "It is Paris."
    assert final.usage.output_tokens_details.reasoning_tokens == 5


def test_builder_failure_events():
    builder = OutputBuilder(response_object("m", echo_fields(ResponsesBody(input="x"))))
    events = builder.opening() + builder.feed({"content": "Hi"})
    events += builder.fail(APIError(503, "the server is unhealthy", None, "server_unhealthy"))
    parsed = [EVENTS.validate_python(event) for event in events]
    assert [e.type for e in parsed[-2:]] == ["error", "response.failed"]
    assert parsed[-2].code == "server_unhealthy" and parsed[-1].response.status == "failed"
    assert parsed[-1].response.error.message == "the server is unhealthy"


def test_store_is_lru_and_tenant_scoped():
    store = ResponseStore(2)
    for rid in ("r1", "r2"):
        store.put("a", StoredResponse({"id": rid}, []))
    assert store.get("b", "r1") is None and store.get("a", "r1") is not None  # r1 now most recent
    store.put("a", StoredResponse({"id": "r3"}, []))
    assert store.get("a", "r2") is None and store.get("a", "r1") is not None and len(store) == 2
    assert not store.delete("b", "r1") and store.delete("a", "r1") and store.get("a", "r1") is None


def test_store_is_bounded_per_tenant_in_count_and_bytes():
    big = [{"type": "message", "content": "x" * 1000}]
    store = ResponseStore(3, max_bytes=3 * StoredResponse({"id": "r0"}, big).nbytes)
    for rid in ("r1", "r2", "r3"):
        store.put("a", StoredResponse({"id": rid}, big))
    store.put("b", StoredResponse({"id": "b1"}, big))  # another tenant evicts none of a's
    assert [store.get("a", r) is not None for r in ("r1", "r2", "r3")] == [True, True, True]
    store.put("a", StoredResponse({"id": "r4"}, big + big))  # two entries' bytes: the two oldest go
    assert store.get("a", "r1") is None and store.get("a", "r2") is None and store.get("a", "r4") is not None
    assert store.get("b", "b1") is not None
    store.put("a", StoredResponse({"id": "huge"}, big * 4))  # larger than the whole budget: not kept
    assert store.get("a", "huge") is None and store.get("a", "r4") is not None


# ---- the tiny-model server ------------------------------------------------------------------------
def _post(server, body, key=TENANT_KEYS[0]):
    return httpx.post(server.url + "/v1/responses", json=body, headers=server.headers(key), timeout=120)


def _calls(response):
    """The function calls of a response, each checked against its tool's schema."""
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        assert call.call_id and call.id and call.status == "completed"
    return calls


def _sampled(oai, model, seeds, max_output_tokens=200, **kw):
    """One request per seed, sampled at temperature 1 (one after the other: the outputs are what is checked)."""
    return [oai.responses.create(model=model, temperature=1, max_output_tokens=max_output_tokens,
                                 extra_body={"seed": seed}, **kw) for seed in seeds]


def test_string_input_is_the_chat_pipeline(server, oai, model):
    raw = _post(server, {"model": model, "input": "Hello there", "instructions": "Be brief", "temperature": 0,
                         "max_output_tokens": 12})
    assert raw.status_code == 200, raw.text
    res = Response.model_validate(raw.json())  # strict validation against the client's own model
    assert res.id.startswith("resp_") and res.object == "response" and res.model == model
    assert res.instructions == "Be brief" and res.store is True and res.tools == [] and res.tool_choice == "auto"
    chat = oai.chat.completions.create(model=model, temperature=0, max_tokens=12, messages=[
        {"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hello there"}])
    assert res.output_text == chat.choices[0].message.content
    assert res.usage.input_tokens == chat.usage.prompt_tokens
    assert res.usage.output_tokens == chat.usage.completion_tokens
    message = res.output[0]
    assert message.type == "message" and message.role == "assistant" and message.content[0].annotations == []


def test_items_input_renders_like_chat_messages(oai, model):
    items = [{"role": "developer", "content": "Answer in one word."},
             {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_7", "name": "get_weather",
              "arguments": "{\"city\": \"Paris\"}"},
             {"type": "function_call_output", "call_id": "call_7", "output": "sunny"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
             {"role": "user", "content": "And tomorrow?"}]
    res = oai.responses.create(model=model, input=items, instructions="You are terse.", tools=TOOLS,
                               tool_choice="none", temperature=0, max_output_tokens=10)
    chat = oai.chat.completions.create(model=model, temperature=0, max_tokens=10, tool_choice="none", messages=[
        {"role": "system", "content": "You are terse."}, {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_7", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny", "name": "get_weather"},
        {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And tomorrow?"}],
        tools=[{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
               for t in TOOLS])
    assert res.usage.input_tokens == chat.usage.prompt_tokens
    assert res.output_text == chat.choices[0].message.content
    assert not _calls(res) and [t.name for t in res.tools] == ["get_weather", "calculator"]


def test_required_tool_calls_validate(oai, model):
    responses = _sampled(oai, model, range(24), input="What is the weather?", tools=TOOLS, tool_choice="required")
    calls = [c for r in responses for c in _calls(r)]
    assert all(r.status == "completed" and _calls(r) for r in responses)
    assert len(calls) >= 24 and {c.name for c in calls} == {"get_weather", "calculator"}


def test_named_tool_calls_validate(oai, model):
    responses = _sampled(oai, model, range(100, 116), input="Add two numbers", tools=TOOLS,
                         tool_choice={"type": "function", "name": "calculator"}, parallel_tool_calls=False)
    for r in responses:
        assert r.status == "completed" and [c.name for c in _calls(r)] == ["calculator"]
        assert r.tool_choice.name == "calculator" and r.parallel_tool_calls is False


def test_auto_and_none_tool_choice(oai, model):
    for r in _sampled(oai, model, range(200, 206), 60, input="Hi", tools=TOOLS, tool_choice="auto"):
        _calls(r)  # a call the model makes under auto validates too
    for r in _sampled(oai, model, range(300, 304), 20, input="Hi", tools=TOOLS, tool_choice="none"):
        assert not _calls(r) and r.output[0].type == "message"


def test_json_schema_strict_output_validates(oai, model):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    for r in _sampled(oai, model, range(400, 408), input="A person as JSON", text=fmt):
        assert r.status == "completed" and r.text.format.name == "person"
        jsonschema.validate(json.loads(r.output_text), PERSON)
    for r in _sampled(oai, model, range(500, 502), input="JSON", text={"format": {"type": "json_object"}}):
        assert isinstance(json.loads(r.output_text), dict)


def test_stream_parses_in_the_client(oai, model):
    with oai.responses.stream(model=model, input="Tell me a story", temperature=0, max_output_tokens=16) as stream:
        events = list(stream)
    last = events[-1].response
    terminal = "response.completed" if last.status == "completed" else "response.incomplete"
    assert [e.type for e in events[:4]] == ["response.created", "response.in_progress", "response.output_item.added",
                                            "response.content_part.added"]
    assert [e.type for e in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                             "response.output_item.done", terminal]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert last.output_text == text and events[-2].item.content[0].text == text
    whole = oai.responses.create(model=model, input="Tell me a story", temperature=0, max_output_tokens=16)
    assert whole.output_text == text and whole.status == last.status
    assert oai.responses.retrieve(last.id).model_dump() == last.model_dump()


def test_stream_structured_output_in_the_client(oai, model):
    class Person(BaseModel):
        name: str = Field(max_length=10)
        age: int = Field(ge=0, le=120)

    for seed in (700, 701, 702):
        with oai.responses.stream(model=model, input="A person", text_format=Person, max_output_tokens=200,
                                  temperature=1, extra_body={"seed": seed}) as stream:
            final = stream.get_final_response()
        assert final.status == "completed" and isinstance(final.output_parsed, Person)


def test_stream_tool_calls_and_raw_events(server, oai, model):
    body = {"model": model, "input": "Weather?", "tools": TOOLS, "stream": True, "max_output_tokens": 200,
            "tool_choice": {"type": "function", "name": "get_weather"}, "temperature": 1}
    for seed in range(600, 612):
        with httpx.stream("POST", server.url + "/v1/responses", json={**body, "seed": seed},
                          headers=server.headers(), timeout=120) as res:
            assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in res.iter_lines() if line]
        names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
        events = [EVENTS.validate_python(json.loads(line[len("data: "):])) for line in lines
                  if line.startswith("data: ")]
        assert names == [e.type for e in events]
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert done and done[0].arguments == args
        final = events[-1]
        assert final.type == "response.completed", final
        assert [c.arguments for c in _calls(final.response)] == [args]
    with oai.responses.stream(model=model, input="Weather?", tools=TOOLS, max_output_tokens=200,
                              tool_choice={"type": "function", "name": "get_weather"}) as stream:
        final = stream.get_final_response()
    assert [c.name for c in _calls(final)] == ["get_weather"]


def test_previous_response_id_continues_with_a_cache_hit(oai, model):
    first = oai.responses.create(model=model, input="Hello there, tell me a story", instructions="Be brief",
                                 temperature=0, max_output_tokens=8)
    second = oai.responses.create(model=model, input="Go on", instructions="Be brief", temperature=0,
                                  previous_response_id=first.id, max_output_tokens=8)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1 > 0
    # The stored history is the whole conversation, rendered as if the client had sent it itself.
    explicit = oai.responses.create(model=model, instructions="Be brief", temperature=0, max_output_tokens=8,
                                    input=[{"role": "user", "content": "Hello there, tell me a story"},
                                           {"role": "assistant", "content": first.output_text},
                                           {"role": "user", "content": "Go on"}])
    assert explicit.usage.input_tokens == second.usage.input_tokens
    assert explicit.output_text == second.output_text


def test_stored_responses_are_per_tenant(server, oai, model):
    res = oai.responses.create(model=model, input="Hi", max_output_tokens=4, metadata={"k": "v"}, user="u1")
    assert oai.responses.retrieve(res.id).model_dump() == res.model_dump()
    assert res.metadata == {"k": "v"} and res.user == "u1"
    other = httpx.get(f"{server.url}/v1/responses/{res.id}", headers=server.headers(TENANT_KEYS[1]), timeout=30)
    assert other.status_code == 404 and other.json()["error"]["code"] == "response_not_found"
    cont = _post(server, {"model": model, "input": "x", "previous_response_id": res.id}, TENANT_KEYS[1])
    assert cont.status_code == 400 and cont.json()["error"]["code"] == "previous_response_not_found"
    assert httpx.delete(f"{server.url}/v1/responses/{res.id}", headers=server.headers(TENANT_KEYS[1]),
                        timeout=30).status_code == 404
    oai.responses.delete(res.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(res.id)
    unstored = oai.responses.create(model=model, input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)
    assert httpx.get(f"{server.url}/v1/responses/{res.id}", timeout=30).status_code == 401  # no key


def test_max_output_tokens_is_incomplete(oai, model):
    res = oai.responses.create(model=model, input="Tell me everything", max_output_tokens=3, temperature=0)
    assert res.status == "incomplete" and res.incomplete_details.reason == "max_output_tokens"
    assert res.usage.output_tokens == 3 and res.output[0].status == "incomplete"
    events = list(oai.responses.create(model=model, input="Tell me everything", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == \
        "max_output_tokens"


@pytest.mark.parametrize("body, status, param, code", [
    ({"input": "x", "previous_response_id": "resp_missing"}, 400, "previous_response_id",
     "previous_response_not_found"),
    ({"input": [{"type": "computer_call"}]}, 400, "input", "unsupported_item_type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400, "input",
     "unsupported_content_type"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools", "unsupported_tool_type"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "file_search"}}, 400, "tool_choice",
     "unsupported_tool_choice"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, 400, "tool_choice",
     None),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, 400, "input", None),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                    "arguments": "{bad"}]}, 400, "input", "invalid_value"),
    ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": "x"}]}, 400, "tools", None),
    ({"input": "x", "metadata": {"a": 1}}, 400, "metadata", "invalid_type"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens", None),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": 1}}}, 400, "text.format",
     None),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, 400, "text.format", None),
    ({"input": "x", "temperature": "hot"}, 400, "temperature", None),
    ({"input": []}, 400, "input", None),
    ({"input": "x", "background": True}, 400, "background", "unsupported_parameter"),
    ({"input": "x", "model": "gpt-4o"}, 404, "model", "model_not_found")])
def test_bad_requests_are_openai_errors(server, body, status, param, code):
    res = _post(server, body)
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    if code is not None:
        assert err["code"] == code


def test_errors_and_dropped_streams_leave_the_server_healthy(server, model):
    assert _post(server, {"input": [{"type": "item_reference", "id": "x"}]}).status_code == 400
    body = {"model": model, "input": "Go", "stream": True, "max_output_tokens": 60000, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, headers=server.headers(), timeout=120) as res:
        deltas = 0
        for line in res.iter_lines():
            deltas += line.startswith("event: response.output_text.delta")
            if deltas == 3:
                break  # the client goes away mid-answer: the request is aborted, its KV freed
    assert deltas == 3
    assert_healthy(server)


def test_openapi_lists_the_routes(server):
    spec = httpx.get(server.url + "/openapi.json", headers=server.headers(), timeout=30).json()
    body = spec["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    props = spec["components"]["schemas"][body.rsplit("/", 1)[1]]["properties"]
    assert {"input", "instructions", "tools", "tool_choice", "text", "previous_response_id", "store"} <= set(props)
    assert {"get", "delete"} <= set(spec["paths"]["/v1/responses/{response_id}"])


# ---- the OpenAI Agents SDK ------------------------------------------------------------------------
def _run_agent(base_url: str, model: str, **agent_kw):
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    ran: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome", "Tokyo"]) -> str:
        """The current weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    async def both():
        set_tracing_disabled(True)
        set_default_openai_client(openai.AsyncOpenAI(base_url=base_url, api_key=TENANT_KEYS[0], max_retries=0,
                                                     timeout=300), use_for_tracing=False)
        settings = ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=200)
        agent = Agent(name="weather", instructions="Answer with the weather tool.", model=model,
                      tools=[get_weather], model_settings=settings, **agent_kw)
        plain = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        streamed = Runner.run_streamed(agent, "What is the weather in Rome?", max_turns=4)
        kinds = [event.type async for event in streamed.stream_events()]
        return plain, streamed, kinds

    plain, streamed, kinds = asyncio.run(both())
    return ran, plain, streamed, kinds


def test_openai_agents_sdk_runs_the_tool(server, model):
    ran, plain, streamed, kinds = _run_agent(server.url + "/v1", model, tool_use_behavior="stop_on_first_tool")
    assert len(ran) == 2 and all(city in ("Paris", "Rome", "Tokyo") for city in ran)
    assert plain.final_output == f"sunny in {ran[0]}" and streamed.final_output == f"sunny in {ran[1]}"
    assert streamed.is_complete and "raw_response_event" in kinds and "run_item_stream_event" in kinds


# ---- SmolLM2: where the words matter ----------------------------------------------------------------
@pytest.fixture(scope="module")
def smol():
    srv = ServerProcess(None, "--served-model-name", "smollm2", "--num-threads", "1").wait_ready()
    yield srv
    srv.stop()
    srv.remove_tmpdir()


@pytest.mark.slow
def test_smollm2_answers_and_continues(smol):
    oai = openai.OpenAI(base_url=smol.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=300)
    first = oai.responses.create(model="smollm2", input="What is the capital of France?", temperature=0,
                                 max_output_tokens=24)
    assert "Paris" in first.output_text
    with oai.responses.stream(model="smollm2", input="What is the capital of France?", temperature=0,
                              max_output_tokens=24) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert deltas == first.output_text
    second = oai.responses.create(model="smollm2", input="And of Italy?", previous_response_id=first.id,
                                  temperature=0, max_output_tokens=24)
    assert "Rome" in second.output_text
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1


@pytest.mark.slow
def test_smollm2_agent_uses_the_tool_result(smol):
    ran, plain, streamed, _ = _run_agent(smol.url + "/v1", "smollm2")
    assert ran == ["Paris", "Rome"]  # the city each question named
    # After the tool, tool_choice resets to auto and the model answers from the tool's result.
    assert "sunny in Paris" in plain.final_output and "sunny in Rome" in streamed.final_output
    assert [type(item).__name__ for item in plain.new_items] == ["ToolCallItem", "ToolCallOutputItem",
                                                                  "MessageOutputItem"]
