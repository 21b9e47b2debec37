"""The tool grammar on the llguidance backend: random walks through it (sampling among allowed tokens)
always give calls the parser accepts, whose arguments validate against the tool's schema; text written
past the calls ends the group (the trailer stop) instead of being forced into another call."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GrammarError
from radixlm.constrained.simulate import random_walk
from radixlm.errors import InvalidRequestError
from radixlm.runtime.server.reasoning import PARSERS
from radixlm.tools.grammar import literal, tool_grammar, trailer_stop, with_trailer_stop
from radixlm.tools.parsers import hermes, llama3, mistral
from radixlm.tools.spec import parse_tool_request
from tests.server.tools.conftest import SCHEMAS, TOOLS

NAMED = {"type": "function", "function": {"name": "calculator"}}


def _grammar(choice, fmt=hermes.FORMAT, parallel=True, tools=TOOLS):
    req = parse_tool_request({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel})
    return tool_grammar(req, fmt, GrammarOptions())


def _walk(backend, tokenizer, grammar, seed, prefix=""):
    matcher = backend.compile("ebnf", grammar).matcher()
    for tid in tokenizer(prefix, add_special_tokens=False).input_ids if prefix else []:
        assert matcher.accept_token(tid)
    res = random_walk(matcher, tokenizer, backend.vocab_size, seed=seed, max_tokens=600)
    return prefix + res.text, res.finished


def _check_calls(calls, names=tuple(SCHEMAS)):
    for call in calls:
        assert call.name in names
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("fmt", [hermes, llama3, mistral], ids=lambda m: m.FORMAT.name)
@pytest.mark.parametrize("choice,parallel", [("required", True), ("required", False), (NAMED, True)])
def test_required_walks_are_valid_calls(llg_backend, byte_tokenizer, fmt, choice, parallel):
    grammar = _grammar(choice, fmt.FORMAT, parallel)
    num_calls = 0
    for seed in range(6):
        text, finished = _walk(llg_backend, byte_tokenizer, grammar, seed)
        assert finished, text
        calls = fmt.parse(text)
        assert calls, text
        _check_calls(calls, ("calculator",) if choice == NAMED else tuple(SCHEMAS))
        if not parallel:
            assert len(calls) == 1
        num_calls += len(calls)
    assert num_calls >= 6


def test_auto_allows_text_then_constrains_the_call(llg_backend, byte_tokenizer):
    grammar = _grammar("auto")
    text, finished = _walk(llg_backend, byte_tokenizer, grammar, 0, prefix="Let me see. ")
    assert finished
    assert hermes.parse(text) == [] or text.startswith("Let me see. ")
    for seed in range(6):  # once the trigger is written, the rest is a valid call
        text, finished = _walk(llg_backend, byte_tokenizer, grammar, seed, prefix="Sure. <tool_call>")
        assert finished, text
        calls = hermes.parse(text)
        assert len(calls) >= 1, text
        _check_calls(calls)


def test_required_refuses_text_and_wrong_arguments(llg_backend, byte_tokenizer):
    matcher = llg_backend.compile("ebnf", _grammar("required")).matcher()
    assert not matcher.accept_token(byte_tokenizer("H", add_special_tokens=False).input_ids[0])
    grammar = _grammar("auto")
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"a": 1, "op": "%"'
    matcher = llg_backend.compile("ebnf", grammar).matcher()
    ids = byte_tokenizer(bad, add_special_tokens=False).input_ids
    assert not all(matcher.accept_token(t) for t in ids)


def test_none_has_no_grammar_and_bad_schemas_are_400(llg_backend):
    """A bad tool schema is a 400 naming `tools` and the function when the grammar compiles (the schemas
    are lowered in the compile worker, under its deadline)."""
    assert _grammar("none") is None
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$ref": "http://x/y"}}}]
    with pytest.raises(GrammarError) as exc:
        llg_backend.compile("ebnf", _grammar("required", tools=bad))
    assert exc.value.param == "tools" and str(exc.value).startswith("tools: function 'f': external $ref")


@pytest.mark.parametrize("obj,param", [
    ({"tools": "x"}, "tools"), ({"tools": [{"type": "function"}]}, "tools"),
    ({"tools": [{"function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tool_fields_are_400(obj, param):
    with pytest.raises(InvalidRequestError) as exc:
        parse_tool_request(obj)
    assert exc.value.param == param


def test_special_token_literals():
    assert literal("<|python_tag|>{", ["<|python_tag|>"]) == '<|python_tag|> "{"'
    assert literal("<tool_call>\n") == '"<tool_call>\\n"'


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_grammar_after_reasoning(llg_backend, byte_tokenizer, name):
    grammar = PARSERS[name].wrap_grammar(_grammar("required", parallel=False))
    for seed in range(3):
        text, finished = _walk(llg_backend, byte_tokenizer, grammar, seed, prefix="<think>hmm, {not json</think>\n")
        assert finished
        thought, content = PARSERS[name].split(text)
        assert thought == "hmm, {not json"
        _check_calls(hermes.parse(content))
        assert len(hermes.parse(content)) == 1


def test_qwen3_thought_must_open_with_think(llg_backend, byte_tokenizer):
    grammar = PARSERS["qwen3"].wrap_grammar(_grammar("required", parallel=False))
    matcher = llg_backend.compile("ebnf", grammar).matcher()
    assert not matcher.accept_token(byte_tokenizer("H", add_special_tokens=False).input_ids[0])
    text, finished = _walk(llg_backend, byte_tokenizer, grammar, 0, prefix="<tool_call>")
    assert finished and len(hermes.parse(text)) == 1


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"a": 1, "b": 2, "op": "+"}}\n</tool_call>'


def _takes(backend, tokenizer, grammar, text) -> bool:
    matcher = backend.compile("ebnf", grammar).matcher()
    return all(matcher.accept_token(t) for t in tokenizer(text, add_special_tokens=False).input_ids) \
        and matcher.is_accepting()


@pytest.mark.parametrize("choice,parallel", [("required", True), ("required", False), ("auto", True)])
def test_text_past_the_calls_ends_the_group(llg_backend, byte_tokenizer, choice, parallel):
    """A model that writes on after its call (SmolLM2 explains it) is not forced into a second call: the
    grammar takes the text and the trailer stop ends the request there, leaving the calls."""
    grammar, stop = _grammar(choice, parallel=parallel), trailer_stop(hermes.FORMAT)
    prefix = "Sure. " if choice == "auto" else ""
    for tail, where in [("\n\nThe answer is 3.", 0), ("Done", 0), (" \n", None), ("", None)]:
        assert _takes(llg_backend, byte_tokenizer, grammar, prefix + CALL + tail), tail
        found = re.search(stop, prefix + CALL + tail)
        assert (found and found.start()) == (None if where is None else len(prefix + CALL)), tail
    assert not _takes(llg_backend, byte_tokenizer, grammar, CALL + "\n<b>")  # `<` only opens a call
    second = CALL + "\n" + CALL
    assert _takes(llg_backend, byte_tokenizer, grammar, prefix + second) == parallel
    assert re.search(stop, second) is None


def test_the_trailer_stop_never_matches_inside_arguments():
    """Canonical JSON escapes newlines, so the `\\n</tool_call>` the stop looks behind for is never in a string."""
    args = json.dumps({"text": "\n</tool_call>\nThe end"})
    assert re.search(trailer_stop(hermes.FORMAT), '<tool_call>\n{"name": "t", "arguments": %s}' % args) is None


def test_families_without_a_closing_tag_have_no_trailer():
    """llama3 (`;` between bare objects) and mistral (a JSON array) end calls with `}` or `]`, which also
    close JSON inside the arguments: no lookbehind can tell them apart, so their grammars end with the calls."""
    for fmt in (llama3.FORMAT, mistral.FORMAT):
        assert trailer_stop(fmt) is None and with_trailer_stop({}, fmt) == {}
        assert "TRAILER" not in _grammar("required", fmt)


def test_the_trailer_stop_joins_the_requests_own():
    stop = trailer_stop(hermes.FORMAT)
    assert with_trailer_stop({}, hermes.FORMAT) == {"stop_regex": [stop]}
    assert with_trailer_stop({"stop_regex": "x+"}, hermes.FORMAT) == {"stop_regex": ["x+", stop]}
    assert with_trailer_stop({"stop_regex": ["a", "b"]}, hermes.FORMAT) == {"stop_regex": ["a", "b", stop]}
    with pytest.raises(InvalidRequestError) as info:  # the request's own 16 would become 17: said plainly
        with_trailer_stop({"stop_regex": ["x"] * 16}, hermes.FORMAT)
    assert info.value.param == "stop_regex" and "at most 15" in str(info.value)


def test_calls_hold_only_the_declared_arguments(llg_backend, byte_tokenizer):
    """Tool arguments are closed where the schema lists `properties` and says nothing else about other keys
    (a handler's `f(**args)` fails on an undeclared one); an explicit additionalProperties schema still
    admits other keys, and response_format schemas stay JSON Schema's open objects."""
    from radixlm.tools.grammar import lowered_parameters
    from radixlm.tools.spec import ToolSpec

    def tool(params):
        return [{"type": "function", "function": {"name": "f", "parameters": params}}]

    def call(args):
        return '<tool_call>\n{"name": "f", "arguments": %s}\n</tool_call>' % json.dumps(args)

    nested = {"type": "object", "properties": {"a": {"type": "integer"}, "o": {"type": "object", "properties": {
        "x": {"type": "string"}}}}}
    grammar = _grammar("required", tools=tool(nested))
    assert _takes(llg_backend, byte_tokenizer, grammar, call({"a": 1, "o": {"x": "y"}}))
    assert not _takes(llg_backend, byte_tokenizer, grammar, call({"a": 1, "b": 2}))
    assert not _takes(llg_backend, byte_tokenizer, grammar, call({"a": 1, "o": {"x": "y", "z": 1}}))
    open_map = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}}
    assert _takes(llg_backend, byte_tokenizer, _grammar("required", tools=tool(open_map)), call({"a": 1, "b": 2}))
    as_response_format = lowered_parameters(ToolSpec("response_format", "", nested), GrammarOptions())
    assert "additionalProperties" not in as_response_format
