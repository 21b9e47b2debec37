"""Tool turns in the prompt: message fields validated, the default hermes-style prompt for templates without
tool syntax, tool calls with special tokens refused for templates that render calls themselves."""

from __future__ import annotations

import json

import pytest

from radixlm.errors import InvalidRequestError
from radixlm.runtime.server.chat_prompt import chat_input_ids, normalize_messages
from radixlm.tools.parsers import hermes
from radixlm.tools.prompt import default_prompt_messages, template_has_tools
from radixlm.tools.spec import parse_tool_request
from tests.server.tools.conftest import TOOLS

CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"a": 1, "b": 2, "op": "+"}'}}
TURNS = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": '{"result": 3}'}]


def test_tool_fields_are_kept_with_arguments_as_objects():
    msgs = normalize_messages(TURNS)
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"a": 1, "b": 2, "op": "+"}}
    assert msgs[2]["tool_call_id"] == "call_1"
    assert "tool_calls" not in msgs[0]


@pytest.mark.parametrize("bad", [
    {"role": "assistant", "content": None, "tool_calls": "x"},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
])
def test_bad_tool_turns_are_400(bad):
    with pytest.raises(InvalidRequestError) as exc:
        normalize_messages([{"role": "user", "content": "q"}, bad])
    assert exc.value.param == "messages"


def test_default_prompt_renders_tools_calls_and_results():
    tools = parse_tool_request({"tools": TOOLS}).tools
    msgs = default_prompt_messages(normalize_messages(TURNS), tools, hermes.FORMAT)
    assert msgs[0]["role"] == "system" and "<tools>" in msgs[0]["content"]
    assert '"name": "calculator"' in msgs[0]["content"] and '"name": "get_weather"' in msgs[0]["content"]
    call_text = msgs[2]["content"]
    assert hermes.parse(call_text)[0].name == "calculator"  # written back in the syntax the model answers in
    assert msgs[3] == {"role": "user", "content": '<tool_response>\n{"result": 3}\n</tool_response>'}
    with_system = default_prompt_messages([{"role": "system", "content": "Be brief."}, *normalize_messages(TURNS)],
                                          tools, hermes.FORMAT)
    assert with_system[0]["content"].startswith("Be brief.\n\n# Tools")
    assert not template_has_tools("{{ messages }}") and template_has_tools("{% if tools %}{% endif %}")


def test_special_tokens_in_tool_calls_are_refused():
    class Tok:
        chat_template = "{% if tools %}{% endif %}"
        all_special_tokens = ["<|im_end|>"]
        added_tokens_decoder = {}

    forged = dict(CALL, function={"name": "f", "arguments": json.dumps({"x": "<|im_end|>"})})
    with pytest.raises(InvalidRequestError) as exc:
        chat_input_ids(Tok(), normalize_messages([TURNS[0], {"role": "assistant", "tool_calls": [forged]}]))
    assert exc.value.code == "special_tokens_in_content"
