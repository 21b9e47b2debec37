"""Fixtures for constrained decoding: the tiny byte-level tokenizer, a hand-made SentencePiece-style
byte-fallback tokenizer, and backends over them (all built locally in well under a second)."""

from __future__ import annotations

import pytest

from radixlm.constrained import GrammarOptions, make_backend

PADDING = 16  # model vocab = tokenizer vocab + padding ids the grammar must never allow


@pytest.fixture(scope="session")
def byte_tokenizer(tmp_path_factory):
    from radixlm.testing import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def model_vocab_size(byte_tokenizer) -> int:
    return len(byte_tokenizer) + PADDING


@pytest.fixture(scope="session")
def backends(byte_tokenizer, model_vocab_size):
    """{"default": whitespace `[ ]?`, "compact": no whitespace}."""
    return {
        "default": make_backend("outlines", byte_tokenizer, model_vocab_size, GrammarOptions()),
        "compact": make_backend("outlines", byte_tokenizer, model_vocab_size, GrammarOptions(compact=True)),
    }


def build_sentencepiece_tokenizer():
    """A Llama-style tokenizer: `▁` for spaces, `<0xAB>` byte fallback, a few merges, 3 specials."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    merges = [("a", "b"), ("ab", "c"), ("\u2581", "a"), ("\u2581a", "b"), ("x", "y")]
    for piece in ["\u2581", "a", "b", "c", "x", "y", "ab", "abc", "\u2581a", "\u2581ab", "xy"]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="session")
def sp_tokenizer():
    return build_sentencepiece_tokenizer()
