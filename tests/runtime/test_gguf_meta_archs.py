"""gguf_meta for Gemma-3 and Phi-3: tiny HF checkpoints written as GGUF the way llama.cpp's converter writes
them (conversion/gemma.py Gemma3Model: norm weights + 1, no query_pre_attn_scalar or layer pattern;
conversion/phi.py Phi3MiniModel: fused attn_qkv / ffn_up, longrope factors as tensors), then read back with
build_hf_config, hf_tensor_name and hf_tensor_offset into transformers: the same config values and logits.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from radixlm.runtime.model.gguf_meta import (
    NON_PARAMETER_TENSORS, build_hf_config, dequantize_tensor, gguf_arch, hf_tensor_name, hf_tensor_offset,
)
from radixlm.testing import build_tiny_model


def _add_tokenizer(writer: gguf.GGUFWriter, model_dir: Path) -> None:
    # Loaded by path, as test_loader.py does: works whatever pytest's import mode.
    spec = importlib.util.spec_from_file_location("_gguf_helpers", Path(__file__).with_name("test_gguf_loader.py"))
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    helpers._add_tokenizer(writer, model_dir)


def _gemma3_hparams(writer: gguf.GGUFWriter, c: Any) -> None:
    """Gemma3Model.set_gguf_parameters (and TextModel's common keys)."""
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    writer.add_sliding_window(c.sliding_window)
    full = c.rope_parameters["full_attention"]
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])


def _phi3_hparams(writer: gguf.GGUFWriter, c: Any) -> None:
    """Phi3MiniModel.set_gguf_parameters and generate_extra_tensors."""
    rope = c.rope_parameters
    head_dim = c.hidden_size // c.num_attention_heads
    writer.add_context_length(c.max_position_embeddings)
    writer.add_rope_scaling_orig_ctx_len(rope.get("original_max_position_embeddings", c.max_position_embeddings))
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(int(rope["partial_rotary_factor"] * head_dim))
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_sliding_window(c.sliding_window or 0)
    if rope.get("rope_type") == "longrope":
        writer.add_rope_scaling_attn_factors(1.0)  # not read: transformers derives it
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))


_WRITERS = {"gemma3": (gguf.MODEL_ARCH.GEMMA3, _gemma3_hparams), "phi3": (gguf.MODEL_ARCH.PHI3, _phi3_hparams)}


def write_gguf(model_dir: Path, out_path: Path, arch: str) -> Path:
    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    gguf_arch_id, hparams = _WRITERS[arch]
    names = gguf.get_tensor_name_map(gguf_arch_id, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(out_path), arch)
    hparams(writer, config)
    _add_tokenizer(writer, model_dir)
    for name, w in load_file(str(model_dir / "model.safetensors")).items():
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1.0)  # Gemma3Model.norm_shift
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def read_back(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """The HF config and HF-named state dict gguf_meta makes of the GGUF (what the loader builds on)."""
    reader = gguf.GGUFReader(str(path))
    arch = gguf_arch(reader)
    state = {}
    for t in reader.tensors:
        if t.name in NON_PARAMETER_TENSORS:
            continue
        name = hf_tensor_name(t.name, arch)
        state[name] = torch.from_numpy(dequantize_tensor(t) + hf_tensor_offset(arch, name))
    return build_hf_config(reader, arch), state


IDS = torch.tensor([[5, 17, 200, 3, 99, 150, 42, 7, 300, 11, 12, 13] * 4])


def _logits(model: transformers.PreTrainedModel) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IDS).logits


def _assert_same_model(model_dir: Path, gguf_path: Path, keys: list[str]) -> Any:
    original = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config, state = read_back(gguf_path)
    for key in keys:
        assert getattr(config, key) == getattr(original.config, key), key
    rebuilt = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = rebuilt.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied
    rebuilt.tie_weights()
    torch.testing.assert_close(_logits(rebuilt), _logits(original), rtol=1e-5, atol=1e-5)
    return config


GEMMA3_KEYS = ["architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size",
               "tie_word_embeddings", "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_parameters",
               "hidden_activation", "final_logit_softcapping", "model_type"]


@pytest.mark.parametrize("overrides", [{}, {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}])
def test_gemma3_gguf_metadata_and_tensors(tmp_path: Path, overrides: dict) -> None:
    # llama.cpp's defaults, which the GGUF does not record: every 6th layer full, queries scaled by
    # head_dim, sliding layers' rotary base 10000.
    model_dir = build_tiny_model(tmp_path / "hf", arch="gemma3", num_hidden_layers=7, sliding_window_pattern=6,
                                 layer_types=None, query_pre_attn_scalar=16, rope_local_base_freq=10000.0,
                                 rope_theta=1e6, **overrides)
    config = _assert_same_model(model_dir, write_gguf(model_dir, tmp_path / "g.gguf", "gemma3"), GEMMA3_KEYS)
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]


def test_gemma3_norm_weights_are_shifted_back(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "hf", arch="gemma3")
    _, state = read_back(write_gguf(model_dir, tmp_path / "g.gguf", "gemma3"))
    original = load_file(str(model_dir / "model.safetensors"))
    norms = [n for n in original if n.endswith("norm.weight")]
    assert len(norms) == 2 * 6 + 1  # four a layer, q/k norms, the final norm
    for name in norms:
        assert np.array_equal(state[name].numpy(), (original[name] + np.float32(1)) - np.float32(1)), name
    assert hf_tensor_offset("gemma3", "model.layers.0.self_attn.q_proj.weight") == 0.0
    assert hf_tensor_offset("llama", "model.layers.0.input_layernorm.weight") == 0.0


def test_real_gemma3_270m_metadata() -> None:
    """The PyPI-distributed Gemma-3 270M Q4_K_M GGUF, where present: google/gemma-3-270m's config values."""
    path = Path("/work/models/gemma-3-270m-q4_k_m.gguf")
    if not path.is_file():
        pytest.skip("no local Gemma-3 270M GGUF")
    reader = gguf.GGUFReader(str(path))
    c = build_hf_config(reader, gguf_arch(reader))
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.vocab_size, c.max_position_embeddings) == (640, 2048, 18, 4, 1, 256, 262144, 32768)
    assert (c.query_pre_attn_scalar, c.sliding_window, c.rms_norm_eps, c.eos_token_id) == (256, 512, 1e-6, [1, 106])
    assert c.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert c.rope_parameters == {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    assert c.tie_word_embeddings and c.model_type == "gemma3_text"


PHI3_KEYS = ["architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "vocab_size", "sliding_window",
             "rope_parameters", "original_max_position_embeddings"]


@pytest.mark.parametrize("overrides", [
    {},
    {"partial_rotary_factor": 0.75, "max_position_embeddings": 1024, "original_max_position_embeddings": 256,
     "sliding_window": 255,
     "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0 + 0.25 * i for i in range(6)],
                      "long_factor": [4.0 + i for i in range(6)]}},
])  # fmt: skip
def test_phi3_gguf_metadata_and_fused_tensors(tmp_path: Path, overrides: dict) -> None:
    model_dir = build_tiny_model(tmp_path / "hf", arch="phi3", **overrides)
    path = write_gguf(model_dir, tmp_path / "p.gguf", "phi3")
    names = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert "blk.0.attn_qkv.weight" in names and "blk.0.ffn_gate.weight" not in names
    assert hf_tensor_name("blk.0.attn_qkv.weight", "phi3") == "model.layers.0.self_attn.qkv_proj.weight"
    assert hf_tensor_name("blk.0.ffn_up.weight", "phi3") == "model.layers.0.mlp.gate_up_proj.weight"
    _assert_same_model(model_dir, path, PHI3_KEYS)
