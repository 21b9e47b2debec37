"""Token id -> bytes for byte-level BPE and SentencePiece byte-fallback tokenizers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.constrained.vocabulary import FAKE_BYTE_BASE, build_token_bytes, outlines_vocabulary_bytes

TEXT = st.text(alphabet=st.sampled_from(list('abcxy {}[]":,.-_0123456789\n\téü日本€😀')), max_size=40)


def test_byte_level_tokens_map_to_their_decoded_bytes(byte_tokenizer):
    table = build_token_bytes(byte_tokenizer)
    assert table.byte_level and table.eos_token_id == byte_tokenizer.eos_token_id
    special = set(byte_tokenizer.all_special_ids)
    for tid in range(len(byte_tokenizer)):
        b = table.token_bytes[tid]
        if tid in special:
            assert b is None
            continue
        assert b  # every other token stands for at least one byte
        text = byte_tokenizer.decode([tid])
        if "\ufffd" not in text:  # whole characters: decode must agree exactly
            assert b == text.encode("utf-8"), (tid, b, text)
    # all 256 single bytes exist as tokens in a byte-level vocabulary
    assert {b[0] for b in table.token_bytes if b is not None and len(b) == 1} == set(range(256))


@settings(max_examples=60, deadline=None)
@given(text=TEXT)
def test_byte_level_concatenation_is_the_text(byte_tokenizer, text):
    table = build_token_bytes(byte_tokenizer)
    ids = byte_tokenizer.encode(text, add_special_tokens=False)
    assert table.bytes_of(ids) == text.encode("utf-8")


def test_sentencepiece_byte_fallback_and_spaces(sp_tokenizer):
    table = build_token_bytes(sp_tokenizer)
    assert not table.byte_level
    vocab = sp_tokenizer.get_vocab()
    assert table.token_bytes[vocab["<0x41>"]] == b"A"
    assert table.token_bytes[vocab["<0xC3>"]] == b"\xc3"
    assert table.token_bytes[vocab["\u2581a"]] == b" a"
    assert table.token_bytes[vocab["abc"]] == b"abc"
    for special in ("<s>", "</s>", "<unk>"):
        assert table.token_bytes[vocab[special]] is None


@settings(max_examples=60, deadline=None)
@given(text=TEXT)
def test_sentencepiece_concatenation_is_the_text(sp_tokenizer, text):
    table = build_token_bytes(sp_tokenizer)
    ids = sp_tokenizer.encode(text, add_special_tokens=False)
    assert table.bytes_of(ids) == text.encode("utf-8")


def test_outlines_vocabulary_excludes_specials_and_nul(byte_tokenizer):
    from outlines_core import Vocabulary

    table = build_token_bytes(byte_tokenizer)
    vocab = Vocabulary.from_binary(outlines_vocabulary_bytes(table))
    assert vocab.get_eos_token_id() == table.eos_token_id
    nul_ids = vocab.get(b"\x00")
    assert nul_ids == [FAKE_BYTE_BASE]  # the real NUL token is left out, the end marker stays
    a_ids = vocab.get(b"a")
    assert FAKE_BYTE_BASE + ord("a") in a_ids and len(a_ids) == 2
    assert vocab.get("<|im_end|>") is None


def test_tokenizer_without_eos_is_refused(sp_tokenizer):
    class NoEos:
        def __getattr__(self, name):
            return None if name == "eos_token_id" else getattr(sp_tokenizer, name)

    with pytest.raises(ValueError, match="EOS"):
        build_token_bytes(NoEos())
