"""Which weight quantization a model runs with, and replacing its linear weights with quantized ones.

Runs in the scheduler process, once, after loading and the weight layout (not on tensor-parallel ranks).
Modes (ModelConfig.quantization, SGLang's --quantization):
  none  fp32 (or the model dtype) as loaded: the reference the parity tests use.
  int8  8-bit weights with per-channel scales: steps of <= kernels.GEMV_MAX_ROWS rows run radixlm's
        compiled int8 GEMV with fp32 activations (radixlm/kernels/cpu, where it builds), others
        _weight_int8pack_mm with bf16 activations (fbgemm's dynamic int8 linear was faster but quantizes
        activations too: +93% perplexity, docs/benchmarks.md).
  int4  4-bit weights in groups of 32 inputs (scale + zero each), _weight_int4pack_mm_for_cpu with bf16
        activations (its fp32-activation path was measured 10-40x slower).
  gguf  a GGUF file's own blocks, read in place by radixlm's kernels (gguf_blocks.py; CPU).
  auto  gguf for a GGUF on the CPU; otherwise DEFAULT_CPU on the CPU and none elsewhere.
q/k/v (fused), o, gate/up (fused) and down are quantized, and int8's LM head (QUANTIZE_LM_HEAD; int4's
measured too sensitive); int8's first layers (DENSE_LAYERS_PER: 2 of SmolLM2's 30), norms, the embedding
lookup, biases and the KV cache keep the model dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch
from torch import nn

from radixlm.runtime.model.quant.kernels import (
    GROUP, Int4Weight, pack_int4, quant_linear, quantize_int4, quantize_int8, with_dense,
)

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("auto", "none", "int8", "int4", "gguf")
DEFAULT_CPU = "none"
# The LM head (SmolLM2: the tied embedding, 21% of the weights, 113 of int8's ~240 MB streamed per
# token) measured far more sensitive than the layers: int4 +5.75% ppl with it quantized, +0.19% with it
# dense, so int4 keeps it dense (fp32, in the weight layout). int8 quantizes it: with the first layers
# dense (below) int8 measured +0.56% with the head int8 vs +0.32% with it fp32 (target <= +1%), and the
# head's one-row matmul takes 2.0 ms instead of 5.1 (fp32 column-major; 1 thread, docs/benchmarks.md).
QUANTIZE_LM_HEAD = {"int8": True, "int4": False}  # see docs/engine.md "Quantized and bf16 weights"
# The first layers' matmuls measured the most sensitive to int8 (SmolLM2-135M-Instruct, perplexity of
# benchmarks/data/declaration.txt vs fp32, benchmarks/quant_quality.py, 1 thread): every layer int8
# +0.96% (+1.09% in an earlier 2-thread run: on the +1% target's edge), layer 0 kept +0.69%, layers 0-1
# kept +0.22%, layers 0-1 and the last +0.15%, the last alone +0.93%. So int8 keeps its first layers
# in the model dtype (in the weight layout's fast fp32 form): one per DENSE_LAYERS_PER layers, i.e. 2 of
# SmolLM2's 30 (~21 MB more streamed per token than all-int8, ~10% of int8's bytes; measured on that
# model only), none in models under 15 layers (the tests' tiny checkpoints stay fully int8).
DENSE_LAYERS_PER = {"int8": 15, "int4": 0}  # 0: none kept


def dense_first_layers(mode: str, num_layers: int) -> int:
    """How many leading layers `mode` keeps unquantized (see DENSE_LAYERS_PER)."""
    per = DENSE_LAYERS_PER.get(mode, 0)
    return num_layers // per if per else 0

# (owner path, attribute, HF names of the parts fused into it, in row order)
_LAYER_WEIGHTS = (("self_attn", "qkv_weight", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                  ("self_attn", "o_weight", ("self_attn.o_proj",)),
                  ("", "gate_up_weight", ("mlp.gate_proj", "mlp.up_proj")),
                  ("", "down_weight", ("mlp.down_proj",)))

# HF weight name -> (q [out, in] in 0..15, scale, zero [out, in / 32]): int4 values read from a GGUF as is.
Int4Source = Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def resolve_quantization(requested: str, device: torch.device, tp_size: int, is_gguf: bool) -> str:
    """The concrete mode ("none", "int8", "int4" or "gguf"); ValueError for a bad name or an unsupported
    setup. is_gguf: the model's weights are a GGUF file's."""
    if requested not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {requested!r}")
    if requested == "auto":
        if device.type != "cpu" or tp_size > 1:
            return "none"
        return "gguf" if is_gguf else DEFAULT_CPU
    if requested == "gguf" and not is_gguf:
        raise ValueError("quantization=gguf runs a GGUF file's own blocks; this model is not a GGUF file")
    if requested != "none" and device.type != "cpu":
        raise ValueError(f"quantization={requested} runs on the CPU only (radixlm's and torch's CPU kernels); "
                         f"this model runs on {device.type}: use quantization=none")
    if requested != "none" and tp_size > 1:
        raise ValueError(f"quantization={requested} is not supported with tp_size > 1")
    return requested


def _quantizer(mode: str, ops=None) -> Callable[[torch.Tensor], object]:
    if mode == "int8":
        return lambda w: quantize_int8(w, torch.bfloat16, ops)
    if mode == "int4":
        return lambda w: quantize_int4(w, torch.bfloat16)
    raise ValueError(f"not a quantized mode: {mode!r}")


def _as_matrix(w: torch.Tensor) -> torch.Tensor:
    """The logical [out, in] matrix of a weight in any layout (a blocks view is [p, out/p, in]; the packed
    layout's oneDNN tensor is opaque; packed_blocks holds one and a blocks view)."""
    w = getattr(w, "packed", w)
    if w.is_mkldnn:
        return w.to_dense()
    return w.reshape(-1, w.shape[-1]) if w.dim() == 3 else w


def _from_source(parts: list[str], source: Int4Source) -> Int4Weight | None:
    if not parts or not all(p in source for p in parts):
        return None
    q, scale, zero = (torch.cat([source[p][i] for p in parts]) for i in range(3))
    return pack_int4(q, scale, zero, torch.bfloat16)


def quantize_model(model: nn.Module, mode: str, source: Int4Source | None = None, dense: bool = False,
                   ops=None) -> int:
    """Replace the model's linear weights by `mode`'s quantized ones, in place; returns how many were
    taken from `source` as they are (a GGUF's int4 blocks) instead of quantized from the loaded weights.
    dense: also keep each layer weight's dequantized bf16 copy for many-row steps (kernels.DENSE_MIN_ROWS;
    only worth its memory where the CPU computes bf16 natively). ops: the compiled CPU ops
    (radixlm.kernels.cpu.load()), for int8's few-row GEMV (kernels.GEMV_MAX_ROWS); None: torch's kernel."""
    if mode in ("none", "gguf"):  # gguf: the weights were loaded as blocks (gguf_model.py)
        return 0
    quantize, exact = _quantizer(mode, ops), 0
    source = source if mode == "int4" else None
    keep = dense_first_layers(mode, len(model.layers))
    for i, layer in enumerate(model.layers):
        if i < keep:
            continue  # kept in the model dtype, with its `linear` (see DENSE_LAYERS_PER)
        for owner_path, attr, parts in _LAYER_WEIGHTS:
            owner = layer.get_submodule(owner_path) if owner_path else layer
            names = [f"model.layers.{i}.{p}.weight" for p in parts]
            weight = _from_source(names, source) if source else None
            exact += weight is not None
            if weight is None:
                weight = quantize(_as_matrix(getattr(owner, attr)))
            if dense:
                weight = with_dense(weight)
            owner._parameters.pop(attr, None)  # a plain attribute, which `linear` knows (packed: one already)
            setattr(owner, attr, weight)
        layer.linear = layer.self_attn.linear = quant_linear
    if not QUANTIZE_LM_HEAD[mode]:
        return exact
    head_name = "lm_head.weight" if model.lm_head is not None else "model.embed_tokens.weight"
    head = _from_source([head_name], source) if source else None
    exact += head is not None
    if head is None:
        dense = model.embed_tokens if model.lm_head is None else model.lm_head
        if model.lm_head_matmul is not None:  # the weight layout's form (the packed layout drops lm_head)
            dense = model.lm_head_matmul
        head = quantize(_as_matrix(dense))
    model.lm_head_matmul, model.lm_head_single_row, model.linear = head, None, quant_linear
    if model.lm_head is not None:  # an untied head is used only as a matmul: drop the dense copy
        model.lm_head = None
    return exact


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights, dense and quantized (for the startup log)."""
    total = sum(p.nbytes for p in model.parameters())
    for module in model.modules():
        for value in vars(module).values():
            nbytes = getattr(value, "nbytes", None)
            if callable(nbytes):
                total += nbytes()
            elif isinstance(value, torch.Tensor) and value.is_mkldnn:  # the packed layout's weights
                total += value.nbytes
    return total


__all__ = ["DENSE_LAYERS_PER", "GROUP", "QUANTIZATIONS", "DEFAULT_CPU", "dense_first_layers",
           "quantize_model", "resolve_quantization", "weight_bytes"]
