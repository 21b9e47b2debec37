"""A checkpoint that ships only a SentencePiece `tokenizer.model` (no tokenizer.json), as many
Llama-2-era ones do: transformers converts it to a fast tokenizer, which needs `sentencepiece` and
`protobuf` (both dependencies). The model is trained here in a tmp dir (no network)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import load_tokenizer
from radixlm.testing import build_tiny_model

TEXT = ["Once upon a time there was a small language model.", "The quick brown fox jumps over the lazy dog.",
        "Paris is the capital of France.", "def main(): return 42"]


def write_sentencepiece_tokenizer(out: Path, vocab_size: int = 120) -> None:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT * 50), model_writer=buf, vocab_size=vocab_size,
                                   model_type="bpe", character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, minloglevel=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                 "merges.txt", "chat_template.jinja"):
        (out / name).unlink(missing_ok=True)
    (out / "tokenizer.model").write_bytes(buf.getvalue())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))


@pytest.fixture(scope="module")
def spm_model_dir(tmp_path_factory) -> Path:
    out = build_tiny_model(tmp_path_factory.mktemp("tiny_spm"), arch="llama")
    write_sentencepiece_tokenizer(out)
    assert not (out / "tokenizer.json").exists()
    return out


def test_tokenizer_model_only_directory_loads_a_fast_tokenizer(spm_model_dir):
    tok = load_tokenizer(spm_model_dir)
    assert tok.is_fast
    ids = tok.encode("The quick brown fox", add_special_tokens=False)
    assert ids and max(ids) < 120
    assert tok.decode(ids) == "The quick brown fox"


def test_engine_serves_a_tokenizer_model_only_checkpoint(spm_model_dir):
    with Engine(str(spm_model_dir), max_total_tokens=512) as engine:
        res = engine.generate("The quick brown fox", {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
    assert len(res["output_ids"]) == 4 and res["meta_info"]["finish_reason"]["type"] == "length"
