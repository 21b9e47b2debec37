"""The llguidance backend behind the same interface: masks against the outlines backend, accept /
rollback / copy, EOS rules, jump-forward, errors, compiles in worker processes, and the corpus walks."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from radixlm.constrained import GrammarError, GrammarOptions, make_backend
from radixlm.constrained.bitmask import num_words
from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig
from radixlm.constrained.simulate import random_walk
from tests.constrained.corpus.schemas import REGEXES, SCHEMAS, check_output

pytest.importorskip("llguidance")

# Corpus schemas whose walks the simulator cannot finish or check with the outlines semantics:
#  * JSON Schema `pattern` is a search, not a full match: llguidance allows text around the match, and the
#    simulator's closers-first steering loops inside such a string (`"zip": "}}}}..."`);
#  * llguidance's formats are RFC 3339 / RFC 5321 (lower-case `t` / `z` in times, a dot-less e-mail
#    domain), broader than the corpus's stdlib checks; such outputs still pass jsonschema.
UNANCHORED_PATTERN = {"nested", "invoice"}
FORMATS = {"format_datetime", "format_time", "format_email", "format_uri"}


@pytest.fixture(scope="module")
def lg(byte_tokenizer, model_vocab_size):
    return {style: make_backend("llguidance", byte_tokenizer, model_vocab_size, GrammarOptions(compact=style == "compact"))
            for style in ("default", "compact")}


def _allowed(matcher, size: int) -> set[int]:
    mask = torch.zeros(size, dtype=torch.bool)
    matcher.fill_allowed_mask(mask)
    return set(mask.nonzero().flatten().tolist())


def test_interface(lg, byte_tokenizer, model_vocab_size):
    ids = byte_tokenizer.convert_tokens_to_ids
    eos = byte_tokenizer.eos_token_id
    matcher = lg["default"].compile("regex", "abc(x|y)").matcher()
    assert matcher.jump_forward() == "abc"
    assert _allowed(matcher, model_vocab_size) == {ids("a")}
    assert not matcher.accept_token(ids("b")) and not matcher.accept_token(eos)
    assert not matcher.accept_token(model_vocab_size + 3) and not matcher.accept_token(model_vocab_size - 1)
    assert _allowed(matcher, model_vocab_size) == {ids("a")}  # refused tokens left the state unchanged
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
    assert matcher.accept_token(eos) and matcher.is_terminated() and not matcher.accept_token(eos)
    matcher.rollback(2)  # EOS counts as a token
    assert not matcher.is_terminated() and _allowed(matcher, model_vocab_size) == {ids("x"), ids("y")}
    with pytest.raises(ValueError):
        matcher.rollback(4)


def test_eos_only_when_complete(lg, byte_tokenizer, model_vocab_size):
    ids = byte_tokenizer.convert_tokens_to_ids
    eos = byte_tokenizer.eos_token_id
    matcher = lg["default"].compile("regex", "[0-9]{2,3}").matcher()
    assert matcher.accept_token(ids("1")) and not matcher.is_accepting()
    assert eos not in _allowed(matcher, model_vocab_size) and not matcher.accept_token(eos)
    assert matcher.accept_token(ids("2")) and matcher.is_accepting()
    assert eos in _allowed(matcher, model_vocab_size) and not matcher.is_terminated()
    assert matcher.accept_token(eos) and matcher.is_terminated()
    assert _allowed(matcher, model_vocab_size) == {eos}


def test_specials_and_padding_never_allowed(lg, byte_tokenizer, model_vocab_size):
    matcher = lg["default"].compile("json_schema", json.dumps({"type": "string"})).matcher()
    assert matcher.accept_token(byte_tokenizer.convert_tokens_to_ids('"'))
    allowed = _allowed(matcher, model_vocab_size)
    assert len(allowed) > 100 and max(allowed) < len(byte_tokenizer)
    assert not allowed & set(byte_tokenizer.all_special_ids)


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_masks_equal_outlines_along_walks(lg, backends, byte_tokenizer, model_vocab_size, name):
    """The reference: outlines-core's token automaton of the same regex, fed the same tokens. Where text is
    forced, llguidance allows only the tokens of the forced bytes' canonical tokenization (`be`, not
    `b` + `e`), a subset; everywhere else both allow exactly the same tokens."""
    ref = backends["default"].compile("regex", REGEXES[name])
    for seed in range(2):
        mine = lg["default"].compile("regex", REGEXES[name]).matcher()
        walk = random_walk(mine, byte_tokenizer, model_vocab_size, seed=seed, jump_forward=False)
        assert walk.finished and re.fullmatch(REGEXES[name], walk.text), walk.text
        a, b = lg["default"].compile("regex", REGEXES[name]).matcher(), ref.matcher()
        for token in walk.token_ids:
            mine, want = _allowed(a, model_vocab_size), _allowed(b, model_vocab_size)
            assert mine == want if a.jump_forward() is None else mine <= want and mine
            assert a.is_accepting() == b.is_accepting()
            assert a.accept_token(token) and b.accept_token(token)


def test_bitmask_and_cpu_mask_equal_bool_mask(lg, byte_tokenizer, model_vocab_size):
    """fill_bitmask (llguidance's words straight into a row, or copied into a wider one) and cpu_mask
    (an id list when few tokens are allowed) == fill_allowed_mask at every step; padding never set."""
    from radixlm.kernels.grammar_mask import unpack_bitmask

    seen = {"list": 0, "none": 0}

    def compare(matcher) -> None:
        want = torch.zeros(model_vocab_size, dtype=torch.bool)
        matcher.fill_allowed_mask(want)
        for extra, fresh in ((0, True), (2, False), (0, False)):
            probe = matcher.copy() if fresh else matcher  # a copy has not filled its own row yet
            words = torch.full((num_words(model_vocab_size) + extra,), -1, dtype=torch.int32)
            probe.fill_bitmask(words)
            got = unpack_bitmask(words.unsqueeze(0), words.shape[0] * 32)[0]
            assert torch.equal(got[:model_vocab_size], want) and not got[model_vocab_size:].any()
        plan = matcher.cpu_mask()
        if plan is None:
            seen["none"] += 1
            assert int(want.sum()) > 512
        else:
            seen["list"] += 1
            assert plan.ids.tolist() == want.nonzero().flatten().tolist()

    for name in ("enum_strings", "integer_bounds", "array_min_max", "person"):
        grammar = lg["default"].compile("json_schema", json.dumps(SCHEMAS[name]))
        random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=0, on_step=compare)
    assert seen["list"] > 10


@pytest.mark.parametrize("style", ["default", "compact"])
@pytest.mark.parametrize("name", sorted(set(SCHEMAS) - UNANCHORED_PATTERN))
def test_corpus_schemas(lg, byte_tokenizer, model_vocab_size, name, style):
    schema = SCHEMAS[name]
    grammar = lg[style].compile("json_schema", json.dumps(schema))
    for seed in range(3):
        for jump in (True, False):
            res = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed, jump_forward=jump)
            if name in FORMATS and not res.finished:
                continue  # free strings the steering cannot close (see FORMATS)
            assert res.finished, res.text
            if name in FORMATS:
                jsonschema.validate(json.loads(res.text), schema)
            else:
                check_output("json_schema", name, res.text)
            if style == "compact":
                value = json.loads(res.text)  # no space outside strings
                assert json.dumps(value, ensure_ascii=False, separators=(",", ":")).count(" ") >= res.text.count(" ")
            else:
                assert "  " not in re.sub(r'"(\\.|[^"\\])*"', '""', res.text)  # `[ ]?`: at most one space


def test_whitespace_pattern_is_honoured(byte_tokenizer, model_vocab_size):
    ids = byte_tokenizer.convert_tokens_to_ids
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    compact = make_backend("llguidance", byte_tokenizer, model_vocab_size, GrammarOptions(compact=True))
    assert compact.compile("json_schema", schema).matcher().jump_forward() == '{"a":'
    newline = make_backend("llguidance", byte_tokenizer, model_vocab_size, GrammarOptions(whitespace_pattern=r"[\n]?"))
    matcher = newline.compile("json_schema", schema).matcher()
    assert matcher.accept_token(ids("{"))
    allowed = _allowed(matcher, model_vocab_size)
    assert ids("Ċ") in allowed and ids("Ġ") not in allowed  # byte-level names of "\n" and " "


def test_jump_forward_saves_decode_steps_on_compact_json(lg, byte_tokenizer, model_vocab_size):
    on = off = 0
    for name in ("tool_call", "person", "defs_ref", "const_in_object"):
        grammar = lg["compact"].compile("json_schema", json.dumps(SCHEMAS[name]))
        for seed in range(3):
            a = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed, jump_forward=True)
            b = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed, jump_forward=False)
            assert a.finished and b.finished
            jsonschema.validate(json.loads(a.text), SCHEMAS[name])
            on, off = on + a.num_steps, off + b.num_steps
    assert on <= 0.75 * off, (on, off)


def test_choices_ebnf_and_errors(lg, byte_tokenizer, model_vocab_size):
    choices = ["yes", 'say "hi"', "日本"]
    grammar = lg["default"].compile("choices", json.dumps(choices))
    for seed in range(4):
        assert random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed).text in choices
    obj = lg["compact"].compile("json_object", "")
    assert isinstance(json.loads(random_walk(obj.matcher(), byte_tokenizer, model_vocab_size, seed=0).text), dict)
    bad = [("regex", "(a", "regex", "invalid_grammar"), ("regex", "a" * 5000, "regex", "grammar_too_large"),
           ("json_schema", '{"$ref": "https://example.com/s.json"}', "json_schema", "invalid_grammar"),
           ("json_schema", "{not json", "json_schema", "invalid_grammar"),
           ("json_schema", '{"type": "strnig"}', "json_schema", "invalid_grammar"),
           ("choices", "[]", "choices", "invalid_grammar"),
           ("ebnf", 'root ::= ("a"', "ebnf", "invalid_grammar"), ("ebnf", "start: foo", "ebnf", "invalid_grammar")]
    for kind, spec, param, code in bad:
        with pytest.raises(GrammarError) as info:
            lg["default"].compile(kind, spec)
        assert (info.value.param, info.value.code) == (param, code), (kind, spec, info.value.to_dict())
        assert ".rs" not in info.value.message and "\n" not in info.value.message
    with pytest.raises(GrammarError, match="unclosed group"):
        lg["default"].compile("regex", "(a")
    with pytest.raises(GrammarError, match="foo"):
        lg["default"].compile("ebnf", "start: foo")


def test_compiles_in_worker_processes(lg):
    with GrammarCache(lg["compact"], GrammarCacheConfig(num_workers=1)) as cache:
        grammar = cache.submit("json_schema", json.dumps(SCHEMAS["const_in_object"])).result(timeout=120)
        # (no additionalProperties: false, so another key may follow: llguidance does not force the `}`)
        assert grammar.matcher().jump_forward() == '{"version":2,"kind":"doc"'
        ebnf = cache.submit("ebnf", 'root ::= "x" [0-9]+').result(timeout=120)
        assert ebnf.matcher().jump_forward() == "x"
        with pytest.raises(GrammarError) as info:
            cache.submit("regex", "(a").result(timeout=120)
        assert info.value.code == "invalid_grammar" and info.value.param == "regex"


@pytest.mark.slow
def test_real_tokenizer_walks_and_jump_forward():
    from radixlm.runtime.model.loader import load_tokenizer

    tok = load_tokenizer(None)  # SmolLM2 (49152 tokens), cached per machine
    backend = make_backend("llguidance", tok, 49152, GrammarOptions(compact=True))
    ref = make_backend("outlines", tok, 49152, GrammarOptions(compact=True))
    for name in ("tool_call", "person", "latlon"):
        grammar = backend.compile("json_schema", json.dumps(SCHEMAS[name]))
        for seed in range(2):
            walk = random_walk(grammar.matcher(), tok, 49152, seed=seed, jump_forward=True)
            assert walk.finished and walk.num_jumps > 0
            jsonschema.validate(json.loads(walk.text), SCHEMAS[name])
            assert tok.decode(walk.token_ids, skip_special_tokens=True) == walk.text
    for name in ("date", "email", "unicode_words"):  # masks as outlines' on a 49k vocabulary (see above)
        a = backend.compile("regex", REGEXES[name]).matcher()
        b = ref.compile("regex", REGEXES[name]).matcher()
        walk = random_walk(backend.compile("regex", REGEXES[name]).matcher(), tok, 49152, seed=0, jump_forward=False)
        for token in walk.token_ids:
            mine, want = _allowed(a, 49152), _allowed(b, 49152)
            assert mine == want if a.jump_forward() is None else mine <= want and mine, name
            assert a.accept_token(token) and b.accept_token(token)


def test_property_named_ref_is_not_a_reference(lg, byte_tokenizer, model_vocab_size):
    schema = {"type": "object", "properties": {"$ref": {"type": "string", "maxLength": 5}}, "required": ["$ref"],
              "additionalProperties": False}
    grammar = lg["compact"].compile("json_schema", json.dumps(schema))
    assert grammar.matcher().jump_forward() == '{"$ref":"'
    res = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=0)
    assert res.finished and jsonschema.validate(json.loads(res.text), schema) is None
