"""Rotary position embedding (HF "rotate_half" layout) with rope scaling taken from transformers.

Runs inside the scheduler process. inv_freq comes from transformers' own rope initialisers (default,
linear, llama3, yarn, ...), so scaled variants match the reference implementation exactly; cos/sin are
precomputed for every position up to the context length with the same fp32 arithmetic as transformers.
"""

from __future__ import annotations

import torch
from torch import nn


def _inv_freq(hf_config, head_dim: int, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """head_dim: the rotated dims (partial_rotary_factor * head_dim). layer_type: a key of the config's
    per-layer-type rope_parameters (Gemma-3: "sliding_attention", "full_attention"), None for one table."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"unsupported rope scaling type {rope_type!r}")
        # longrope: without a sequence length this is the short-factor table, which transformers uses up to
        # original_max_position_embeddings (model_runner._context_len stays within it).
        extra = {} if layer_type is None else {"layer_type": layer_type}
        return ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), **extra)
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))
    return inv, 1.0


class RotaryEmbedding(nn.Module):
    def __init__(self, hf_config, head_dim: int, max_positions: int, layer_type: str | None = None):
        """head_dim: the rotated dims of a head (all of it unless partial_rotary_factor < 1)."""
        super().__init__()
        inv_freq, scaling = _inv_freq(hf_config, head_dim, layer_type)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2], a single fp32 product as in transformers
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)  # [P, D]
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)
        # sin with its first half negated: rotate_half(x) * sin == roll(x, D/2) * signed_sin exactly
        # (negating a factor of a product is exact in IEEE arithmetic), in one op fewer (apply_rotary_one).
        half = head_dim // 2
        self.register_buffer("signed_sin", torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1),
                             persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [T, 1, D] for the positions (apply_rotary_one's arguments); looked up once
        per forward, shared by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.signed_sin[positions].unsqueeze(1).to(dtype)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hkv, D]; cos/signed_sin [T, 1, D] from RotaryEmbedding.lookup."""
    return apply_rotary_one(q, cos, signed_sin), apply_rotary_one(k, cos, signed_sin)


def apply_rotary_one(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] (any heads: q, k, or both side by side) -> a new rotated tensor: transformers'
    x * cos + rotate_half(x) * sin, where rotate_half(x) = cat(-x2, x1) and roll(x) = cat(x2, x1), with
    the sign carried by signed_sin. Bit-identical to it (tests/runtime/test_rotary_layer.py); 4 ops at
    decode instead of 7 (neg, two slices and a cat become one roll). Tables narrower than x (partial
    rotary, Phi-3 style) rotate the first dims and pass the rest through, as transformers does."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat([apply_rotary_one(x[..., :rot], cos, signed_sin), x[..., rot:]], dim=-1)
    rolled = torch.roll(x, x.shape[-1] // 2, dims=-1)
    return (x * cos).add_(rolled.mul_(signed_sin))
