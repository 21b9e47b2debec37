"""OpenAI backend (via the `openai` package) against the fake server's /v1 routes."""

from __future__ import annotations

import pytest
from fake_native_server import REPLY, ServerThread, char_logprob

import radixlm as sgl

pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server():
    srv = ServerThread()
    yield srv
    srv.stop()


def _backend(server, model="fake-model", **kwargs):
    server.log.clear()
    return sgl.OpenAI(model, base_url=server.url + "/v1", api_key="k", **kwargs)


def test_completion_gen_maps_params_and_extensions(server):
    backend = _backend(server)

    @sgl.function
    def prog(s):
        s += "Q: capital?\nA:" + sgl.gen("a", max_tokens=4, stop="\n", temperature=0, top_k=5, regex="[A-Z][a-z]+")

    state = prog.run(backend=backend)
    assert state["a"] == REPLY[:4]
    (req,) = [r["json"] for r in server.requests("/v1/completions")]
    assert req["prompt"] == "Q: capital?\nA:"
    assert (req["model"], req["max_tokens"], req["temperature"], req["n"]) == ("fake-model", 4, 0, 1)
    assert req["stop"] == ["\n"]  # the "default" template adds no stop string
    assert (req["top_k"], req["regex"]) == (5, "[A-Z][a-z]+")
    assert "min_p" not in req and "ignore_eos" not in req  # defaults stay off the wire


def test_gen_after_assistant_uses_chat_messages(server):
    backend = _backend(server)

    @sgl.function
    def prog(s):
        s += sgl.system("sys") + sgl.user("hello")
        s += sgl.assistant(sgl.gen("a", max_tokens=8))

    state = prog.run(backend=backend)
    assert state["a"] == "chat:hello"
    (req,) = [r["json"] for r in server.requests("/v1/chat/completions")]
    assert req["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    assert state.messages()[-1] == {"role": "assistant", "content": "chat:hello"}


def test_forced_chat_model_rejects_gen_outside_assistant(server):
    @sgl.function
    def prog(s):
        s += "plain " + sgl.gen("a")

    with pytest.raises(RuntimeError, match="assistant"):
        prog.run(backend=_backend(server, is_chat_model=True))


def test_select_scores_echoed_prompt_logprobs(server):
    backend = _backend(server)
    prefix, choices = "Best city: ", ["Rome", "Oslo", "Lima"]

    @sgl.function
    def prog(s):
        s += prefix + sgl.select("c", choices=choices)

    def score(c):
        text = prefix + c
        vals = [char_logprob(text[i - 1], text[i]) for i in range(len(prefix), len(text))]
        return sum(vals) / len(vals)

    state = prog.run(backend=backend)
    assert state["c"] == max(choices, key=score)
    (req,) = [r["json"] for r in server.requests("/v1/completions")]
    assert req["prompt"] == [prefix + c for c in choices] and req["echo"] is True and req["logprobs"] == 1
    assert [len(e) for e in state.get_meta_info("c")["input_token_logprobs"]] == [len(c) for c in choices]


def test_select_falls_back_to_generation_without_logprobs(server):
    backend = _backend(server, model="no-logprobs")

    @sgl.function
    def prog(s):
        s += "Where? " + sgl.select("c", choices=["Berlin", "Paris is", "Paris"])

    state = prog.run(backend=backend)
    assert state["c"] == "Paris is"  # the completion "Paris is nice" starts with it; longest full match
    assert state.get_meta_info("c")["fallback"] == "generation"
