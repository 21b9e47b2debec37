"""Gemma-3 (text): llama.py's decoder with Gemma's differences, after transformers' Gemma3ForCausalLM.

Runs inside the scheduler process. What differs from Llama:
  - the embeddings are multiplied by sqrt(hidden_size), rounded to the embedding dtype first;
  - every RMSNorm scales by 1 + weight, in fp32 (GemmaRMSNorm), the per-head q/k norms included;
  - four norms a layer: the attention and MLP outputs are normed before their residual adds
    (post_attention_layernorm, post_feedforward_layernorm), the MLP input by pre_feedforward_layernorm;
  - gelu (tanh approximation, `hidden_activation`) instead of silu;
  - the attention scale is query_pre_attn_scalar ** -0.5 (Dims.sm_scale);
  - each layer is "sliding_attention" (attends to the last `sliding_window` tokens) or "full_attention"
    (config.layer_types), with its own rotary table (rope_parameters[layer type]: the local base frequency
    for sliding layers, rope_theta and any scaling for full ones).
Tied embeddings and final_logit_softcapping are CausalLM's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.model.layers.norm import GemmaRMSNorm
from radixlm.runtime.model.layers.rotary import RotaryEmbedding
from radixlm.runtime.model.llama import ArchSpec, CausalLM, DecoderLayer, Dims

# transformers' ACT2FN names Gemma configs use -> the same torch function.
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
}


def gemma3_arch(hf_config) -> ArchSpec:
    """The ArchSpec of a Gemma-3 config; ValueError for the variants this decoder does not compute."""
    if getattr(hf_config, "attn_logit_softcapping", None) is not None:
        raise ValueError("attention logit softcapping (attn_logit_softcapping) is not supported")
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise ValueError("bidirectional attention (use_bidirectional_attention) is not supported")
    return ArchSpec(qkv_bias=bool(getattr(hf_config, "attention_bias", False)), qk_norm=True, norm=GemmaRMSNorm)


def _activation(hf_config) -> Callable[[torch.Tensor], torch.Tensor]:
    name = getattr(hf_config, "hidden_activation", None) or "gelu_pytorch_tanh"
    if name not in _ACTIVATIONS:
        raise ValueError(f"Gemma hidden_activation {name!r} is not supported (supported: {sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


class GemmaDecoderLayer(DecoderLayer):
    """A Gemma-3 layer. Like DecoderLayer it returns (output, residual) and leaves its residual add to the
    next layer's input norm (forward_residual), so the final norm of CausalLM.forward applies unchanged."""

    def __init__(self, d: Dims, arch: ArchSpec, layer_id: int, layer_type: str, window: int | None,
                 act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__(d, arch, layer_id, window)
        self.pre_feedforward_layernorm = arch.norm(d.hidden, d.rms_eps)
        self.post_feedforward_layernorm = arch.norm(d.hidden, d.rms_eps)
        self.layer_type = layer_type  # picks the layer's rotary table
        self.act = act

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                ropes: dict[str, tuple[torch.Tensor, torch.Tensor]], backend, kv_pool, meta
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.forward_residual(x, residual)
        h = self.self_attn(h, ropes[self.layer_type], backend, kv_pool, meta)
        h, residual = self.pre_feedforward_layernorm.forward_residual(self.post_attention_layernorm(h), residual)
        gate, up = self.linear(h, self.gate_up_weight).split(self.intermediate, dim=-1)
        out = self.linear(self.act(gate).mul_(up), self.down_weight)
        if self.tp is not None:
            out = self.tp.all_reduce(out)  # row-parallel down_proj: the norm needs the full sum
        return self.post_feedforward_layernorm(out), residual


class GemmaCausalLM(CausalLM):
    def __init__(self, hf_config, arch: ArchSpec, max_positions: int):
        super().__init__(hf_config, arch, max_positions)
        # transformers keeps sqrt(hidden) as an fp32 tensor and casts it to the embedding dtype per use
        # (bf16 rounds sqrt(640) = 25.298 to 25.25): the same here.
        self.register_buffer("embed_scale", torch.tensor(self.dims.hidden ** 0.5), persistent=False)

    def _make_layer(self, hf_config, arch: ArchSpec, layer_id: int) -> nn.Module:
        layer_type = hf_config.layer_types[layer_id]
        window = hf_config.sliding_window if layer_type == "sliding_attention" else None
        return GemmaDecoderLayer(self.dims, arch, layer_id, layer_type, window, _activation(hf_config))

    def _make_rotary(self, hf_config, max_positions: int) -> nn.Module:
        types = sorted(set(hf_config.layer_types))
        return nn.ModuleDict({t: RotaryEmbedding(hf_config, self.dims.rotary_dim, max_positions, t) for t in types})

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {t: rotary.lookup(positions, dtype) for t, rotary in self.rotary.items()}

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super()._embed(input_ids)
        return x * self.embed_scale.to(x.dtype)
