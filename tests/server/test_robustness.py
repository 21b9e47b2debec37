"""robustness.md on the shared server: every bad request gets the right status and the error envelope,
and afterwards the invariants hold (idle pools, same pids, health 200, byte-identical canary)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import ADMIN_KEY, LONG_CONTEXT, TENANT_KEYS, assert_healthy

TOO_LONG = int(LONG_CONTEXT[1]) + 100  # prompt tokens past the test servers' context

INTERNALS = re.compile(r"Traceback|\.py\b|/(tmp|home|root|usr|work)/|radixlm\.")  # no paths or internals
G = "/generate"
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def gen(**sampling):
    return {"text": "hello", "sampling_params": {"max_new_tokens": 2, **sampling}}


def chat(**fields):
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


def _deep_schema(depth: int) -> str:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return json.dumps(schema)


UNSATISFIABLE = json.dumps({"type": "object", "allOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]},
                                                      {"properties": {"a": {"const": 2}}}]})

# (path, json body, expected status, expected param or None)
JSON_CASES = [
    # types
    (G, {"text": 5}, 400, "text"),
    (G, gen(max_new_tokens="5"), 400, "max_new_tokens"),
    (G, gen(max_new_tokens=5.0), 400, "max_new_tokens"),
    (G, gen(max_new_tokens=True), 400, "max_new_tokens"),
    (G, {"sampling_params": {"max_new_tokens": 2}}, 400, "text"),
    (G, {"text": "a", "input_ids": [1], "sampling_params": {}}, 400, "text"),
    (G, gen(bogus_key=1), 400, "bogus_key"),
    (G, {**gen(), "stream": "yes"}, 400, "stream"),
    (CHAT, chat(messages=[]), 400, "messages"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages"),
    (CHAT, chat(messages=[{"role": ["user"], "content": "x"}]), 400, "messages"),  # unhashable roles
    (CHAT, chat(messages=[{"role": {"name": "user"}, "content": "x"}]), 400, "messages"),
    (CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]), 400, "messages"),
    (CHAT, chat(model="gpt-nope"), 404, "model"),
    (COMP, {"prompt": "hi", "max_tokens": "3"}, 400, "max_tokens"),
    (COMP, {"prompt": [], "max_tokens": 3}, 400, "prompt"),
    # sampling ranges: at the boundary is fine (see test_boundaries_accepted), just past it is not
    (G, gen(temperature=2.0001), 400, "temperature"),
    (G, gen(temperature=-0.1), 400, "temperature"),
    (G, gen(top_p=0), 400, "top_p"),
    (G, gen(top_p=1.01), 400, "top_p"),
    (G, gen(top_k=0), 400, "top_k"),
    (G, gen(top_k=-2), 400, "top_k"),
    (G, gen(min_p=1.01), 400, "min_p"),
    (G, gen(presence_penalty=2.01), 400, "presence_penalty"),
    (G, gen(frequency_penalty=-2.01), 400, "frequency_penalty"),
    (G, gen(repetition_penalty=0), 400, "repetition_penalty"),
    (G, gen(repetition_penalty=2.01), 400, "repetition_penalty"),
    (G, gen(n=17), 400, "n"),
    (G, gen(n=10**6), 400, "n"),
    (G, gen(n=0), 400, "n"),
    (G, gen(max_new_tokens=2**63), 400, "max_new_tokens"),
    (G, gen(max_new_tokens=-1), 400, "max_new_tokens"),
    (G, gen(min_new_tokens=5, max_new_tokens=2), 400, "min_new_tokens"),
    (G, gen(stop=["x"] * 17), 400, "stop"),
    (G, gen(stop=["x" * 257]), 400, "stop"),
    (G, gen(stop_token_ids=[10**6]), 400, "stop_token_ids"),
    (G, gen(logit_bias={"1000000": 1.0}), 400, "logit_bias"),
    (G, {**gen(), "return_logprob": True, "top_logprobs_num": 21}, 400, "top_logprobs_num"),
    # grammars (compiled in the scheduler's grammar workers; failures come back as 400s)
    (G, gen(regex="a" * 5000), 400, "regex"),
    (G, gen(regex="a+", json_schema="{}"), 400, "json_schema"),
    (G, gen(regex="("), 400, "regex"),
    (G, gen(json_schema="not json"), 400, "json_schema"),
    (G, gen(json_schema="[1, 2]"), 400, "json_schema"),
    (G, gen(json_schema=json.dumps({"$ref": "http://example.com/s.json"})), 400, "json_schema"),
    (G, gen(json_schema=json.dumps({"$ref": "#/$defs/missing"})), 400, "json_schema"),
    (G, gen(json_schema=_deep_schema(40)), 400, "json_schema"),
    (G, gen(json_schema=UNSATISFIABLE), 400, "json_schema"),
    (G, gen(json_schema="{" * 70000), 400, "json_schema"),
    (G, gen(json_schema=json.dumps({"enum": ["x" * 1000] * 1100})), 400, "json_schema"),  # over 1 MiB
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}),
     400, "json_schema"),
    (COMP, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    (COMP, {"prompt": "hi", "max_tokens": 2, "logprobs": 21}, 400, "logprobs"),
    (CHAT, chat(top_logprobs=21, logprobs=True), 400, "top_logprobs"),
    (CHAT, chat(n=17), 400, "n"),
    # prompts
    (G, {"text": "", "sampling_params": {}}, 400, "text"),
    (G, {"input_ids": [], "sampling_params": {}}, 400, "input_ids"),
    (G, {"input_ids": [-1, 2], "sampling_params": {}}, 400, "input_ids"),
    (G, {"input_ids": [10**6], "sampling_params": {}}, 400, "input_ids"),
    (G, {"input_ids": [1] * TOO_LONG, "sampling_params": {"max_new_tokens": 1}}, 400, "max_new_tokens"),
    (G, {"text": "x" * ((1 << 20) + 1), "sampling_params": {}}, 400, "text"),
    (CHAT, chat(messages=[{"role": "user", "content": "x" * ((1 << 20) + 1)}]), 400, "messages"),
    (CHAT, chat(messages=[{"role": "user", "content": "word " * TOO_LONG}]), 400, "max_tokens"),
]


@pytest.mark.parametrize("path,body,status,param", JSON_CASES)
def test_bad_json_requests(client, server, path, body, status, param):
    res = client.post(path, json=body)
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    assert not INTERNALS.search(err["message"])
    assert res.headers["x-request-id"]
    assert_healthy(server)


RAW_CASES = [
    (b"not json", {}, 400),
    (b"[1, 2]", {}, 400),
    (b'"text"', {}, 400),
    (b'{"text": "\xff\xfe", "sampling_params": {}}', {}, 400),
    (b"[" * 100_000 + b"]" * 100_000, {}, 400),
    (b'{"text": "a", "sampling_params": {"temperature": NaN}}', {}, 400),
    (b'{"text": "a", "sampling_params": {"temperature": Infinity}}', {}, 400),
    (b'{"text": "a"}', {"content-type": "multipart/form-data; boundary=x"}, 400),
    (b"", {}, 400),
]


@pytest.mark.parametrize("body,headers,status", RAW_CASES)
def test_transport_errors(client, server, body, headers, status):
    for path in (G, CHAT):
        res = client.post(path, content=body, headers={"content-type": "application/json", **headers})
        assert res.status_code == status and res.json()["error"]["type"] == "invalid_request_error"
    assert_healthy(server)


def test_body_limit_with_and_without_content_length(client, server):
    big = b'{"text": "' + b"a" * (9 << 20) + b'"}'
    res = client.post(G, content=big, headers={"content-type": "application/json"})
    assert res.status_code == 413 and res.json()["error"]["code"] == "body_too_large"

    def chunks():  # no Content-Length: chunked transfer encoding
        yield b'{"text": "'
        for _ in range(10):
            yield b"a" * (1 << 20)
        yield b'"}'

    res = client.post(G, content=chunks(), headers={"content-type": "application/json"})
    assert res.status_code == 413 and len(res.headers.get_list("x-request-id")) == 1
    assert_healthy(server)


def test_wrong_method_and_unknown_route(client, server):
    for res, status in ((client.get(G), 405), (client.post("/no/such/route", json={}), 404),
                        (client.delete("/v1/models"), 405)):
        assert res.status_code == status and res.json()["error"]["message"]
    assert_healthy(server)


def test_boundaries_accepted(client, server):
    edge = gen(temperature=2.0, top_p=1.0, top_k=-1, min_p=1.0, presence_penalty=2.0, frequency_penalty=-2.0,
               repetition_penalty=2.0, n=16, stop=["x" * 256] * 16)
    res = client.post(G, json=edge)
    assert res.status_code == 200 and len(res.json()) == 16
    assert client.post(G, json={**gen(), "return_logprob": True, "top_logprobs_num": 20}).status_code == 200
    assert client.post(G, json={"input_ids": [1] * 510, "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    assert_healthy(server)


def test_grammars_are_enforced_and_bad_ones_fail_alike_under_concurrency(client, server):
    res = client.post(G, json=gen(regex="(yes|no)", temperature=0, max_new_tokens=8)).json()
    assert res["text"] in ("yes", "no")
    unsupported = gen(json_schema=UNSATISFIABLE)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: client.post(G, json=unsupported).status_code, range(24)))
    assert statuses == [400] * 24
    message = client.post(G, json=unsupported).json()["error"]["message"]
    assert "const" in message and "#/properties/a" in message  # names the keyword and where
    # Streaming too: headers wait for the first event, so a refused request still gets its status.
    assert client.post(G, json={**gen(regex="("), "stream": True}).status_code == 400
    bad_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}
    res = client.post(CHAT, json=chat(stream=True, response_format=bad_format))
    assert res.status_code == 400 and res.json()["error"]["param"] == "json_schema"
    assert_healthy(server)


TYPE_CASES = [  # (path, body, param, message): msgspec's type errors, named by field, in the envelope
    (G, gen(temperature="hot"), "temperature", "`temperature`: Expected `float`, got `str`"),
    (G, {"text": "a", "sampling_params": [{"max_new_tokens": True}]}, "max_new_tokens",
     "`max_new_tokens`: Expected `int`, got `bool`"),
    (G, gen(bogus_key=1), "bogus_key", "`bogus_key`: unknown field"),
    (G, {"text": ["a", 3]}, "text", "`text[1]`: Expected `str`, got `int`"),
    (CHAT, chat(temperature="hot"), "temperature", "`temperature`: Expected `float`, got `str`"),
    (CHAT, chat(messages="hi"), "messages", "`messages`: Expected `array`, got `str`"),
    (COMP, {"prompt": "hi", "max_tokens": 2, "stream_options": 1}, "stream_options",
     "`stream_options`: Expected `object`, got `int`"),
]


@pytest.mark.parametrize("path,body,param,message", TYPE_CASES)
def test_type_errors_name_the_field(client, path, body, param, message):
    res = client.post(path, json=body)
    assert res.status_code == 400, res.text
    assert res.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                    "code": "invalid_type"}}


def test_unknown_v1_fields_ignored(client, server):
    assert client.post(COMP, json={"prompt": "hi", "max_tokens": 2, "made_up": {"x": 1}}).status_code == 200
    assert client.post(CHAT, json=chat(another_unknown=[1, 2])).status_code == 200


# ---- auth -----------------------------------------------------------------------------------------
ROUTES = [("GET", "/get_model_info"), ("POST", G), ("GET", "/v1/models"), ("POST", CHAT), ("GET", "/metrics"),
          ("GET", "/server_info"), ("POST", "/flush_cache"), ("GET", "/health_generate"), ("POST", "/abort_request"),
          ("GET", "/debug/invariants"), ("GET", "/no-such-route"), ("GET", "/openapi.json"), ("GET", "/docs")]


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_needs_a_key(server, method, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TENANT_KEYS[0]}"}):
        res = httpx.request(method, server.url + path, headers=headers, json={}, timeout=10)
        assert res.status_code == 401 and res.json()["error"]["type"] == "authentication_error"
        assert len(res.headers.get_list("x-request-id")) == 1  # one id, however many middlewares answer
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("raw_path", [b"//health", b"/Health", b"/health/", b"/health/../get_model_info",
                                      b"/./get_model_info", b"/%2Fhealth", b"/health%2F..%2Fget_model_info"])
def test_path_tricks_do_not_bypass_auth(server, raw_path):
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET " + raw_path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.split(b" ")[1] == b"401", reply[:200]


def test_debug_endpoint_is_admin_only(server):
    res = httpx.get(server.url + "/debug/invariants", headers=server.headers(TENANT_KEYS[0]), timeout=10)
    assert res.status_code == 403
    assert httpx.get(server.url + "/debug/invariants", headers=server.headers(ADMIN_KEY), timeout=10).json()["ok"]


def test_tenants_never_share_cache(server):
    body = {"text": "A secret prompt only tenant A has sent so far, long enough to cache.",
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    with server.client(TENANT_KEYS[0]) as a, server.client(TENANT_KEYS[1]) as b:
        a.post(G, json=body)
        again = a.post(G, json=body).json()["meta_info"]["cached_tokens"]
        other = b.post(G, json={**body, "namespace": "", "rid": None}).json()["meta_info"]["cached_tokens"]
        chat_b = b.post(CHAT, json=chat()).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert again > 0 and other == 0 and chat_b >= 0
    assert_healthy(server)
