"""Abusive grammars against the shared tiny-model server: none of them holds another request's output or
the HTTP loop, and what a backend cannot run is a 400 naming the field (not a 200 that aborts)."""

from __future__ import annotations

import json
import threading

import pytest

from tests.constrained.test_abuse_limits import HOSTILE, exponential_schema
from tests.server.conftest import assert_healthy

PLAIN = {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


def _plain_requests_complete(server, n: int = 3) -> None:
    with server.client(timeout=60) as c:
        for _ in range(n):
            res = c.post("/generate", json=PLAIN)
            assert res.status_code == 200, res.text
        assert c.get("/health").status_code == 200


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(res=fn()), daemon=True)
    thread.start()
    return thread, box


@pytest.mark.timeout(300)
def test_a_backtracking_pattern_holds_no_other_output(server):
    """The grammar widens the look-around, so the output is 40 `a`s, which the ECMA engine would backtrack
    on for hours; the check stops at the deadline and the output is reported unchecked."""
    body = {"text": "a", "sampling_params": {"max_new_tokens": 64, "temperature": 0, "json_schema": HOSTILE}}
    with server.client(timeout=120) as c:
        thread, box = _in_thread(lambda: c.post("/generate", json=body))
        _plain_requests_complete(server)
        thread.join(150)
    res = box["res"]
    assert res.status_code == 200, res.text
    meta = res.json()["meta_info"]
    assert res.json()["text"] == json.dumps("a" * 40)
    assert meta["json_schema_valid"] is None and meta["json_schema_error"].startswith("unchecked")


@pytest.mark.timeout(300)
def test_tool_arguments_check_is_bounded(server):
    """The same pattern in a tool's parameters: the check that decides whether the text is a call runs in
    the HTTP process's check workers, not on its event loop; the grammar made the call, so it stands."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": json.loads(HOSTILE)}, "required": ["s"]}}}
    body = {"messages": [{"role": "user", "content": "call f"}], "max_tokens": 400,
            "temperature": 0, "tools": [tool], "tool_choice": "required"}
    with server.client(timeout=120) as c:
        thread, box = _in_thread(lambda: c.post("/v1/chat/completions", json=body))
        _plain_requests_complete(server)
        thread.join(150)
    res = box["res"]
    assert res.status_code == 200, res.text
    choice = res.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"  # the whole call was written, then checked
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "f" and json.loads(call["arguments"]) == {"s": "a" * 40}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("route, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                              "tool_choice": "required", "tools": [{"type": "function", "function": {
                                  "name": "f", "parameters": exponential_schema()}}]}, "tools"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4, "structural_tag": {
        "type": "structural_tag", "triggers": ["<f>"],
        "structures": [{"begin": "<f>", "schema": exponential_schema(), "end": "</f>"}]}}}, "structural_tag"),
])
def test_exponential_schema_lowering_is_a_400_at_the_deadline(server, route, body, param):
    """Lowering an allOf of 16 anyOfs takes minutes: it runs in the compile worker, which is stopped at the
    compile deadline, while plain requests go on."""
    with server.client(timeout=120) as c:
        thread, box = _in_thread(lambda: c.post(route, json=body))
        _plain_requests_complete(server)
        thread.join(150)
    res = box["res"]
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert (error["param"], error["code"]) == (param, "grammar_timeout")


@pytest.mark.parametrize("params, param, code", [
    ({"ebnf": "root ::= " + " | ".join(f'"w{i}"' for i in range(20000))}, "ebnf", "grammar_too_large"),
    ({"ebnf": "root ::= root"}, "ebnf", "invalid_grammar"),
    ({"json_schema": json.dumps({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                 "$ref": "#/$defs/a"})}, "json_schema", "invalid_grammar"),
])
def test_grammars_the_backend_cannot_run_are_400(server, params, param, code):
    with server.client(timeout=120) as c:
        res = c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 8, **params}})
    assert res.status_code == 400, res.text
    assert (res.json()["error"]["param"], res.json()["error"]["code"]) == (param, code)


def test_select_over_thousands_of_labels(server):
    labels = [f"label {i}" for i in range(3000)]
    with server.client(timeout=120) as c:
        res = c.post("/generate", json={"text": "x", "sampling_params": {
            "max_new_tokens": 16, "temperature": 0.8, "sampling_seed": 1, "choices": labels}})
    assert res.status_code == 200, res.text
    assert res.json()["text"] in labels and res.json()["meta_info"]["finish_reason"]["type"] == "stop"
    assert_healthy(server)


@pytest.mark.timeout(120)
def test_tool_call_checks_are_awaited_before_the_message_is_built(tiny_llama_dir, monkeypatch):
    """settle() (what the request handle awaits) runs the arguments' check in the check workers; building
    the message afterwards reads its result and waits for nothing (the blocking fallback is never used)."""
    import asyncio
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    import radixlm.tools.plan as plan
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.server.chat_agent import ChatAgent

    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": json.loads(HOSTILE)}, "required": ["s"]}}}
    agent = ChatAgent({"tools": [tool], "tool_choice": "required"}, AutoTokenizer.from_pretrained(str(tiny_llama_dir)),
                      SimpleNamespace(tool_call_parser="hermes", reasoning_parser=None), GrammarConfig())
    text = '<tool_call>\n{"name": "f", "arguments": {"s": "%s"}}\n</tool_call>' % ("a" * 40)
    asyncio.run(agent.settler()(text))
    monkeypatch.setattr(plan, "check_blocking", lambda *a: pytest.fail("the message waited for a check"))
    choice = agent.finish_choice({"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"})
    assert choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"s": "a" * 40}


@pytest.fixture(scope="module")
def one_slow_worker(tiny_llama_dir):
    """One compile worker and a deadline no test reaches: only abandoning can free the worker."""
    from tests.server.conftest import ServerProcess

    srv = ServerProcess(tiny_llama_dir, "--grammar-compile-timeout", "600", "--grammar-num-workers", "1").wait_ready()
    yield srv
    srv.stop()
    srv.remove_tmpdir()


@pytest.mark.timeout(300)
def test_a_client_that_gives_up_stops_its_compile(one_slow_worker):
    """The client of a minutes-long tool-schema compile gives up; the compile is stopped (its worker killed and
    replaced), so the next grammar request is served instead of waiting behind it."""
    import httpx

    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": exponential_schema()}}]}
    with one_slow_worker.client(timeout=3) as c:
        with pytest.raises(httpx.TimeoutException):
            c.post("/v1/chat/completions", json=body)
    with one_slow_worker.client(timeout=120) as c:
        res = c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": "[ab]{4}"}})
    assert res.status_code == 200, res.text
    assert len(res.json()["text"]) == 4 and set(res.json()["text"]) <= {"a", "b"}
