"""Matcher unit tests on hand-made vocabularies: masks against a brute-force reference, accept,
rollback, EOS, copy, padding and jump-forward strings."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch

from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained import fsm as fsm_module

ALPHABET = "abcxy"
MAX_LEN = 6
FINITE_REGEXES = ["(a|ab|abc)(x|xy)?", "(ab){1,3}", "a(b|c)?x?", "abc|abx|ay", "(ab)?(ab)?c", "x{0,3}y?a"]


def _language(regex: str) -> set[str]:
    return {"".join(p) for n in range(MAX_LEN + 1) for p in itertools.product(ALPHABET, repeat=n)
            if re.fullmatch(regex, "".join(p))}


def _allowed(matcher, size: int) -> set[int]:
    mask = torch.zeros(size, dtype=torch.bool)
    matcher.fill_allowed_mask(mask)
    return set(mask.nonzero().flatten().tolist())


@pytest.fixture(scope="module")
def sp_backend(sp_tokenizer):
    return make_backend("outlines", sp_tokenizer, len(sp_tokenizer) + 5, GrammarOptions())


@pytest.mark.parametrize("regex", FINITE_REGEXES)
def test_masks_equal_brute_force_reference(sp_backend, sp_tokenizer, regex):
    """Every reachable state: token t allowed <=> prefix + t is a prefix of the language; EOS <=> in it."""
    language = _language(regex)
    prefixes = {s[:i] for s in language for i in range(len(s) + 1)}
    table, size, eos = sp_backend.table, sp_backend.vocab_size, sp_tokenizer.eos_token_id
    stack = [("", sp_backend.compile("regex", regex).matcher())]
    visited = 0
    while stack:
        text, matcher = stack.pop()
        visited += 1
        expected = {t for t, b in enumerate(table.token_bytes)
                    if b is not None and (text.encode() + b).decode("latin-1") in prefixes}
        if text in language:
            expected.add(eos)
        assert _allowed(matcher, size) == expected, (regex, text)
        assert matcher.is_accepting() == (text in language)
        for t in expected - {eos}:
            child = matcher.copy()
            assert child.accept_token(t)
            stack.append((text + table.token_bytes[t].decode(), child))
    assert visited > len(language)


def test_leftmost_alternatives_and_repeats_are_complete(backends, byte_tokenizer):
    # outlines-core alone loses `ab` in `a|ab` and the second `ab` of `(ab)+` (see fsm.py)
    for regex, text in (("a|ab", "ab"), ("(ab)+", "ababab"), ("a(bc)?", "abc")):
        matcher = backends["default"].compile("regex", regex).matcher()
        for ch in text:
            assert matcher.accept_token(byte_tokenizer.convert_tokens_to_ids(ch)), (regex, ch)
        assert matcher.is_accepting()


def test_accept_refuse_rollback_and_copy(sp_backend, sp_tokenizer):
    ids = sp_tokenizer.get_vocab()
    size = sp_backend.vocab_size
    matcher = sp_backend.compile("regex", "abcx(y|a)").matcher()
    start = _allowed(matcher, size)
    assert not matcher.accept_token(ids["x"])  # not allowed: state unchanged
    assert _allowed(matcher, size) == start
    assert matcher.accept_token(ids["ab"]) and matcher.accept_token(ids["c"])
    after_c = _allowed(matcher, size)
    twin = matcher.copy()
    assert matcher.accept_token(ids["x"])
    assert _allowed(twin, size) == after_c  # the copy did not move
    matcher.rollback(1)
    assert _allowed(matcher, size) == after_c
    matcher.rollback(2)
    assert _allowed(matcher, size) == start
    with pytest.raises(ValueError):
        matcher.rollback(1)


def test_eos_only_in_accepting_states_and_terminates(sp_backend, sp_tokenizer):
    ids, eos, size = sp_tokenizer.get_vocab(), sp_tokenizer.eos_token_id, sp_backend.vocab_size
    matcher = sp_backend.compile("regex", "ab(c)?").matcher()
    assert not matcher.accept_token(eos)
    assert matcher.accept_token(ids["ab"])
    assert matcher.is_accepting() and not matcher.is_terminated()
    assert eos in _allowed(matcher, size)
    assert matcher.accept_token(eos)
    assert matcher.is_terminated()
    assert not matcher.accept_token(ids["c"]) and not matcher.accept_token(eos)
    assert _allowed(matcher, size) == {eos}
    matcher.rollback(1)  # undoing EOS reopens the request
    assert not matcher.is_terminated() and matcher.accept_token(ids["c"])
    assert matcher.is_terminated() and matcher.is_accepting()  # nothing can follow "abc"


def test_padding_and_specials_never_allowed_in_every_mask_layout(byte_tokenizer, model_vocab_size, monkeypatch):
    """Cached rows, the complement list (most tokens allowed) and the id list (few allowed) agree."""
    n_tok = len(byte_tokenizer)
    masks: dict[str, list[set[int]]] = {"row": [], "ids": []}
    for layout, budget in (("row", fsm_module.ROW_BUDGET_BYTES), ("ids", 0)):
        monkeypatch.setattr(fsm_module, "ROW_BUDGET_BYTES", budget)
        backend = make_backend("outlines", byte_tokenizer, model_vocab_size, GrammarOptions())
        matcher = backend.compile("json_schema", json.dumps({"type": "string", "maxLength": 3})).matcher()
        for text in ('"', "a", "b"):  # string content: most of the vocabulary is allowed
            assert matcher.accept_token(byte_tokenizer.convert_tokens_to_ids(text))
            allowed = _allowed(matcher, model_vocab_size)
            assert len(allowed) > 100 and max(allowed) < n_tok
            assert not allowed & set(byte_tokenizer.all_special_ids)
            masks[layout].append(allowed)
        assert matcher.accept_token(byte_tokenizer.convert_tokens_to_ids("c"))
        masks[layout].append(_allowed(matcher, model_vocab_size))  # only the closing quote
        assert masks[layout][-1] == {byte_tokenizer.convert_tokens_to_ids('"')}
    assert masks["row"] == masks["ids"]


def test_mask_wider_than_the_model_vocab(backends, byte_tokenizer, model_vocab_size):
    """A logits row may be wider than the vocab the backend was built for: the excess stays False."""
    matcher = backends["default"].compile("regex", "[a-c]+").matcher()
    for _ in range(2):  # the first fill builds the state's cached row, the second reuses it
        mask = torch.ones(model_vocab_size + 40, dtype=torch.bool)
        matcher.fill_allowed_mask(mask)
        allowed = set(mask.nonzero().flatten().tolist())
        assert allowed == {byte_tokenizer.convert_tokens_to_ids(c) for c in "abc"}


def test_jump_forward_strings(sp_backend, sp_tokenizer, backends, byte_tokenizer):
    ids = sp_tokenizer.get_vocab()
    matcher = sp_backend.compile("regex", "abc(x|y)").matcher()
    assert matcher.jump_forward() == "abc"
    assert matcher.accept_token(ids["a"]) and matcher.jump_forward() == "bc"
    assert matcher.accept_token(ids["b"]) and matcher.accept_token(ids["c"])
    assert matcher.jump_forward() is None  # x or y: a branch
    repeat = sp_backend.compile("regex", "(ab)+c?").matcher()
    assert repeat.accept_token(ids["ab"]) and repeat.jump_forward() is None  # accepting: EOS is an option
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
    compact = backends["compact"].compile("json_schema", schema).matcher()
    assert compact.jump_forward() == '{"name":"'
    assert backends["default"].compile("json_schema", schema).matcher().jump_forward() == "{"
    off = make_backend("outlines", sp_tokenizer, 300, GrammarOptions(jump_forward=False))
    assert off.compile("regex", "abc(x|y)").matcher().jump_forward() is None


def test_jump_forward_respects_utf8_boundaries(backends, byte_tokenizer):
    table = backends["default"].table
    byte_id = {b[0]: i for i, b in enumerate(table.token_bytes) if b is not None and len(b) == 1}
    matcher = backends["default"].compile("regex", "ab日本x").matcher()
    assert matcher.accept_token(byte_id[ord("a")]) and matcher.jump_forward() == "b日本x"
    assert matcher.accept_token(byte_id[ord("b")])
    assert matcher.accept_token(byte_id["日".encode()[0]])
    assert matcher.jump_forward() is None  # inside a character: the forced text is not a str
    assert matcher.accept_token(byte_id["日".encode()[1]]) and matcher.accept_token(byte_id["日".encode()[2]])
    assert matcher.jump_forward() == "本x"
    branch = backends["default"].compile("regex", "a(éx|èy)").matcher()
    assert branch.accept_token(byte_id[ord("a")])
    assert branch.jump_forward() is None  # é and è share only their first byte
