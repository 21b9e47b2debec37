"""RuntimeEndpoint's wire format, pinned against a fake server that records the requests it receives."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
from fake_native_server import REPLY, ServerThread, char_logprob

import radixlm as sgl
from radixlm.lang.backend import runtime as runtime_module
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpointError


@pytest.fixture(scope="module")
def server():
    srv = ServerThread()
    yield srv
    srv.stop()


@pytest.fixture
def endpoint(server):
    server.log.clear()
    backend = sgl.RuntimeEndpoint(server.url)
    yield backend
    backend.shutdown()


def _generate_bodies(server):
    return [r["json"] for r in server.requests("/generate")]


def test_connect_reads_model_info_and_uses_model_template(server, endpoint):
    assert server.log[0]["path"] == "/get_model_info" and server.log[0]["method"] == "GET"
    assert endpoint.get_model_name() == "fake/SmolLM2-tiny-Instruct"
    assert endpoint.get_chat_template().get_prefix_and_suffix("user", []) == ("<|im_start|>user\n", "<|im_end|>\n")


def test_gen_sends_the_stock_field_set(server, endpoint):
    @sgl.function
    def prog(s):
        s += "Capital of France:" + sgl.gen("a", max_tokens=5, stop=["\n"], temperature=0, top_k=3,
                                            return_logprob=True, top_logprobs_num=2)

    state = prog.run(backend=endpoint)
    assert state["a"] == REPLY[:5]
    assert state.get_meta_info("a")["prompt_tokens"] == len("Capital of France:")
    (body,) = _generate_bodies(server)
    assert body == {
        "text": "Capital of France:",
        "sampling_params": {
            "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 5,
            "min_new_tokens": 0, "n": 1, "stop": ["\n", "<|im_end|>"], "stop_token_ids": [], "stop_regex": [],
            "temperature": 0, "top_p": 1.0, "top_k": 3, "min_p": 0.0, "frequency_penalty": 0.0,
            "presence_penalty": 0.0, "ignore_eos": False, "regex": None, "json_schema": None},
        "return_logprob": True, "top_logprobs_num": 2,
    }


def _expected_choice(prefix: str, choices: list[str]) -> str:
    def score(choice):
        text = prefix + choice
        start = len(prefix)
        values = [char_logprob(text[i - 1], text[i]) for i in range(start, len(text))]
        return sum(values) / len(values)

    return max(choices, key=score)


def test_select_three_call_protocol(server, endpoint):
    choices = ["Paris", "London", "Rome"]
    prefix = "The capital of France is "

    @sgl.function
    def prog(s):
        s += prefix + sgl.select("city", choices=choices)

    state = prog.run(backend=endpoint)
    assert state["city"] == _expected_choice(prefix, choices)
    first, second = _generate_bodies(server)
    assert first == {"text": prefix, "sampling_params": {"max_new_tokens": 0}}
    assert second == {"text": [prefix + c for c in choices],
                      "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                      "return_logprob": True, "return_text_in_logprobs": True,
                      "logprob_start_len": len(prefix) - 2}
    # the scored tokens are exactly the choice's characters
    meta = state.get_meta_info("city")
    assert ["".join(e[2] for e in entries) for entries in meta["input_token_logprobs"]] == choices


def test_select_unconditional_sends_input_ids(server, endpoint):
    @sgl.function
    def prog(s):
        s += "Answer: " + sgl.select("x", choices=["yes", "no"],
                                     choices_method=sgl.unconditional_likelihood_normalized)

    prog.run(backend=endpoint)
    bodies = _generate_bodies(server)
    assert len(bodies) == 3
    assert bodies[2]["input_ids"] == [[ord(c) for c in "yes"], [ord(c) for c in "no"]]
    assert bodies[2]["sampling_params"] == {"max_new_tokens": 0} and bodies[2]["return_logprob"] is True


def test_fork_commits_prefix_and_concate_and_append(server, endpoint):
    @sgl.function
    def prog(s):
        s += "Shared prefix. "
        forks = s.fork(2)
        forks += lambda i: f"Branch {i}: " + sgl.gen("b", max_tokens=2)
        forks.join("concate_and_append")

    state = prog.run(backend=endpoint)
    bodies = _generate_bodies(server)
    assert bodies[0] == {"text": "Shared prefix. ", "sampling_params": {"max_new_tokens": 0}}
    (concat,) = server.requests("/concate_and_append_request")
    assert concat["method"] == "POST"
    assert concat["json"]["dst_rid"] == state.stream_executor.sid and len(concat["json"]["src_rids"]) == 2
    assert state.text() == "Shared prefix. Branch 0: Pa" + "Branch 1: Pa"


def test_run_batch_prefix_warmup_request(server, endpoint):
    prefix = "A long constant instruction that every item of the batch shares verbatim. " * 2

    @sgl.function
    def prog(s, q):
        s += prefix + q + sgl.gen("a", max_tokens=1)

    prog.run_batch([{"q": "x"}, {"q": "y"}], backend=endpoint)
    bodies = _generate_bodies(server)
    assert bodies[0] == {"text": prefix, "sampling_params": {"max_new_tokens": 0}}
    assert sum(1 for b in bodies if b["sampling_params"] == {"max_new_tokens": 0}) == 1


def test_streaming_parses_cumulative_sse(server, endpoint):
    @sgl.function
    def prog(s):
        s += "Go:" + sgl.gen("a", max_tokens=len(REPLY))

    state = prog.run(stream=True, backend=endpoint)
    assert "".join(state.text_iter("a")) == REPLY
    assert _generate_bodies(server)[0]["stream"] is True
    # the backend turns cumulative events into increments, one per event, in order
    params = state.stream_executor.resolve_params(sgl.gen("a", max_tokens=len(REPLY)).sampling_params)
    pieces = [piece for piece, _ in endpoint.generate_stream(SimpleNamespace(text_="Go:"), params)]
    assert pieces == [REPLY[i:i + 3] for i in range(0, len(REPLY), 3)]


def test_flush_cache_and_server_info(server, endpoint):
    assert sgl.flush_cache(endpoint) == {"flushed": True}
    assert sgl.get_server_info(endpoint)["version"] == "fake"
    assert [(r["method"], r["path"]) for r in server.log[1:]] == [("POST", "/flush_cache"), ("GET", "/server_info")]


def test_server_error_envelope_raises_with_message(server, endpoint):
    with pytest.raises(RuntimeEndpointError, match="temperature") as info:
        endpoint.transport.generate({"text": "x", "sampling_params": {"temperature": 3.0}})
    assert info.value.status == 400 and info.value.error["param"] == "temperature"


def test_api_key_is_sent_as_bearer_token():
    srv = ServerThread(api_key="sekret")
    try:
        with pytest.raises(RuntimeEndpointError) as info:
            sgl.RuntimeEndpoint(srv.url)
        assert info.value.status == 401
        backend = sgl.RuntimeEndpoint(srv.url, api_key="sekret")
        backend.cache_prefix("hello")
        assert all(r["authorization"] == "Bearer sekret" for r in srv.log[1:])
    finally:
        srv.stop()


def test_runtime_launches_polls_health_and_shuts_down(monkeypatch):
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setattr(runtime_module, "SERVER_MODULE", "fake_native_server")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, *sys.path]))
    rt = sgl.Runtime(model_path="fake-model", port=31234, max_total_tokens=64, disable_radix_cache=True,
                     launch_timeout=60)
    try:
        assert rt.command[3:] == ["--model-path", "fake-model", "--host", "127.0.0.1", "--port",
                                  rt.url.rsplit(":", 1)[1], "--log-level", "error", "--max-total-tokens", "64",
                                  "--disable-radix-cache"]
        assert rt.endpoint.get_model_name() == "fake/SmolLM2-tiny-Instruct"

        @sgl.function
        def prog(s):
            s += "Hi" + sgl.gen("a", max_tokens=3)

        assert prog.run(backend=rt)["a"] == REPLY[:3]
        process = rt.process
    finally:
        rt.shutdown()
    assert process.poll() is not None
