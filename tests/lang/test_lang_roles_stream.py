"""Roles and messages(), and streaming order, against the scripted backend."""

from __future__ import annotations

import asyncio

import pytest

import radixlm as sgl
from radixlm.lang.chat_template import get_chat_template


def _chatml(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def test_role_forms_build_identical_text_and_messages(scripted):
    backend = scripted(reply=lambda p, params: "Hello!")

    @sgl.function
    def with_calls(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("answer"))

    @sgl.function
    def with_blocks(s):
        with s.system():
            s += "Be brief."
        with s.user():
            s += "Hi"
        with s.assistant():
            s += sgl.gen("answer")

    @sgl.function
    def with_begin_end(s):
        s += sgl.system_begin() + "Be brief." + sgl.system_end()
        s += sgl.user_begin() + "Hi" + sgl.user_end()
        s += sgl.assistant_begin() + sgl.gen("answer") + sgl.assistant_end()

    expected_text = _chatml("system", "Be brief.") + _chatml("user", "Hi") + _chatml("assistant", "Hello!")
    expected_messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!"}]
    for prog in (with_calls, with_blocks, with_begin_end):
        state = prog.run(backend=backend)
        assert state.text() == expected_text
        assert state.messages() == expected_messages
        assert state["answer"] == "Hello!"
    # the model saw the open assistant turn
    assert all(prompt.endswith("<|im_start|>assistant\n") for _, prompt, _ in backend.calls)


def test_multi_turn_messages_shape(scripted):
    backend = scripted(reply=lambda p, params: f"a{p.count('<|im_start|>user')}")

    @sgl.function
    def chat(s, turns):
        for t in turns:
            s += sgl.user(t)
            s += sgl.assistant(sgl.gen("reply"))

    state = chat.run(turns=["one", "two", "three"], backend=backend)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3
    assert [m["content"] for m in messages[1::2]] == ["a1", "a2", "a3"]
    assert state["reply"] == "a3"  # a re-used name holds the latest value


def test_default_system_prompt_is_inserted(scripted):
    backend = scripted(template=get_chat_template("qwen"), reply=lambda p, params: "ok")

    @sgl.function
    def prog(s):
        s += sgl.user("Hi") + sgl.assistant(sgl.gen("a"))

    state = prog.run(backend=backend)
    assert state.messages()[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert state.text().startswith(_chatml("system", "You are a helpful assistant.") + _chatml("user", "Hi"))


def test_nested_roles_are_an_error(scripted):
    @sgl.function
    def prog(s):
        with s.user():
            s += sgl.assistant("x")

    with pytest.raises(ValueError, match="do not nest"):
        prog.run(backend=scripted())


def _story(s):
    s += "Once" + sgl.gen("first", max_tokens=8)
    s += " then" + sgl.gen("second", max_tokens=8)


def test_text_iter_streams_variable_pieces_in_order(scripted):
    backend = scripted(reply=lambda p, params: "abcdefghij"[: 3 + len(p) % 5], chunk_size=2)
    prog = sgl.function(_story)
    state = prog.run(stream=True, backend=backend)
    pieces = list(state.text_iter("second"))
    assert len(pieces) > 1
    assert "".join(pieces) == state["second"]
    whole = prog.run(stream=True, backend=backend)
    all_pieces = list(whole.text_iter())
    assert "".join(all_pieces) == whole.text()
    assert whole.text() == "Once" + whole["first"] + " then" + whole["second"]
    assert [k for k in backend.kinds()] == ["generate_stream"] * 4


def test_text_async_iter_with_meta_data(scripted):
    backend = scripted(reply=lambda p, params: "xyzw", chunk_size=1)
    prog = sgl.function(_story)

    async def collect():
        state = prog.run(stream=True, backend=backend)
        return [item async for item in state.text_async_iter("first", return_meta_data=True)], state

    items, state = asyncio.run(collect())
    assert "".join(piece for piece, _ in items) == "xyzw" == state["first"]
    assert all(isinstance(meta, dict) for _, meta in items)


def test_stream_error_surfaces_after_iteration(scripted):
    def reply(prompt, params):
        if "then" in prompt:
            raise ConnectionError("lost")
        return "ok"

    state = sgl.function(_story).run(stream=True, backend=scripted(reply=reply))
    with pytest.raises(ConnectionError):
        list(state.text_iter())


def test_non_stream_text_iter_yields_whole_value(scripted):
    state = sgl.function(_story).run(backend=scripted(reply=lambda p, params: "v"))
    assert list(state.text_iter("first")) == ["v"]
    assert list(state.text_iter()) == [state.text()]
