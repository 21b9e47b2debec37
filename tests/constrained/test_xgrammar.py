"""The optional xgrammar backend behind the same interface (skipped when xgrammar is not installed).

Measured on the corpus (benchmarks/bench_grammar.py --backend xgrammar), xgrammar 0.2.9 lets raw
control characters and UTF-8-encoded surrogates into JSON strings, so outlines stays the default;
these tests cover the interface and the specs whose strings are fully constrained.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from radixlm.constrained import GrammarError, GrammarOptions, make_backend
from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig
from radixlm.constrained.simulate import random_walk
from tests.constrained.corpus.schemas import REGEXES, SCHEMAS

pytest.importorskip("xgrammar")

# Corpus schemas without free-form strings (enums, consts, numbers, booleans, bounded structure).
CONSTRAINED = ["enum_strings", "enum_mixed", "enum_prefixes", "const_string", "const_in_object", "integer_bounds",
               "integer_negative_bounds", "integer_exclusive", "array_min_max", "array_exact", "latlon",
               "anyof_objects", "boolean_or_null", "number_bounds", "definitions_ref_chain"]


@pytest.fixture(scope="module")
def xg(byte_tokenizer, model_vocab_size):
    return {style: make_backend("xgrammar", byte_tokenizer, model_vocab_size, GrammarOptions(compact=style == "compact"))
            for style in ("default", "compact")}


def _allowed(matcher, size: int) -> set[int]:
    mask = torch.zeros(size, dtype=torch.bool)
    matcher.fill_allowed_mask(mask)
    return set(mask.nonzero().flatten().tolist())


def test_interface(xg, byte_tokenizer, model_vocab_size):
    ids = byte_tokenizer.convert_tokens_to_ids
    eos = byte_tokenizer.eos_token_id
    matcher = xg["default"].compile("regex", "abc(x|y)").matcher()
    assert matcher.jump_forward() == "abc"
    assert _allowed(matcher, model_vocab_size) == {ids("a")}
    assert not matcher.accept_token(ids("b")) and not matcher.accept_token(eos)
    for ch in "abc":
        assert matcher.accept_token(ids(ch))
    assert matcher.jump_forward() is None and not matcher.is_accepting()
    twin = matcher.copy()
    assert matcher.accept_token(ids("x")) and matcher.is_accepting()
    assert _allowed(matcher, model_vocab_size) == {eos}
    assert _allowed(twin, model_vocab_size) == {ids("x"), ids("y")}
    matcher.rollback(1)
    assert _allowed(matcher, model_vocab_size) == {ids("x"), ids("y")}
    assert matcher.accept_token(ids("y")) and matcher.is_terminated()  # nothing can follow
    assert matcher.accept_token(eos) and matcher.is_terminated()


def test_specials_and_padding_never_allowed(xg, byte_tokenizer, model_vocab_size):
    matcher = xg["default"].compile("json_schema", json.dumps({"type": "string"})).matcher()
    assert matcher.accept_token(byte_tokenizer.convert_tokens_to_ids('"'))
    allowed = _allowed(matcher, model_vocab_size)
    assert len(allowed) > 100 and max(allowed) < len(byte_tokenizer)
    assert not allowed & set(byte_tokenizer.all_special_ids)


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_corpus(xg, byte_tokenizer, model_vocab_size, name):
    grammar = xg["default"].compile("regex", REGEXES[name])
    for seed in range(3):
        for jump in (True, False):
            res = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed, jump_forward=jump)
            assert res.finished and re.fullmatch(REGEXES[name], res.text), res.text


@pytest.mark.parametrize("style", ["default", "compact"])
@pytest.mark.parametrize("name", CONSTRAINED)
def test_constrained_schemas(xg, byte_tokenizer, model_vocab_size, name, style):
    schema = SCHEMAS[name]
    grammar = xg[style].compile("json_schema", json.dumps(schema))
    for seed in range(3):
        for jump in (True, False):
            res = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed, jump_forward=jump)
            assert res.finished, res.text
            jsonschema.validate(json.loads(res.text), schema)


def test_choices_ebnf_and_errors(xg, byte_tokenizer, model_vocab_size):
    choices = ["yes", 'say "hi"', "日本"]
    grammar = xg["default"].compile("choices", json.dumps(choices))
    for seed in range(4):
        assert random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed).text in choices
    ebnf = xg["default"].compile("ebnf", 'root ::= "a" ("b" | "c")')
    assert random_walk(ebnf.matcher(), byte_tokenizer, model_vocab_size, seed=0).text in ("ab", "ac")
    with pytest.raises(GrammarError) as info:
        xg["default"].compile("regex", "(a")
    assert info.value.param == "regex" and ".cc" not in info.value.message and "parenthesis" in info.value.message
    with pytest.raises(GrammarError, match="external"):
        xg["default"].compile("json_schema", '{"$ref": "https://example.com/s.json"}')


def test_compiles_in_worker_processes(xg):
    with GrammarCache(xg["compact"], GrammarCacheConfig(num_workers=1)) as cache:
        grammar = cache.submit("json_schema", json.dumps(SCHEMAS["const_in_object"])).result(timeout=120)
        assert grammar.matcher().jump_forward() == '{"version":2,"kind":"doc"}'
        with pytest.raises(GrammarError):
            cache.submit("regex", "(a").result(timeout=120)


def test_packed_bitmask_equals_bool_mask_along_walks(xg, byte_tokenizer, model_vocab_size):
    """fill_bitmask (xgrammar's native words, AND the usable tokens) == fill_allowed_mask at every step,
    into a row of a wider buffer and into an exact one; padding ids never set."""
    from radixlm.constrained.bitmask import num_words
    from radixlm.kernels.grammar_mask import unpack_bitmask

    steps = [0]

    def compare(matcher) -> None:
        want = torch.zeros(model_vocab_size, dtype=torch.bool)
        matcher.fill_allowed_mask(want)
        for extra in (0, 2):
            words = torch.full((num_words(model_vocab_size) + extra,), -1, dtype=torch.int32)
            matcher.fill_bitmask(words)
            got = unpack_bitmask(words.unsqueeze(0), (num_words(model_vocab_size) + extra) * 32)[0]
            assert torch.equal(got[:model_vocab_size], want) and not got[model_vocab_size:].any()
        steps[0] += 1

    for name in ("enum_strings", "integer_bounds", "array_min_max"):
        grammar = xg["default"].compile("json_schema", json.dumps(SCHEMAS[name]))
        random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=0, on_step=compare)
    assert steps[0] > 10
