"""Model resolution and loading: cache location, path validation, GGUF conversion caching and locking,
safetensors weight streaming (single file and sharded), config and tokenizer loading."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q

import radixlm.runtime.model.gguf_loader as gguf_loader
from radixlm.runtime.model.loader import (
    cache_root,
    iter_weights,
    load_hf_config,
    load_tokenizer,
    resolve_model_path,
)


def _gguf_helpers() -> Any:
    # Loaded by path: works whatever pytest's import mode; the module defines write_gguf.
    spec = importlib.util.spec_from_file_location("_gguf_helpers", Path(__file__).with_name("test_gguf_loader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _gguf_helpers()
write_gguf = helpers.write_gguf


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def llama_gguf(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tiny_llama_dir, tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


def test_cache_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    monkeypatch.delenv("RADIXLM_CACHE_DIR", raising=False)
    assert cache_root() == Path(platformdirs.user_cache_dir("radixlm"))
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "explicit") == tmp_path / "explicit"


def test_resolve_directory_and_errors(tiny_llama_dir: Path, tmp_path: Path) -> None:
    assert resolve_model_path(tiny_llama_dir) == tiny_llama_dir
    assert resolve_model_path(str(tiny_llama_dir)) == tiny_llama_dir
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        resolve_model_path(tmp_path / "no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_path(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=".gguf"):
        resolve_model_path(tmp_path / "weights.bin")


def test_gguf_prepared_once_into_cache(llama_gguf: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = resolve_model_path(llama_gguf)
    assert out.parent == cache / "gguf" and out.name.startswith("tiny-llama-")
    assert load_hf_config(out)["architectures"] == ["LlamaForCausalLM"]
    assert gguf_loader.gguf_source(out) == llama_gguf.resolve()  # the weights stay in the GGUF
    assert not list(out.glob("*.safetensors"))
    mtime = (out / gguf_loader.GGUF_MARKER).stat().st_mtime_ns

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("prepared again")

    monkeypatch.setattr(gguf_loader, "prepare_gguf", forbidden)
    assert resolve_model_path(llama_gguf) == out
    assert (out / gguf_loader.GGUF_MARKER).stat().st_mtime_ns == mtime
    assert [p.name for p in cache.joinpath("gguf").iterdir() if p.is_dir()] == [out.name]  # no temp dirs left


def test_changed_gguf_gets_a_new_cache_entry(llama_gguf: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tiny-llama.gguf"
    copy.write_bytes(llama_gguf.read_bytes())
    first = resolve_model_path(copy, cache_dir=tmp_path / "c")
    with open(copy, "ab") as f:  # same path, new size and mtime
        f.write(b"\0" * 32)
    assert resolve_model_path(copy, cache_dir=tmp_path / "c") != first


def test_concurrent_preparations_prepare_once(llama_gguf: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = gguf_loader._write_tokenizer

    def counting(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(gguf_loader, "_write_tokenizer", counting)
    results: list[Path] = []
    # flock locks belong to open file descriptions, so threads exclude each other like processes do.
    threads = [threading.Thread(target=lambda: results.append(resolve_model_path(llama_gguf, tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 3


def _assert_failed_cleanly(cache_dir: Path) -> None:
    leftovers = [p for p in cache_dir.rglob("*") if p.is_dir()] if cache_dir.exists() else []
    assert leftovers in ([], [cache_dir / "gguf"]), leftovers


def test_unsupported_arch(tiny_llama_dir: Path, tmp_path: Path) -> None:
    bad = write_gguf(tiny_llama_dir, tmp_path / "m.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        resolve_model_path(bad, cache_dir=tmp_path / "c")
    _assert_failed_cleanly(tmp_path / "c")


def test_unsupported_tensor_type_and_name(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from gguf import GGML_QUANT_SIZES

    block_len, block_bytes = GGML_QUANT_SIZES[Q.Q8_1]  # ffn_up is [128, 64]: a row is 64 // block_len blocks
    q8_1 = np.zeros((128, 64 // block_len * block_bytes), dtype=np.uint8)
    bad = write_gguf(tiny_llama_dir, tmp_path / "a.gguf", raw={"blk.0.ffn_up.weight": (q8_1, Q.Q8_1)})
    with pytest.raises(ValueError, match="blk.0.ffn_up.weight.*Q8_1"):  # the fp32 conversion (default model)
        gguf_loader.convert_gguf(bad, tmp_path / "c" / "gguf" / "a", progress=False)
    _assert_failed_cleanly(tmp_path / "c")

    def extra(writer: Any, cfg: dict) -> None:
        writer.add_tensor("blk.0.attn_mystery.weight", np.zeros((4, 4), np.float32))

    bad = write_gguf(tiny_llama_dir, tmp_path / "b.gguf", extra=extra)
    with pytest.raises(ValueError, match="attn_mystery"):
        resolve_model_path(bad, cache_dir=tmp_path / "c")
    _assert_failed_cleanly(tmp_path / "c")


def test_iter_weights_single_file_matches_model(tiny_qwen2_dir: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_qwen2_dir), dtype=torch.float32)
    expected = model.state_dict()
    weights = dict(iter_weights(tiny_qwen2_dir))
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected[name]), name
    as_bf16 = dict(iter_weights(tiny_qwen2_dir, dtype=torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for t in as_bf16.values())
    assert torch.equal(as_bf16["lm_head.weight"], expected["lm_head.weight"].to(torch.bfloat16))


def test_iter_weights_sharded(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32)
    model.save_pretrained(str(tmp_path), max_shard_size="40KB")
    shards = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(shards.values())) > 1
    weights = dict(iter_weights(tmp_path))
    reference = dict(iter_weights(tiny_llama_dir))
    assert weights.keys() == reference.keys() == shards.keys()
    for name in reference:
        assert torch.equal(weights[name], reference[name]), name


def test_load_hf_config_and_tokenizer(tiny_llama_dir: Path, llama_gguf: Path, cache: Path) -> None:
    assert load_hf_config(tiny_llama_dir) == json.loads((tiny_llama_dir / "config.json").read_text())
    reference = transformers.AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    for source in (tiny_llama_dir, llama_gguf):  # a directory, or a GGUF file (converted into the cache)
        tok = load_tokenizer(source)
        assert tok.is_fast and tok.chat_template == reference.chat_template
        text = "Question: What color is the sky? Answer: blue."
        assert tok.encode(text) == reference.encode(text)
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_big_conversions_are_sharded(tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_loader, "SHARD_BYTES", 100_000)
    out = gguf_loader.convert_gguf(write_gguf(tiny_llama_dir, tmp_path / "m.gguf"), tmp_path / "hf", progress=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (out / "model.safetensors").exists()
    original = helpers.load_file(str(tiny_llama_dir / "model.safetensors"))
    assert index["metadata"]["total_size"] == sum(w.nbytes for w in original.values())
    converted = dict(iter_weights(out))
    assert converted.keys() == original.keys()
    for name, w in original.items():
        np.testing.assert_array_equal(converted[name].numpy(), w, err_msg=name)
    torch.testing.assert_close(helpers._logits(out, helpers.IDS), helpers._logits(tiny_llama_dir, helpers.IDS), rtol=0, atol=1e-5)
