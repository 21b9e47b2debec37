"""Architecture registry: HF `architectures` name -> how to build the model. A registry is a dict.

Runs inside the scheduler process.
"""

from __future__ import annotations

from typing import Callable

from radixlm.runtime.model.gemma import GemmaCausalLM, gemma3_arch
from radixlm.runtime.model.llama import ArchSpec, CausalLM


def _llama_like(hf_config) -> ArchSpec:
    return ArchSpec(qkv_bias=bool(getattr(hf_config, "attention_bias", False)))


ARCHITECTURES: dict[str, Callable[[object], ArchSpec]] = {
    "LlamaForCausalLM": _llama_like,
    "MistralForCausalLM": _llama_like,
    "Qwen2ForCausalLM": lambda c: ArchSpec(qkv_bias=True),
    "Qwen3ForCausalLM": lambda c: ArchSpec(qkv_bias=bool(getattr(c, "attention_bias", False)), qk_norm=True),
    "Phi3ForCausalLM": lambda c: ArchSpec(),  # fused qkv_proj / gate_up_proj in the checkpoint: CausalLM loads them
    "Gemma3ForCausalLM": gemma3_arch,
}
# Architectures whose decoder is not llama.py's CausalLM itself.
MODEL_CLASSES: dict[str, type[CausalLM]] = {"Gemma3ForCausalLM": GemmaCausalLM}
# Architectures whose sliding-window layers attend within their window on every attention path (the torch
# and Triton backends, the compiled CPU decode attention); the others attend to the whole context.
SLIDING_WINDOW_ARCHITECTURES = {"Gemma3ForCausalLM"}


def attends_within_window(hf_config) -> bool:
    """Whether the model built for hf_config honours its config's sliding window (model_runner caps the
    context at the window otherwise)."""
    archs = getattr(hf_config, "architectures", None) or []
    return any(name in SLIDING_WINDOW_ARCHITECTURES for name in archs)


def build_model(hf_config, max_positions: int) -> CausalLM:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for name in archs:
        if name in ARCHITECTURES:
            if getattr(hf_config, "mlp_bias", False):
                raise ValueError(f"{name} with mlp_bias is not supported")
            return MODEL_CLASSES.get(name, CausalLM)(hf_config, ARCHITECTURES[name](hf_config), max_positions)
    raise ValueError(f"unsupported architecture {archs or 'unknown'}; supported: {sorted(ARCHITECTURES)}")
