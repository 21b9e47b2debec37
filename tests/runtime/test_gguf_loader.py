"""GGUF -> HF conversion: tiny HF checkpoints are written as GGUF exactly as llama.cpp's converter would
(q/k rows permuted for llama, tokenizer and chat template as metadata), converted back, and compared with
the originals: logits, weights, tokenizer. K-quant blocks are checked against numpy references written here.

`write_gguf` is also used by test_loader.py and test_default_model.py (loaded by file path).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

from radixlm.runtime.model.gguf_loader import convert_gguf

def gguf_name(hf_name: str, num_layers: int) -> str:
    """HF -> llama.cpp name by the gguf package's own table (independent of the loader's reverse map)."""
    name = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, num_layers).get_name(hf_name, try_suffixes=(".weight", ".bias"))
    assert name, hf_name
    return name


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, verbatim semantics."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_tokenizer(writer: gguf.GGUFWriter, model_dir: Path) -> None:
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tj["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    special = {t["id"] for t in tj["added_tokens"] if t["special"]}
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_pad_token_id(tok.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok.chat_template)


def _add_hparams(writer: gguf.GGUFWriter, cfg: dict, arch: str) -> None:
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)


def write_gguf(
    model_dir: Path,
    out_path: Path,
    arch: str = "llama",
    qtype: Callable[[str, np.ndarray], Q] = lambda name, w: Q.F32,
    raw: dict[str, tuple[np.ndarray, Q]] | None = None,
    extra: Callable[[gguf.GGUFWriter, dict], None] | None = None,
) -> Path:
    """Write model_dir as a GGUF like llama.cpp: qtype(hf_name, weight) picks each tensor's type,
    raw[gguf_name] = (bytes, type) replaces a tensor with hand-made blocks, extra adds metadata/tensors."""
    cfg = json.loads((model_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out_path), arch)
    _add_hparams(writer, cfg, arch)
    _add_tokenizer(writer, model_dir)
    if extra is not None:
        extra(writer, cfg)
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for name, w in load_file(str(model_dir / "model.safetensors")).items():
        if arch == "llama" and ".q_proj." in name:
            w = llama_cpp_permute(w, n_head, n_head)
        elif arch == "llama" and ".k_proj." in name:
            w = llama_cpp_permute(w, n_head, n_kv)
        target = gguf_name(name, cfg["num_hidden_layers"])
        if raw and target in raw:
            data, t = raw[target]
            writer.add_tensor(target, data, raw_dtype=t)  # shape follows from the byte shape
            continue
        t = qtype(name, w) if w.ndim == 2 else Q.F32  # llama.cpp keeps norms and biases in F32
        data = w if t == Q.F32 else gguf.quants.quantize(w, t)
        writer.add_tensor(target, data, raw_dtype=None if t == Q.F32 else t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


IDS = torch.tensor([[5, 17, 200, 3, 99, 150, 42, 7, 300, 11, 12, 13] * 4])


@pytest.mark.parametrize(
    "arch, overrides",
    [("llama", {}), ("qwen2", {}), ("qwen3", {}), ("mistral", {}),
     ("llama", {"tie_word_embeddings": True}), ("qwen3", {"head_dim": 32, "tie_word_embeddings": True})],
)  # fmt: skip
def test_f32_roundtrip_same_logits_and_weights(
    arch: str, overrides: dict, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from radixlm.testing import build_tiny_model

    if overrides:  # tied embeddings (no output.weight in the GGUF); head_dim != hidden / heads
        src = build_tiny_model(tmp_path / "src", arch, **overrides)
    else:
        src = request.getfixturevalue(f"tiny_{arch}_dir")
    gguf_arch = "llama" if arch == "mistral" else arch  # llama.cpp writes Mistral as the llama arch
    out = convert_gguf(write_gguf(src, tmp_path / "m.gguf", gguf_arch), tmp_path / "hf", progress=False)
    original, converted = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert original.keys() == converted.keys()
    for name in original:  # exact: F32 in, F32 out, permutation undone
        np.testing.assert_array_equal(converted[name], original[name], err_msg=name)
    torch.testing.assert_close(_logits(out, IDS), _logits(src, IDS), rtol=0, atol=1e-5)
    cfg, ref = json.loads((out / "config.json").read_text()), json.loads((src / "config.json").read_text())
    ref.setdefault("head_dim", ref["hidden_size"] // ref["num_attention_heads"])
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "vocab_size", "tie_word_embeddings", "max_position_embeddings", "rope_parameters"):
        assert cfg[key] == ref[key], key
    assert cfg["tie_word_embeddings"] == overrides.get("tie_word_embeddings", False)
    assert cfg["architectures"] == [{"mistral": "LlamaForCausalLM"}.get(arch, ref["architectures"][0])]


def test_tokenizer_and_chat_template_roundtrip(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = convert_gguf(write_gguf(tiny_llama_dir, tmp_path / "m.gguf"), tmp_path / "hf", progress=False)
    ref = transformers.AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok.is_fast and tok.chat_template == ref.chat_template
    assert (tok.bos_token_id, tok.eos_token_id) == (ref.bos_token_id, ref.eos_token_id)
    for text in ["Paris is the capital of France.", "  def main():\n\treturn 0  ", "héllo wörld ✓ 🙂", "<|im_start|>x"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    chat = [{"role": "user", "content": "What is two plus two?"}]
    assert tok.apply_chat_template(chat, add_generation_prompt=True) == ref.apply_chat_template(chat, add_generation_prompt=True)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == ref.eos_token_id


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16])
def test_half_precision_weights_equal_torch_cast(qtype: Q, tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    src = write_gguf(tiny_qwen2_dir, tmp_path / "m.gguf", "qwen2", lambda name, w: qtype)
    out = convert_gguf(src, tmp_path / "hf", progress=False)
    torch_dtype = torch.float16 if qtype == Q.F16 else torch.bfloat16
    original, converted = load_file(str(tiny_qwen2_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for name, w in original.items():
        expected = torch.from_numpy(w).to(torch_dtype).float() if w.ndim == 2 else torch.from_numpy(w)
        torch.testing.assert_close(torch.from_numpy(converted[name]), expected, rtol=0, atol=0, msg=name)


def _block_error_bound(w: np.ndarray, qtype: Q) -> np.ndarray:
    """Worst-case rounding error per element for the block formats (32 values per block)."""
    blocks = w.reshape(w.shape[0], -1, 32)
    amax, lo, hi = np.abs(blocks).max(-1), blocks.min(-1), blocks.max(-1)
    bound = {Q.Q8_0: amax / 127, Q.Q4_0: amax / 8, Q.Q4_1: (hi - lo) / 15}[qtype]
    return np.repeat(bound * 1.01 + 1e-6, 32, axis=-1).reshape(w.shape)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_quantized_weights_within_quantization_error(qtype: Q, tiny_llama_dir: Path, tmp_path: Path) -> None:
    src = write_gguf(tiny_llama_dir, tmp_path / "m.gguf", "llama", lambda name, w: qtype)
    out = convert_gguf(src, tmp_path / "hf", progress=False)
    original, converted = load_file(str(tiny_llama_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for name, w in original.items():
        if w.ndim == 2:
            # a wrong q/k unpermutation moves whole rows: far outside this per-block bound
            assert np.all(np.abs(converted[name] - w) <= _block_error_bound(w, qtype)), name
            assert not np.array_equal(converted[name], w), f"{name} was not quantized"
    logits = _logits(out, IDS[:, :8])  # loads in transformers and computes something finite
    assert torch.isfinite(logits).all()


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)[..., 0]


def ref_q4_k(blocks: np.ndarray) -> np.ndarray:
    """ggml dequantize_row_q4_K: d, dmin (f16), 12 bytes of 6-bit scale/min pairs, 128 bytes of nibbles."""
    out = np.empty((blocks.shape[0], 256), np.float32)
    for b, blk in enumerate(blocks.astype(np.int64)):
        d, dmin, sc, qs = _f16(blocks[b, 0:2]), _f16(blocks[b, 2:4]), blk[4:16], blk[16:144]
        for j in range(8):  # get_scale_min_k4
            if j < 4:
                scale, mn = sc[j] & 63, sc[j + 4] & 63
            else:
                scale = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4)
                mn = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)
            q = qs[32 * (j // 2) : 32 * (j // 2) + 32]
            nib = q & 0xF if j % 2 == 0 else q >> 4
            out[b, 32 * j : 32 * j + 32] = d * scale * nib - dmin * mn
    return out


def ref_q6_k(blocks: np.ndarray) -> np.ndarray:
    """ggml dequantize_row_q6_K: ql[128] low nibbles, qh[64] high 2 bits, int8 scales[16], d (f16)."""
    out = np.empty((blocks.shape[0], 256), np.float32)
    for b, blk in enumerate(blocks.astype(np.int64)):
        ql, qh, d = blk[0:128], blk[128:192], _f16(blocks[b, 208:210])
        sc = blocks[b, 192:208].view(np.int8).astype(np.int64)
        for half in range(2):
            l_, h_, s_, y = ql[64 * half :], qh[32 * half :], sc[8 * half :], out[b, 128 * half :]
            for l in range(32):
                i = l // 16
                y[l] = d * s_[i] * (((l_[l] & 0xF) | (((h_[l] >> 0) & 3) << 4)) - 32)
                y[l + 32] = d * s_[i + 2] * (((l_[l + 32] & 0xF) | (((h_[l] >> 2) & 3) << 4)) - 32)
                y[l + 64] = d * s_[i + 4] * (((l_[l] >> 4) | (((h_[l] >> 4) & 3) << 4)) - 32)
                y[l + 96] = d * s_[i + 6] * (((l_[l + 32] >> 4) | (((h_[l] >> 6) & 3) << 4)) - 32)
    return out


def _random_blocks(rng: np.random.Generator, rows: int, nbytes: int, scale_offsets: list[int]) -> np.ndarray:
    blocks = rng.integers(0, 256, size=(rows, nbytes), dtype=np.uint8)
    for off in scale_offsets:  # random bytes would make inf/NaN f16 scales: use sane ones
        blocks[:, off : off + 2] = rng.uniform(1e-3, 1e-2, size=(rows, 1)).astype(np.float16).view(np.uint8)
    return blocks


def test_k_quants_match_numpy_reference(tmp_path: Path) -> None:
    from radixlm.testing import build_tiny_model

    src = build_tiny_model(tmp_path / "src", "llama", hidden_size=256, intermediate_size=256)
    rng = np.random.default_rng(0)
    q4k, q6k = _random_blocks(rng, 256, 144, [0, 2]), _random_blocks(rng, 256, 210, [208])
    raw = {"blk.0.ffn_up.weight": (q4k, Q.Q4_K), "blk.1.ffn_down.weight": (q6k, Q.Q6_K)}
    out = convert_gguf(write_gguf(src, tmp_path / "m.gguf", raw=raw), tmp_path / "hf", progress=False)
    converted = load_file(str(out / "model.safetensors"))
    np.testing.assert_allclose(converted["model.layers.0.mlp.up_proj.weight"], ref_q4_k(q4k), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(converted["model.layers.1.mlp.down_proj.weight"], ref_q6_k(q6k), rtol=1e-6, atol=1e-7)
    assert torch.isfinite(_logits(out, IDS[:, :4])).all()


def _llama3_rope_freqs(params: dict, head_dim: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (llama3 rope_factors)."""
    freqs = 1.0 / (params["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old, lo, hi, factor = (params[k] for k in ("original_max_position_embeddings", "low_freq_factor",
                                              "high_freq_factor", "factor"))  # fmt: skip
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old / hi:
            factors.append(1.0)
        elif wavelen > old / lo:
            factors.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _inv_freq(model_dir: Path) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(transformers.AutoConfig.from_pretrained(str(model_dir))).inv_freq


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 16.0},  # 3 smooth freqs
        {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},  # 1 smooth freq
        {"rope_type": "linear", "factor": 2.0},
    ],
)
def test_rope_scaling_roundtrip(rope: dict, tmp_path: Path) -> None:
    from radixlm.testing import build_tiny_model

    params = {**rope, "rope_theta": 10000.0, "original_max_position_embeddings": 256}
    if rope["rope_type"] == "linear":
        del params["original_max_position_embeddings"]
    src = build_tiny_model(tmp_path / "src", "llama", rope_parameters=params)

    def extra(writer: gguf.GGUFWriter, cfg: dict) -> None:
        if rope["rope_type"] == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
        else:  # like llama.cpp: a rope_freqs tensor, no original context length in the metadata
            writer.add_tensor("rope_freqs.weight", _llama3_rope_freqs(params, cfg["head_dim"]))

    out = convert_gguf(write_gguf(src, tmp_path / "m.gguf", extra=extra), tmp_path / "hf", progress=False)
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == rope["rope_type"]
    torch.testing.assert_close(_inv_freq(out), _inv_freq(src), rtol=1e-6, atol=0)
    torch.testing.assert_close(_logits(out, IDS), _logits(src, IDS), rtol=0, atol=1e-5)
