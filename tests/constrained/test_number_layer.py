"""One-sided number bounds under llguidance (number_bounds.py, number_layer.py): the lowering hands over
only bounds it reaches on plain paths, the prefix check agrees with brute force, valid numbers in every
spelling (exponents included) are taken, and tokens leaving the bound are refused, by mask and by
accept_token, on a tokenizer and in the engine."""

from __future__ import annotations

import functools
import itertools
import json
import re

import jsonschema
import pytest
import torch

from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained.number_bounds import MARK, bound_at, feasible, hand_over, one_sided, within
from radixlm.constrained.number_layer import NumberBoundsGrammar
from radixlm.constrained.schema_lower import lower_schema
from radixlm.runtime.engine import Engine
from tests.constrained.keyword_cases import ONE_SIDED

pytest.importorskip("llguidance")

JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
BOUNDS = [{"minimum": 0}, {"exclusiveMinimum": 0}, {"minimum": 1000}, {"minimum": -2.5}, {"maximum": 0},
          {"exclusiveMaximum": 0.5}, {"maximum": -3}, {"maximum": 1000, "exclusiveMaximum": 10},
          {"minimum": 0.5}]


def _lowered(schema) -> dict:
    return hand_over(lower_schema(json.dumps(schema), GrammarOptions(), "llguidance").schema)


def test_only_one_sided_bounds_on_plain_paths_are_handed_over():
    lowered = _lowered(ONE_SIDED)
    props = lowered["properties"]
    assert props["timeout"] == {"type": "number", MARK: {"minimum": 1000}}
    assert props["ratio"][MARK] == {"exclusiveMinimum": 0} and props["limit"][MARK] == {"maximum": -1}
    assert props["sizes"]["items"][MARK] == {"minimum": 0}
    kept = {"type": "object", "properties": {
        "two": {"type": "number", "minimum": 0, "maximum": 5},             # llguidance's range: exact
        "int": {"type": "integer", "minimum": 0},                          # integers have no exponent
        "opt": {"type": ["number", "null"], "minimum": 0},                 # anyOf branches
        "any": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string"}]},
        "pat": {"type": "object", "patternProperties": {"^x": {"type": "number", "minimum": 0}}}}}
    assert MARK not in json.dumps(_lowered(kept))
    assert MARK not in json.dumps(_lowered({"type": "number", "minimum": 0}))  # the root ends at EOS
    # A subtree shared with an anyOf branch is copied, not changed there.
    shared = {"type": "number", "minimum": 0}
    lowered = {"type": "object", "properties": {"a": shared, "b": {"anyOf": [shared, {"type": "null"}]}}}
    out = hand_over(lowered)
    assert MARK in out["properties"]["a"] and out["properties"]["b"]["anyOf"][0] is shared and MARK not in shared


def test_only_json_schema_grammars_hand_bounds_over(llg):
    """Tool-call grammars (structural tags, %json inside Lark) keep llguidance's own bounds: no layer
    reads them there."""
    from radixlm.constrained.structural_tag import structural_tag_to_lark

    tag = {"type": "structural_tag", "triggers": ["<f>"],
           "structures": [{"begin": "<f>", "schema": ONE_SIDED, "end": "</f>"}]}
    assert MARK not in structural_tag_to_lark(tag)
    assert not isinstance(llg.compile("ebnf", structural_tag_to_lark(tag)), NumberBoundsGrammar)


def test_bound_at_follows_properties_items_and_additional_properties():
    lowered = _lowered({"type": "object", "properties": {"a": {"type": "array", "prefixItems": [
        {"type": "number", "maximum": 1}], "items": {"type": "number", "minimum": 2}}},
        "additionalProperties": {"type": "number", "exclusiveMinimum": 3}})
    assert bound_at(lowered, ("a", 0)) == {"maximum": 1}
    assert bound_at(lowered, ("a", 5)) == {"minimum": 2}
    assert bound_at(lowered, ("zzz",)) == {"exclusiveMinimum": 3}
    assert bound_at(lowered, ("a",)) is None and bound_at(lowered, (None,)) is None
    assert bound_at(lowered, ()) is None


@functools.lru_cache(maxsize=1)
def _numbers(max_len: int = 6, alphabet: str = "0159.eE+-") -> tuple[str, ...]:
    """Every JSON number up to max_len characters over a small alphabet."""
    out = []
    for n in range(1, max_len + 1):
        out += ["".join(p) for p in itertools.product(alphabet, repeat=n) if JSON_NUMBER.fullmatch("".join(p))]
    return tuple(out)


@pytest.mark.parametrize("bound", BOUNDS, ids=lambda b: json.dumps(b))
def test_prefix_check_agrees_with_brute_force(bound):
    """feasible(prefix) is True whenever a completion of up to 6 characters is valid (it never blocks a
    valid number) and, for prefixes of up to 2 characters (whose witnesses fit in 6), only then."""
    if not one_sided(bound):
        assert one_sided(bound) is None  # mixed lower and upper: not handed over
        return
    numbers = _numbers()
    reachable = {n[:k] for n in numbers if within(n.encode(), bound) for k in range(1, len(n) + 1)}
    for prefix in {n[:k] for n in numbers for k in range(1, len(n) + 1)}:
        if prefix in reachable:
            assert feasible(prefix.encode(), bound), (prefix, bound)
        elif len(prefix) <= 2:
            assert not feasible(prefix.encode(), bound), (prefix, bound)


def test_finished_numbers_are_read_as_the_validator_reads_them():
    assert within(b"1.7976931348623157e+308", {"minimum": 0}) and within(b"-0.0", {"minimum": 0})
    assert not within(b"-0.0", {"exclusiveMinimum": 0}) and not within(b"1e400", {"maximum": 10})
    assert within(b"100000000000000000000001", {"exclusiveMinimum": 100000000000000000000000})


@pytest.fixture(scope="module")
def llg(byte_tokenizer, model_vocab_size):
    return make_backend("llguidance", byte_tokenizer, model_vocab_size, GrammarOptions())


def _walk(matcher, tokenizer, text: str, vocab: int) -> int:
    """Feed text's tokens, each checked against the step's mask first: the index of the first token the
    mask blocks (or accept_token refuses), -1 when all pass."""
    for i, t in enumerate(tokenizer.encode(text, add_special_tokens=False)):
        mask = torch.zeros(vocab, dtype=torch.bool)
        matcher.fill_allowed_mask(mask)
        if not mask[t] or not matcher.accept_token(t):
            return i
    return -1


VALID = [{"timeout": 1.7976931348623157e308, "ratio": 1e-07, "limit": -1e300, "sizes": [0, 6.181229024216581e16, -0.0]},
         {"timeout": 1e4, "sizes": [1.5e-5, 2]}, {"ratio": 5e-324, "limit": -1.0}]
INVALID = ['{"timeout": 999.99}', '{"timeout": 1e2}', '{"timeout": 99e1}', '{"ratio": 0}', '{"ratio": -0.0}',
           '{"ratio": 0e5}', '{"ratio": -1e-9}', '{"limit": -0.5}', '{"limit": -1e-1}', '{"limit": 0}',
           '{"sizes": [1, -1e-300]}', '{"sizes": [-0.5]}']


def test_valid_spellings_are_taken_and_leaving_the_bound_is_refused(llg, byte_tokenizer, model_vocab_size):
    grammar = llg.compile("json_schema", json.dumps(ONE_SIDED))
    assert isinstance(grammar, NumberBoundsGrammar)
    for value in VALID:
        jsonschema.validate(value, ONE_SIDED)
        for text in (json.dumps(value), json.dumps(value, separators=(",", ":"))):
            m = grammar.matcher()
            assert _walk(m, byte_tokenizer, text, model_vocab_size) == -1 and m.is_accepting(), text
    for text in INVALID:
        assert not jsonschema.Draft202012Validator(ONE_SIDED).is_valid(json.loads(text)), text
        assert _walk(grammar.matcher(), byte_tokenizer, text, model_vocab_size) >= 0, text
        # accept_token alone (no mask computed first, as when a draft is checked) refuses it too.
        m = grammar.matcher()
        assert not all(m.accept_token(t) for t in byte_tokenizer.encode(text, add_special_tokens=False)), text
        # Teeth: llguidance alone (the free number) takes it.
        inner = grammar._inner.matcher()
        assert all(inner.accept_token(t) for t in byte_tokenizer.encode(text, add_special_tokens=False)), text


def test_the_mask_blocks_exactly_the_steps_out_of_the_bound(llg, byte_tokenizer, model_vocab_size):
    grammar = llg.compile("json_schema", json.dumps(ONE_SIDED))

    def allowed_after(text: str) -> set[str]:
        m = grammar.matcher()
        assert _walk(m, byte_tokenizer, text, model_vocab_size) == -1
        mask = torch.zeros(model_vocab_size, dtype=torch.bool)
        m.fill_allowed_mask(mask)
        return {byte_tokenizer.decode([t]) for t in torch.nonzero(mask).flatten().tolist()}

    assert "-" not in allowed_after('{"ratio": ') and "1" in allowed_after('{"ratio": ')
    # 0 is out, and so is 0e5: only a fraction may follow (JSON has no digit after a leading 0).
    assert allowed_after('{"ratio": 0') == {"."}
    assert {",", "}"} <= allowed_after('{"ratio": 0.1')
    # Under minimum 1000: 1e-k <= 1 for every k, while 2000e-0 = 2000 but 2000e-1... <= 200.
    assert "+" in allowed_after('{"timeout": 1e') and "-" not in allowed_after('{"timeout": 1e')
    assert "0" in allowed_after('{"timeout": 2000e-') and "1" not in allowed_after('{"timeout": 2000e-')
    assert "-" in allowed_after('{"limit": ') and "0" not in allowed_after('{"limit": ')


def test_rollback_and_copy_keep_the_reader(llg, byte_tokenizer, model_vocab_size):
    grammar = llg.compile("json_schema", json.dumps(ONE_SIDED))
    m = grammar.matcher()
    ids = byte_tokenizer.encode('{"ratio": 0', add_special_tokens=False)
    assert all(m.accept_token(t) for t in ids)
    twin = m.copy()
    comma = byte_tokenizer.encode(",", add_special_tokens=False)[0]
    assert not m.accept_token(comma) and not twin.accept_token(comma)
    m.rollback(1)  # back to `{"ratio": `: 0 may start the number again, `-` may not
    assert m.accept_token(ids[-1])
    m.rollback(1)
    assert not m.accept_token(byte_tokenizer.encode("-", add_special_tokens=False)[0])


def _generate(model_dir, schema, bias) -> list[dict]:
    params = [{"max_new_tokens": 48, "temperature": t, "sampling_seed": i, "json_schema": json.dumps(schema),
               "logit_bias": bias} for i, t in enumerate([0.0, 1.0, 1.0, 1.0])]
    with Engine(str(model_dir), max_total_tokens=8192, grammar_num_workers=1, grammar_backend="llguidance") as eng:
        results = eng.generate(["A", "B", "C", "D"], params)
        eng.check_integrity()
    return results


def test_engine_keeps_numbers_inside_one_sided_bounds(tiny_llama_dir, monkeypatch):
    """A logit bias pushes the random model towards `-`; the number layer keeps `ratio` (> 0) positive."""
    from transformers import AutoTokenizer

    schema = {"type": "object", "properties": {"ratio": {"type": "number", "exclusiveMinimum": 0}},
              "required": ["ratio"], "additionalProperties": False}
    tok = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    bias = {tok.convert_tokens_to_ids(t): 30.0 for t in ("-",) if tok.convert_tokens_to_ids(t) is not None}
    assert bias
    texts = []
    for r in _generate(tiny_llama_dir, schema, bias):
        texts.append(r["text"])
        if r["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(r["text"]), schema)
            assert r["meta_info"]["json_schema_valid"] is True
        assert '"ratio": -' not in r["text"] and '"ratio":-' not in r["text"], r["text"]
    # The same requests without the layer: the bias writes a negative ratio (the test has teeth).
    monkeypatch.setattr("radixlm.constrained.llguidance_backend.MARK", "\x00no-mark\x00")
    plain = [r["text"] for r in _generate(tiny_llama_dir, schema, bias)]
    assert any('"ratio": -' in t or '"ratio":-' in t for t in plain), plain
