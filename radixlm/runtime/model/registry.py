"""Architecture registry: HF `architectures` name -> how to build the model. A registry is a dict.

Runs inside the scheduler process.
"""

from __future__ import annotations

from typing import Callable

from radixlm.runtime.model.llama import ArchSpec, CausalLM


def _llama_like(hf_config) -> ArchSpec:
    return ArchSpec(qkv_bias=bool(getattr(hf_config, "attention_bias", False)))


ARCHITECTURES: dict[str, Callable[[object], ArchSpec]] = {
    "LlamaForCausalLM": _llama_like,
    "MistralForCausalLM": _llama_like,
    "Qwen2ForCausalLM": lambda c: ArchSpec(qkv_bias=True),
    "Qwen3ForCausalLM": lambda c: ArchSpec(qkv_bias=bool(getattr(c, "attention_bias", False)), qk_norm=True),
}


def build_model(hf_config, max_positions: int) -> CausalLM:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for name in archs:
        if name in ARCHITECTURES:
            if getattr(hf_config, "mlp_bias", False):
                raise ValueError(f"{name} with mlp_bias is not supported")
            return CausalLM(hf_config, ARCHITECTURES[name](hf_config), max_positions)
    raise ValueError(f"unsupported architecture {archs or 'unknown'}; supported: {sorted(ARCHITECTURES)}")
