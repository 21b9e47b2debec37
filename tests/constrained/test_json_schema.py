"""Schema / regex / choices errors (robustness.md cases) and the numeric-bounds regexes."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.constrained import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError, GrammarOptions
from radixlm.constrained.json_schema import json_depth, schema_to_regex
from radixlm.constrained.number_range import bounded_number_regex, int_range_regex
from radixlm.constrained.specs import build_index_bytes, regex_for_spec

OPTS = GrammarOptions()


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


BAD_SCHEMAS = [
    ("{not json", INVALID_GRAMMAR, "not valid JSON"),
    ("[1, 2]", INVALID_GRAMMAR, "must be a JSON object"),
    ('{"type": 5}', INVALID_GRAMMAR, "not a valid JSON schema"),
    ('{"type": "object", "properties": {"a": {"minLength": -1}}}', INVALID_GRAMMAR, "minLength"),
    ('{"$ref": "https://example.com/schema.json"}', INVALID_GRAMMAR, "external $ref"),
    ('{"$ref": "other.json#/a"}', INVALID_GRAMMAR, "external $ref"),
    ('{"$id": "https://a.com/s.json", "$ref": "https://b.com/s.json#/x"}', INVALID_GRAMMAR, "external $ref"),
    ('{"$ref": "#/$defs/missing"}', INVALID_GRAMMAR, "does not resolve"),
    ('{"type": "integer", "minimum": 5, "maximum": 4}', INVALID_GRAMMAR, "admit no value"),
    ('{"allOf": [{"const": 1}, {"const": 2}]}', INVALID_GRAMMAR, "const/enum values"),
    ('{"allOf": [{"type": "string"}, {"type": "integer"}]}', INVALID_GRAMMAR, "no value in common"),
    ('{"not": {}}', INVALID_GRAMMAR, "admits no value"),
    # BFCL's live functions hold this: an enum meant for the items, written beside `type: array`.
    ('{"type": "object", "properties": {"m": {"type": "array", "enum": ["a"]}}, "required": ["m"]}', INVALID_GRAMMAR,
     "no value of the enum at #/properties/m matches its other keywords"),
    (json.dumps(_nested(40)), GRAMMAR_TOO_LARGE, "deeper than 32"),
    (json.dumps({"enum": ["x" * 1000] * 1100}), GRAMMAR_TOO_LARGE, "larger than 1048576"),
]


@pytest.mark.parametrize("spec,code,needle", BAD_SCHEMAS)
def test_bad_schemas_give_clear_errors(spec, code, needle):
    with pytest.raises(GrammarError) as info:
        schema_to_regex(spec, OPTS)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.param, err.code) == ("json_schema", code)
    assert needle in err.message, err.message
    assert "Traceback" not in err.message and "/work" not in err.message


def test_free_form_objects_stay_fast():
    """`additionalProperties: true` is the default: it must not switch to the slow 2-level regex."""
    assert schema_to_regex('{"type": "object", "additionalProperties": true}', OPTS) == \
        schema_to_regex('{"type": "object"}', OPTS)


def test_depth_limit_is_exact_and_counts_brackets_outside_strings():
    ok = json.dumps(_nested(15))  # 2 brackets per level + root
    assert json_depth(ok) <= 32
    schema_to_regex(ok, OPTS)
    assert json_depth('{"a": "[[[[{{{{"}') == 1


@pytest.mark.parametrize("regex,needle", [("(a", "invalid regex"), ("a)|(b", "invalid regex"),
                                          ("(?=a)b", "lookaround"), (r"(a)\1", "backreferences")])
def test_bad_regexes(byte_vocab_bytes, regex, needle):
    with pytest.raises(GrammarError) as info:
        build_index_bytes("regex", regex, OPTS, byte_vocab_bytes)
    assert (info.value.param, info.value.code) == ("regex", INVALID_GRAMMAR) and needle in info.value.message


def test_oversized_regex_and_bad_choices_and_kinds():
    with pytest.raises(GrammarError) as info:
        regex_for_spec("regex", "a" * 5000, OPTS)
    assert info.value.code == GRAMMAR_TOO_LARGE
    for spec in ("[]", '["a", 1]', "not json", '"a"'):
        with pytest.raises(GrammarError) as info:
            regex_for_spec("choices", spec, OPTS)
        assert info.value.param == "choices" and info.value.code == INVALID_GRAMMAR
    with pytest.raises(GrammarError) as info:
        regex_for_spec("ebnf", "root ::= 'a'", OPTS)
    assert info.value.param == "ebnf"


def test_choices_are_literal(byte_vocab_bytes):
    regex = regex_for_spec("choices", json.dumps(["a.b", "(x)|y", "c*", "-~#&"]), OPTS)
    for text in ("a.b", "(x)|y", "c*", "-~#&"):
        assert re.fullmatch(regex, text)
    assert not re.fullmatch(regex, "axb") and not re.fullmatch(regex, "y")
    build_index_bytes("choices", json.dumps(["a.b", "(x)|y", "c*", "-~#&", "with space"]), OPTS, byte_vocab_bytes)


def test_whitespace_pattern_option():
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    assert re.fullmatch(schema_to_regex(schema, GrammarOptions(compact=True)), '{"a":1}')
    assert not re.fullmatch(schema_to_regex(schema, GrammarOptions(compact=True)), '{ "a":1}')
    custom = schema_to_regex(schema, GrammarOptions(whitespace_pattern=r"[\n ]{0,2}"))
    assert re.fullmatch(custom, '{\n "a" :\n1}')


@pytest.fixture(scope="module")
def byte_vocab_bytes():
    from radixlm.constrained.vocabulary import TokenBytes, outlines_vocabulary_bytes

    return outlines_vocabulary_bytes(TokenBytes(tuple(bytes([b]) for b in range(1, 256)) + (None,), 255, True))


@settings(max_examples=300, deadline=None)
@given(lo=st.integers(0, 10**6), span=st.integers(0, 10**6), probes=st.lists(st.integers(0, 3 * 10**6), max_size=20))
def test_int_range_regex_matches_exactly_the_range(lo, span, probes):
    hi = lo + span
    regex = re.compile(int_range_regex(lo, hi))
    for n in probes + [lo, hi, lo - 1, hi + 1, 0]:
        if n >= 0:
            assert bool(regex.fullmatch(str(n))) == (lo <= n <= hi), (lo, hi, n)
    assert not regex.fullmatch("0" + str(lo))  # never with a leading zero


NUMBER_TEXT = st.one_of(st.integers(-2000, 2000).map(str),
                        st.tuples(st.integers(-2000, 2000), st.integers(0, 999)).map(lambda t: f"{t[0]}.{t[1]}"))


@settings(max_examples=300, deadline=None)
@given(lo=st.none() | st.integers(-1000, 1000), hi=st.none() | st.integers(-1000, 1000),
       lo_excl=st.booleans(), hi_excl=st.booleans(), integer=st.booleans(), probes=st.lists(NUMBER_TEXT, max_size=15))
def test_bounded_number_regex_matches_exactly_the_interval(lo, hi, lo_excl, hi_excl, integer, probes):
    regex = bounded_number_regex(lo, lo_excl, hi, hi_excl, integer)
    for text in probes:
        x = float(text)
        if text.startswith("-") and x == 0:
            continue  # "-0" / "-0.5" style spellings of zero are never produced
        if integer and "." in text:
            continue
        inside = (lo is None or (x > lo if lo_excl else x >= lo)) and (hi is None or (x < hi if hi_excl else x <= hi))
        assert (regex is not None and re.fullmatch(regex, text) is not None) == inside, (text, regex)
