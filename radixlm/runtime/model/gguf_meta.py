"""What a GGUF file says about its model: the architecture, an HF config built from the metadata, and
the llama.cpp -> HF tensor names (with the q/k row order llama.cpp's converter permuted, and the values
it shifted: hf_tensor_offset).

Read by the GGUF loader (gguf_loader.py) in whichever process first resolves the model, and by the
scheduler when it reads the weights. One table per architecture; a new architecture adds its rows here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# GGUF general.architecture -> HF `architectures` entry. Mistral GGUFs use the llama arch.
SUPPORTED_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                   "phi3": "Phi3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# GGUF architecture -> transformers model_type where they differ (a Gemma-3 GGUF holds the text model only).
_HF_MODEL_TYPES = {"gemma3": "gemma3_text"}

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
# Where an architecture's layer tensors differ from _LAYER_NAMES.
_ARCH_LAYER_NAMES = {
    # Fused in the GGUF as in the HF checkpoint, rows in HF's order (q, k, v; gate, up): CausalLM.load_weights
    # takes qkv_proj and gate_up_proj as they are. Phi-3's ffn_up is the fused [2 * intermediate, hidden].
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    # Gemma's four norms a layer: ffn_norm is the MLP's input norm, the outputs have their own.
    "gemma3": {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
}
# Tensors that are not parameters: llama3 rope factors (rope_freqs) and Phi-3's longrope factors
# (rope_factors_*) are turned into config (_rope_scaling, _phi3_config).
NON_PARAMETER_TENSORS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
# llama.cpp's Gemma-3 converter stores every norm weight (name ending in norm.weight: the layer norms,
# q_norm/k_norm, the final norm) as 1 + the HF weight, the scale Gemma3RMSNorm multiplies by.
_NORM_WEIGHT_OFFSETS = {"gemma3": -1.0}


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    """Map a llama.cpp tensor name ("blk.3.attn_q.weight") of a GGUF of `arch` to its HF name; ValueError
    if unknown. The default covers llama, qwen2 and qwen3 (they share the table)."""
    layer_names = _LAYER_NAMES | _ARCH_LAYER_NAMES.get(arch, {})
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no HF equivalent in radixlm's loader")


def hf_tensor_offset(arch: str, hf_name: str) -> float:
    """What to add to a dequantized GGUF tensor (by its HF name) to get the HF checkpoint's values: -1.0
    for Gemma-3's norm weights (stored as 1 + weight), else 0.0. Adding it reproduces transformers' own
    GGUF loader (Gemma2TensorProcessor subtracts 1 from every "norm.weight")."""
    return _NORM_WEIGHT_OFFSETS.get(arch, 0.0) if hf_name.endswith("norm.weight") else 0.0


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
    hidden = int(read_field(reader, f"{arch}.embedding_length"))
    head_dim = _head_dim(reader, arch, shapes, hidden // n_head)
    theta = float(read_field(reader, f"{arch}.rope.freq_base", 10000.0))
    kwargs: dict[str, Any] = dict(
        architectures=[SUPPORTED_ARCHS[arch]],
        hidden_size=hidden,
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
    if arch in _ARCH_CONFIG:
        kwargs.update(_ARCH_CONFIG[arch](reader, arch, kwargs))
    return AutoConfig.for_model(_HF_MODEL_TYPES.get(arch, arch), **kwargs)


def _head_dim(reader: Any, arch: str, shapes: dict[str, list[int]], default: int) -> int:
    """attention.key_length where written (Gemma-3), else from q's rows (Qwen3's head_dim is not hidden /
    heads), else hidden / heads (Phi-3's q is fused into attn_qkv)."""
    key_length = read_field(reader, f"{arch}.attention.key_length")
    if key_length is not None:
        return int(key_length)
    q = shapes.get("blk.0.attn_q.weight")
    n_head = int(read_field(reader, f"{arch}.attention.head_count"))
    return q[0] // n_head if q is not None else default


def _gemma3_config(reader: Any, arch: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What llama.cpp reads or assumes for Gemma-3 beyond the common keys (src/models/gemma3.cpp)."""
    n_layers, window = kwargs["num_hidden_layers"], read_field(reader, f"{arch}.attention.sliding_window")
    # llama.cpp scales queries by hidden / heads for the 27B (62 layers), by head_dim otherwise, as
    # gemma_pytorch's configs do; the GGUF does not record query_pre_attn_scalar.
    scalar = kwargs["hidden_size"] // kwargs["num_attention_heads"] if n_layers == 62 else kwargs["head_dim"]
    out = dict(
        query_pre_attn_scalar=scalar,
        sliding_window=int(window) if window else None,
        layer_types=_gemma3_layer_types(reader, arch, n_layers, bool(window)),
        # llama.cpp's default for sliding layers when the GGUF has no rope.freq_base_swa (Gemma-3's own).
        rope_local_base_freq=float(read_field(reader, f"{arch}.rope.freq_base_swa", 10000.0)),
        final_logit_softcapping=read_field(reader, f"{arch}.final_logit_softcapping"),
        hidden_activation="gelu_pytorch_tanh",
    )
    end_of_turn = _token_id(reader, b"<end_of_turn>")
    if end_of_turn is not None and kwargs["eos_token_id"] not in (None, end_of_turn):
        # The chat turn's end is an end of generation too (llama.cpp's EOG tokens; the HF checkpoint's
        # generation_config lists it beside <eos>).
        out["eos_token_id"] = [kwargs["eos_token_id"], end_of_turn]
    return out


def _gemma3_layer_types(reader: Any, arch: str, n_layers: int, windowed: bool) -> list[str]:
    """llama.cpp's load_swa_pattern: a per-layer bool array, or every n-th layer full (default 6: layers
    0-4 sliding, 5 full, ...), as transformers' sliding_window_pattern; no window: every layer full."""
    pattern = read_field(reader, f"{arch}.attention.sliding_window_pattern", 6) if windowed else []
    if isinstance(pattern, list):
        sliding = [bool(x) for x in pattern] + [False] * (n_layers - len(pattern))
    else:
        n = int(pattern)
        sliding = [n == 0 or i % n < n - 1 for i in range(n_layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding[:n_layers]]


def _phi3_config(reader: Any, arch: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's partial rotary (rope.dimension_count), window (0: none) and longrope factors (two tensors)."""
    head_dim = kwargs["head_dim"]
    window = read_field(reader, f"{arch}.attention.sliding_window")
    out: dict[str, Any] = dict(
        partial_rotary_factor=int(read_field(reader, f"{arch}.rope.dimension_count", head_dim)) / head_dim,
        sliding_window=int(window) if window else None,
    )
    factors = {t.name: t for t in reader.tensors if t.name.startswith("rope_factors_")}
    if factors:
        orig = int(read_field(reader, f"{arch}.rope.scaling.original_context_length"))
        # attention_factor is left to transformers, which derives it from the two context lengths as
        # llama.cpp's converter did (the GGUF's float32 copy would round it).
        out["rope_scaling"] = {
            "rope_type": "longrope",
            "long_factor": dequantize_tensor(factors["rope_factors_long.weight"]).reshape(-1).tolist(),
            "short_factor": dequantize_tensor(factors["rope_factors_short.weight"]).reshape(-1).tolist(),
            "original_max_position_embeddings": orig,
        }
        out["original_max_position_embeddings"] = orig
    return out


def _token_id(reader: Any, token: bytes) -> int | None:
    """The id of a token in the GGUF's vocabulary, or None (compares raw bytes: no decoding of the list)."""
    field = reader.get_field("tokenizer.ggml.tokens")
    if field is None:
        return None
    return next((i for i, part in enumerate(field.data) if bytes(field.parts[part]) == token), None)


# Architecture-specific config entries beyond the common ones: (reader, arch, common kwargs) -> entries.
_ARCH_CONFIG = {"gemma3": _gemma3_config, "phi3": _phi3_config}
