"""The Anthropic translation without a server (server/anthropic_format.py): requests into chat messages, and the
event stream read back by the official client (served from memory), thinking blocks and a mid-stream error
included."""

from __future__ import annotations

import anthropic
import httpx2
import pytest

from radixlm.errors import InvalidRequestError
from radixlm.runtime.server import anthropic_format as af
from radixlm.runtime.server.bodies import MessagesBody, MessagesCountBody

META = {"prompt_tokens": 30, "cached_tokens": 12, "completion_tokens": 9}


def _served(events: list[bytes]) -> anthropic.Anthropic:
    """A client whose every request is answered with these SSE events."""
    def answer(_: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=b"".join(events), headers={"content-type": "text/event-stream"})

    return anthropic.Anthropic(api_key="k", base_url="http://test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(answer)))


def _final(events: list[bytes]):
    with _served(events).messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]) as s:
        return s.get_final_message()


def test_streamed_blocks_assemble_into_the_finished_message():
    """Thought, text (its whitespace before the call dropped) and a call whose input arrives in pieces."""
    out = af.EventStream("m", None)
    pieces = [{"reasoning_content": "Think"}, {"reasoning_content": "ing."}, {"content": "Let me check."},
              {"content": " \n"}, {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                   "function": {"name": "calc", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1'}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": ', "b": [2]}'}}]}]
    events = out.start(META) + [e for p in pieces for e in out.feed(p)] + out.finish("tool_calls", None, META)
    final = _final(events)
    chat = {"reasoning_content": "Thinking.", "content": "Let me check.",
            "tool_calls": [{"function": {"name": "calc", "arguments": '{"a": 1, "b": [2]}'}}]}
    want = af.finished_message("m", {"message": chat, "finish_reason": "tool_calls"}, META, None)
    got = final.model_dump(exclude_none=True)
    assert [{k: v for k, v in b.items() if k != "id"} for b in got["content"]] == \
        [{k: v for k, v in b.items() if k != "id"} for b in want["content"]]
    assert final.content[2].id.startswith("toolu_") and final.stop_reason == "tool_use"
    assert got["usage"] == want["usage"] == {"input_tokens": 18, "output_tokens": 9, "cache_read_input_tokens": 12,
                                             "cache_creation_input_tokens": 0}


def test_a_call_cut_by_max_tokens_keeps_its_partial_input_streamed_or_not():
    out = af.EventStream("m", None)
    pieces = [{"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "calc", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1, "op": "+'}}]}]
    final = _final(out.start(META) + [e for p in pieces for e in out.feed(p)] + out.finish("length", None, META))
    chat = {"content": None, "tool_calls": [{"function": {"name": "calc", "arguments": '{"a": 1, "op": "+'}}]}
    want = af.finished_message("m", {"message": chat, "finish_reason": "length"}, META, None)
    assert [(b.name, b.input) for b in final.content] == [(b["name"], b["input"]) for b in want["content"]] == [
        ("calc", {"a": 1})]
    assert final.stop_reason == want["stop_reason"] == "max_tokens"


def test_trailing_whitespace_of_a_text_answer_is_kept():
    out = af.EventStream("m", ["END"])
    events = out.start(META) + out.feed({"content": "Hi \n"}) + out.finish("stop", "END", META)
    final = _final(events)
    assert [b.text for b in final.content] == ["Hi \n"]
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


def test_an_error_mid_stream_raises_in_the_client():
    out = af.EventStream("m", None)
    events = out.start(META) + out.feed({"content": "partial"}) + [af.sse_error(503, "server overloaded")]
    with pytest.raises(anthropic.APIStatusError) as err:
        _final(events)
    assert err.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "server overloaded"}}


@pytest.mark.parametrize("reason, matched, want", [
    ("stop", None, ("end_turn", None)), ("stop", 2, ("end_turn", None)), ("stop", "##", ("stop_sequence", "##")),
    ("stop", "</tool_call>", ("end_turn", None)), ("length", None, ("max_tokens", None)),
    ("tool_calls", None, ("tool_use", None)), ("abort", None, ("end_turn", None))])
def test_stop_reasons(reason, matched, want):
    assert af.stop_reason(reason, matched, ["##"]) == want


def test_requests_become_chat_messages():
    body = MessagesBody(max_tokens=5, system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
                        stop_sequences=["x"], temperature=0.5, seed=3, messages=[
                            {"role": "user", "content": "Q"},
                            {"role": "assistant", "content": [
                                {"type": "thinking", "thinking": "hm", "signature": "s"},
                                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
                            {"role": "user", "content": [
                                {"type": "text", "text": "and?"},
                                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom",
                                 "is_error": True}]},
                            {"role": "assistant", "content": "Sure"}],
                        tools=[{"name": "f", "input_schema": {"type": "object"},
                                "cache_control": {"type": "ephemeral"}}],
                        tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True})
    turn = af.to_chat(body)
    assert turn.prefill == "Sure"
    assert turn.chat.messages == [
        {"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: boom"}, {"role": "user", "content": "and?"}]
    assert turn.chat.tool_fields() == {
        "tools": [{"type": "function",
                   "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False}
    assert (turn.chat.max_tokens, turn.chat.stop, turn.chat.temperature, turn.chat.seed) == (5, ["x"], 0.5, 3)
    counted = af.to_chat(MessagesCountBody(messages=[{"role": "user", "content": "Q"}], tool_choice={"type": "any"}))
    assert counted.chat.tool_choice == "required" and counted.chat.max_tokens is None


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": [{"type": "document", "source": {}}]}],
    [{"role": "user", "content": 3}],
    [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
    [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}],
    [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]])
def test_malformed_messages_are_invalid_requests(messages):
    with pytest.raises(InvalidRequestError) as err:
        af.to_chat(MessagesCountBody(messages=messages))
    assert err.value.param == "messages" and "messages[0]" in str(err.value)


@pytest.mark.parametrize("choice", [{"type": ["any"]}, {"type": {"x": 1}}, {"type": "sometimes"}])
def test_a_bad_tool_choice_type_is_an_invalid_request(choice):
    with pytest.raises(InvalidRequestError) as err:  # a list or object type is not a TypeError (a 500)
        af.to_chat(MessagesCountBody(messages=[{"role": "user", "content": "Q"}], tool_choice=choice))
    assert err.value.param == "tool_choice"
