"""What a GGUF file says about its model: the architecture, an HF config built from the metadata, and
the llama.cpp -> HF tensor names (with the q/k row order llama.cpp's converter permuted).

Read by the GGUF loader (gguf_loader.py) in whichever process first resolves the model, and by the
scheduler when it reads the weights. One table per architecture; a new architecture adds its rows here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# GGUF general.architecture -> HF `architectures` entry. Mistral GGUFs use the llama arch.
SUPPORTED_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Tensors that are not parameters: llama3 rope factors are turned into config (_rope_scaling).
_NON_PARAMETER_TENSORS = {"rope_freqs.weight"}


def hf_tensor_name(gguf_name: str) -> str:
    """Map a llama.cpp tensor name ("blk.3.attn_q.weight") to its HF name; ValueError if unknown."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no HF equivalent in radixlm's loader")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's LlamaModel.permute for a q/k weight [n_head*head_dim, ...] or bias.

    llama.cpp reshapes rows to (n_head, 2, head_dim/2) and swaps the last two axes, turning HF's
    rotate-half layout into interleaved pairs; swapping back restores HF's row order.
    """
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_tensor(tensor: Any) -> np.ndarray:
    """Dequantize one gguf ReaderTensor to float32 in HF (row-major, outermost first) shape."""
    import gguf

    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise ValueError(
            f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which the gguf package "
            f"cannot dequantize ({e})"
        ) from None
    # GGUF lists dims innermost first (ggml `ne`); numpy wants outermost first.
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return np.asarray(values, dtype=np.float32).reshape(shape).copy()


def gguf_arch(reader: Any) -> str:
    """The GGUF general.architecture, validated against SUPPORTED_ARCHS."""
    arch = read_field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(SUPPORTED_ARCHS))})"
        )
    return arch


def read_field(reader: Any, key: str, default: Any = None) -> Any:
    """A GGUF metadata value as a Python value (str, int, float, list), or default if absent."""
    field = reader.get_field(key)
    if field is None:
        return default
    value = field.contents()
    # GGUF stores floats as float32: print 1e-05, not 9.999999747378752e-06, as the HF config had.
    return float(str(np.float32(value))) if isinstance(value, float) else value


def _llama3_rope(factors: np.ndarray, theta: float, head_dim: int, orig_ctx: int) -> dict[str, Any]:
    """Recover HF llama3 rope parameters from llama.cpp's rope_freqs tensor (per-frequency divisors).

    HF's llama3 inv_freq is base inv_freq / r with r = 1 where x = orig_ctx/wavelen > high, r = factor
    where x < low, and factor/r = 1 + s*(factor-1) with s = (x-low)/(high-low) in between. s is linear
    in x, so the smooth points fix (low, high) by a line fit; with fewer than two of them any
    boundaries that keep every frequency in its region reproduce the same inv_freq exactly.
    """
    x = orig_ctx / (2 * np.pi / (1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)))
    factor = float(factors.max())
    mid = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    s = (factor / factors[mid] - 1) / (factor - 1)
    if mid.sum() >= 2:
        slope, intercept = np.polyfit(x[mid], s, 1)
        low = -intercept / slope
        high = low + 1 / slope
    else:
        x_full = float(x[factors >= factor - 1e-6].max())  # largest x still fully scaled
        ones = x[factors <= 1 + 1e-6]
        x_one = float(ones.min()) if ones.size else 2 * float(x.max())
        if mid.sum() == 1:
            xm, sm = float(x[mid][0]), float(s[0])
            width = 0.99 * min((xm - x_full) / max(sm, 1e-9), (x_one - xm) / max(1 - sm, 1e-9))
            low, high = xm - sm * width, xm - sm * width + width
        else:
            low, high = x_full + (x_one - x_full) / 3, x_full + 2 * (x_one - x_full) / 3
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": float(low),
        "high_freq_factor": float(high),
        "original_max_position_embeddings": int(orig_ctx),
    }


def _rope_scaling(reader: Any, arch: str, theta: float, head_dim: int) -> dict[str, Any] | None:
    """HF rope_scaling from GGUF metadata (linear, yarn) or from a llama3 rope_freqs tensor."""
    kind = read_field(reader, f"{arch}.rope.scaling.type")
    factor = read_field(reader, f"{arch}.rope.scaling.factor")
    orig_ctx = read_field(reader, f"{arch}.rope.scaling.original_context_length")
    rope_freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if rope_freqs is not None:
        factors = dequantize_tensor(rope_freqs).reshape(-1).astype(np.float64)
        if float(factors.max()) <= 1.0:
            return None
        # llama.cpp does not record llama3's original context; Llama 3.x used 8192.
        return _llama3_rope(factors, theta, head_dim, orig_ctx or 8192)
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        yarn = {"rope_type": "yarn", "factor": float(factor)}
        return yarn | ({"original_max_position_embeddings": int(orig_ctx)} if orig_ctx else {})
    raise ValueError(f"GGUF rope scaling type {kind!r} is not supported")


def build_hf_config(reader: Any, arch: str) -> Any:
    """A transformers PretrainedConfig for the GGUF: sizes from metadata, shapes from the tensors."""
    from transformers import AutoConfig

    shapes = {t.name: [int(d) for d in reversed(t.shape.tolist())] for t in reader.tensors}
    n_head = int(read_field(reader, f"{arch}.attention.head_count"))
    head_dim = shapes["blk.0.attn_q.weight"][0] // n_head
    theta = float(read_field(reader, f"{arch}.rope.freq_base", 10000.0))
    kwargs: dict[str, Any] = dict(
        architectures=[SUPPORTED_ARCHS[arch]],
        hidden_size=int(read_field(reader, f"{arch}.embedding_length")),
        intermediate_size=int(read_field(reader, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(read_field(reader, f"{arch}.block_count")),
        num_attention_heads=n_head,
        num_key_value_heads=int(read_field(reader, f"{arch}.attention.head_count_kv", n_head)),
        head_dim=head_dim,
        rms_norm_eps=float(read_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(read_field(reader, f"{arch}.context_length")),
        vocab_size=shapes["token_embd.weight"][0],
        tie_word_embeddings="output.weight" not in shapes,
        rope_theta=theta,
        bos_token_id=read_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=read_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=read_field(reader, "tokenizer.ggml.padding_token_id"),
        dtype="float32",
    )
    rope_scaling = _rope_scaling(reader, arch, theta, head_dim)
    if rope_scaling is not None:
        kwargs["rope_scaling"] = rope_scaling
    if arch == "llama":
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in shapes
    return AutoConfig.for_model(arch, **kwargs)
