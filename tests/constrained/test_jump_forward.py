"""jump_forward_tokens: decode(output[:-drop] + new) == decode(output) + forced, and the matcher stays
consistent when rolled back over `drop` and re-advanced over `new` (tiny and real tokenizers)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained.jump_forward import apply_jump_forward, jump_forward_tokens
from radixlm.constrained.simulate import random_walk
from radixlm.constrained.vocabulary import token_bytes_for
from tests.constrained.corpus.schemas import SCHEMAS

CHARS = list('abcxy {}[]":,.-_0123456789\nThe quick fox éü日本😀') + ["name", "capital", " the"]
TEXT = st.lists(st.sampled_from(CHARS), max_size=12).map("".join)


def _check(tokenizer, output_ids: list[int], forced: str, max_back: int = 8) -> tuple[int, list[int]]:
    table = token_bytes_for(tokenizer)
    drop, new = jump_forward_tokens(tokenizer, output_ids, forced, max_back)
    assert 0 <= drop <= min(max_back, len(output_ids))
    kept = output_ids[: len(output_ids) - drop]
    assert table.bytes_of(kept + new) == table.bytes_of(output_ids) + forced.encode()
    assert tokenizer.decode(kept + new) == tokenizer.decode(output_ids) + forced
    assert all(table.token_bytes[t] is not None for t in new)  # never a special token
    return drop, new


@settings(max_examples=150, deadline=None)
@given(prefix=TEXT, forced=TEXT.filter(bool))
def test_canonical_outputs(byte_tokenizer, prefix, forced):
    _check(byte_tokenizer, byte_tokenizer.encode(prefix, add_special_tokens=False), forced)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), forced=TEXT.filter(bool), max_back=st.integers(0, 10))
def test_sampled_non_canonical_outputs(byte_tokenizer, seed, forced, max_back):
    """Outputs of a sampler need not be the tokenizer's own split (e.g. `"` + `name` for `"name`)."""
    table = token_bytes_for(byte_tokenizer)
    rng = random.Random(seed)
    usable = [t for t, b in enumerate(table.token_bytes) if b is not None and b.isascii()]
    output = [rng.choice(usable) for _ in range(rng.randint(0, 12))]
    _check(byte_tokenizer, output, forced, max_back)


def test_straddling_token_is_replaced(byte_tokenizer):
    ids = byte_tokenizer.encode('{"na', add_special_tokens=False)
    drop, new = _check(byte_tokenizer, ids, 'me": ')
    merged = byte_tokenizer.encode('{"name": ', add_special_tokens=False)
    assert ids[: len(ids) - drop] + new == merged  # same split as tokenizing the whole text
    assert drop >= 1


def test_tail_starting_inside_a_character(byte_tokenizer):
    table = token_bytes_for(byte_tokenizer)
    byte_id = {b[0]: i for i, b in enumerate(table.token_bytes) if b is not None and len(b) == 1}
    output = [byte_id[b] for b in "x日".encode()]  # three one-byte tokens for 日
    for max_back in range(0, 5):
        _check(byte_tokenizer, output, "本", max_back)


def test_matcher_consistent_after_every_jump(backends, byte_tokenizer, model_vocab_size):
    """Drive walks by hand: at every jump the matcher must accept all retokenized tokens."""
    jumps = 0
    for name in ("tool_call", "invoice", "nested", "const_in_object", "format_date"):
        grammar = backends["compact"].compile("json_schema", json.dumps(SCHEMAS[name]))
        for seed in range(3):
            walk = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed, jump_forward=False)
            # Replay the walk's tokens and jump wherever the grammar forces text.
            matcher, output = grammar.matcher(), []
            for token in walk.token_ids[:-1]:  # without EOS
                if not matcher.accept_token(token):
                    break  # the walk diverges from text produced by earlier jumps: stop here
                output.append(token)
                forced = matcher.jump_forward()
                if forced and walk.text.encode().startswith(
                        (token_bytes_for(byte_tokenizer).bytes_of(output) or b"") + forced.encode()):
                    probe = matcher.copy()
                    drop, new = jump_forward_tokens(byte_tokenizer, output, forced)
                    probe.rollback(drop)
                    assert all(probe.accept_token(t) for t in new)
                    assert probe.jump_forward() != forced
                    jumps += 1
    assert jumps > 20


def test_apply_jump_forward_updates_matcher(backends, byte_tokenizer):
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
    matcher = backends["compact"].compile("json_schema", schema).matcher()
    result = apply_jump_forward(matcher, byte_tokenizer, [])
    assert result is not None
    drop, new = result
    assert drop == 0 and byte_tokenizer.decode(new) == '{"name":"'
    assert matcher.num_accepted == len(new) and matcher.jump_forward() is None
    assert apply_jump_forward(matcher, byte_tokenizer, new) is None


@pytest.mark.slow
def test_real_tokenizer_jump_forward_and_corpus_walks():
    from radixlm.runtime.model.loader import load_tokenizer

    tok = load_tokenizer(None)  # SmolLM2 (49152 tokens), cached per machine
    rng = random.Random(0)
    for _ in range(200):
        prefix = "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 10)))
        forced = "".join(rng.choice(CHARS) for _ in range(rng.randint(1, 8)))
        _check(tok, tok.encode(prefix, add_special_tokens=False), forced)
    backend = make_backend("outlines", tok, 49152, GrammarOptions(compact=True))
    for name in ("tool_call", "person", "latlon"):
        grammar = backend.compile("json_schema", json.dumps(SCHEMAS[name]))
        for seed in range(2):
            walk = random_walk(grammar.matcher(), tok, 49152, seed=seed, jump_forward=True)
            assert walk.finished and walk.num_jumps > 0
            jsonschema.validate(json.loads(walk.text), SCHEMAS[name])
            assert tok.decode(walk.token_ids, skip_special_tokens=True) == walk.text
