"""`uniqueItems` on free values enforced while generating (unique_items.py, schema_scope.py, json_stream.py):
tokens that would repeat an earlier item are masked, valid documents are never refused, through the real
SmolLM2 tokenizer and the grammar backends; and end to end through the Engine."""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest
import torch

from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained.json_stream import value_key
from radixlm.constrained.schema_scope import SchemaScope
from radixlm.constrained.unique_items import TokenTable, UniqueItemsGrammar
from radixlm.constrained.vocabulary import token_bytes_for
from radixlm.runtime.engine import Engine

BACKENDS = [b for b, mod in (("llguidance", "llguidance"), ("xgrammar", "xgrammar"))
            if importlib.util.find_spec(mod) is not None]

STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
NUMBERS = {"type": "array", "items": {"type": "number"}, "uniqueItems": True}
TAGS = {"type": "object", "properties": {"Tags": {"type": "array", "uniqueItems": True,
                                                  "items": {"$ref": "#/definitions/Tag"}}},
        "definitions": {"Tag": {"type": "object", "required": ["Key", "Value"],
                                "properties": {"Key": {"type": "string"}, "Value": {"type": "string"}}}}}
# A closed object: after its last member only `}` may follow, so the repeat is forced one token early.
TAGS_CLOSED = {"type": "array", "uniqueItems": True, "items": {
    "type": "object", "required": ["Key", "Value"], "additionalProperties": False,
    "properties": {"Key": {"type": "string"}, "Value": {"type": "string"}}}}
BOUNDED = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "uniqueItems": True}
NESTED = {"type": "array", "uniqueItems": True, "items": {"type": "array", "items": {"type": "integer"}}}
TREE = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
    "name": {"type": "string"}, "kids": {"type": "array", "uniqueItems": True, "items": {"$ref": "#/$defs/node"}}}}}}
# Only one branch asks for unique items: a repeated item is valid (the other branch), never blocked.
EITHER = {"anyOf": [{"type": "array", "uniqueItems": True}, {"type": "array", "items": {"type": "integer"}}]}
BY_PATTERN = {"type": "object", "patternProperties": {"^x-": {"type": "array", "uniqueItems": True}},
              "additionalProperties": {"type": "array"}}

VALID = [
    (STRINGS, '["ab", "cd", "abc", "a", "", "a\\"b", "a\\\\b"]'),
    (NUMBERS, "[1, 2, 12, 1.5, -1, 10, 100, 1e3]"),
    (TAGS, '{"Tags": [{"Key": "a", "Value": "b"}, {"Key": "a", "Value": "c"}, {"Key": "c", "Value": "b"}]}'),
    (TAGS_CLOSED, '[{"Key": "a", "Value": "b"}, {"Key": "a", "Value": "bc"}, {"Key": "b", "Value": "b"}]'),
    (BOUNDED, "[130, 13, 131, 1, 999, 0]"),
    (NESTED, "[[1], [1, 2], [2, 1], []]"),
    (TREE, '{"name": "r", "kids": [{"name": "a"}, {"name": "b", "kids": [{"name": "a"}]}]}'),
    (EITHER, "[1, 1, 1]"),
    (BY_PATTERN, '{"y": [1, 1], "x-a": [true, false, null, 1]}'),
]
# (schema, document, where the repeated item completes: its last character, counted from the end)
DUPLICATES = [
    (STRINGS, '["ab", "cd", "ab"]', -2),
    (NUMBERS, "[1, 2, 1.0]", -1),  # a number completes at the byte after it
    (TAGS, '{"Tags": [{"Key": "a", "Value": "b"}, {"Key": "a", "Value": "b"}]}', -3),
    (TAGS, '{"Tags": [{"Key": "a", "Value": "b"}, {"Key":"a","Value":"b"}]}', -3),  # spelled differently
    (NESTED, "[[1, 2], [1, 2]]", -2),
    (TREE, '{"name": "r", "kids": [{"name": "a"}, {"name": "a"}]}', -3),
    (BY_PATTERN, '{"x-a": [true, true]}', -3),
    # Lookahead: the token that makes the repeat unavoidable is blocked (the closing quote of the last
    # member, blanks before the `}` included; the last digit a bounded number can take).
    (TAGS_CLOSED, '[{"Key": "a", "Value": "b"}, {"Key": "a", "Value": "b"}]', -3),
    (BOUNDED, "[130, 130]", -2),
]


@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.runtime.model.loader import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="module")
def table(tokenizer):
    return TokenTable.build(token_bytes_for(tokenizer))


def _grammar(backend, tokenizer, table, schema):
    compiled = make_backend(backend, tokenizer, len(tokenizer), GrammarOptions()).compile("json_schema",
                                                                                         json.dumps(schema))
    return UniqueItemsGrammar(compiled, schema, table, len(tokenizer))


def _walk(matcher, tokenizer, text: str) -> int:
    """Feed text's tokens, each checked against the step's mask first: the index of the first token the
    mask blocks, or -1 when all pass."""
    for i, t in enumerate(tokenizer.encode(text, add_special_tokens=False)):
        mask = torch.zeros(len(tokenizer), dtype=torch.bool)
        matcher.fill_allowed_mask(mask)
        if not mask[t]:
            return i
        assert matcher.accept_token(t)
    return -1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,text", VALID, ids=[f"valid{i}" for i in range(len(VALID))])
def test_distinct_items_are_never_blocked(backend, tokenizer, table, schema, text):
    jsonschema.validate(json.loads(text), schema)
    grammar = _grammar(backend, tokenizer, table, schema)
    plain = _walk(grammar._inner.matcher(), tokenizer, text)  # -1, or where the backend's grammar refuses
    assert _walk(grammar.matcher(), tokenizer, text) == plain
    if backend == "llguidance":
        assert plain == -1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,text,completes", DUPLICATES, ids=[f"dup{i}" for i in range(len(DUPLICATES))])
def test_a_repeated_item_is_blocked_where_it_completes(backend, tokenizer, table, schema, text, completes):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(text), schema)
    grammar = _grammar(backend, tokenizer, table, schema)
    ids = tokenizer.encode(text, add_special_tokens=False)
    where = len(text) + completes
    plain = _walk(grammar._inner.matcher(), tokenizer, text)
    if 0 <= plain and len(tokenizer.decode(ids[:plain])) <= where:
        assert backend != "llguidance"
        pytest.skip(f"{backend}'s own grammar refuses this spelling before the repeated item")
    matcher = grammar.matcher()
    at = _walk(matcher, tokenizer, text)
    assert at >= 0
    # The blocked token is the one holding the character that completes the repeated item.
    assert len(tokenizer.decode(ids[:at])) <= where < len(tokenizer.decode(ids[:at + 1]))
    # The same token is refused by accept_token too (the mask of this state was computed above).
    assert not matcher.accept_token(ids[at])


def test_rollback_and_copy_keep_the_items_seen(tokenizer, table):
    grammar = _grammar("llguidance", tokenizer, table, STRINGS)
    matcher = grammar.matcher()
    prefix = tokenizer.encode('["ab", "cd", "ab', add_special_tokens=False)
    for t in prefix:
        assert matcher.accept_token(t)
    banned = set(matcher.banned().tolist())
    assert banned  # closing the string now would repeat "ab"
    twin = matcher.copy()
    extra = tokenizer.encode('zz", "', add_special_tokens=False)
    for t in extra:
        assert matcher.accept_token(t)
    matcher.rollback(len(extra))
    assert set(matcher.banned().tolist()) == banned == set(twin.banned().tolist())
    assert _walk(twin, tokenizer, '"]') == 0


def test_scope_is_unknown_rather_than_wrong():
    branches = [{"type": "array", "uniqueItems": True, "minItems": i} for i in range(40)]
    scope = SchemaScope({"anyOf": branches})
    assert scope.root() is None  # too many alternatives: nothing enforced below
    assert SchemaScope({"$ref": "#/nowhere"}).root() is None
    ok = SchemaScope({"allOf": [{"type": "array"}, {"uniqueItems": True}]})
    assert SchemaScope.requires(ok.root(), "array", "uniqueItems")


def test_value_keys_follow_json_schema_equality():
    assert value_key(1) == value_key(1.0) != value_key(True)
    assert value_key({"a": 1, "b": [1]}) == value_key({"b": [1.0], "a": 1})
    assert value_key([1, 2]) != value_key([2, 1])
    assert value_key(None) != value_key(False)


def _generate(model_dir, schema) -> list[dict]:
    params = [{"max_new_tokens": 64, "temperature": t, "sampling_seed": i, "json_schema": json.dumps(schema)}
              for i, t in enumerate([0.0, 0.0, 1.0, 1.0])]
    with Engine(str(model_dir), max_total_tokens=8192, grammar_num_workers=1, grammar_backend="llguidance") as eng:
        results = eng.generate(["A", "B", "C", "D"], params)
        eng.check_integrity()
    return results


def test_engine_generates_unique_items(tiny_llama_dir, monkeypatch):
    """Bounded numbers: an item can run into a forced repeat (130 after an earlier 130), which the one-step
    lookahead blocks a token early. The random tiny model repeats itself under greedy decoding."""
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 6,
              "maxItems": 6, "uniqueItems": True}
    finished = 0
    for r in _generate(tiny_llama_dir, schema):
        if r["meta_info"]["finish_reason"]["type"] != "stop":
            continue
        finished += 1
        jsonschema.validate(json.loads(r["text"]), schema)
        assert r["meta_info"]["json_schema_valid"] is True
    assert finished >= 3
    # The same requests without the unique-items layer: greedy rows repeat an item (the test has teeth).
    monkeypatch.setattr("radixlm.constrained.unique_items.wants_unique_items", lambda spec: False)
    plain = [json.loads(r["text"]) for r in _generate(tiny_llama_dir, schema)[:2]
             if r["meta_info"]["finish_reason"]["type"] == "stop"]
    assert any(len(set(v)) < len(v) for v in plain), plain
