"""The weight format a ModelRunner uses, decided once at start-up from the config, the CPU and the model
file, and logged. Runs in the scheduler process."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from radixlm.runtime.model.quant.apply import dense_first_layers, quantize_model, resolve_quantization, weight_bytes
from radixlm.runtime.model.quant.cpu_caps import CpuCaps, cpu_caps
from radixlm.runtime.model.quant.kernels import DENSE_MIN_ROWS, GEMV_MAX_ROWS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeightPlan:
    quantization: str  # none | int8 | int4
    dtype: torch.dtype  # of everything not quantized (and the KV cache)
    caps: CpuCaps
    gguf_path: Path | None  # the model's GGUF file, when it is one


def resolve_cpu_dtype(dtype: torch.dtype, requested: str, caps: CpuCaps) -> torch.dtype:
    """bf16 on a CPU without native bf16 (AVX512-BF16 / AMX) would run emulated, slower than fp32:
    fall back to fp32 and say so (a config written for one machine still runs, never slower, on another)."""
    if dtype == torch.bfloat16 and not caps.native_bf16:
        logger.warning("dtype=%s: this CPU (%s) has no native bf16 (AVX512-BF16 or AMX); using float32, "
                       "which is faster here", requested, caps.describe())
        return torch.float32
    return dtype


def plan_weights(requested: str, requested_dtype: str, dtype: torch.dtype, device: torch.device,
                 tp_size: int, gguf_path: Path | None) -> WeightPlan:
    """gguf_path: the GGUF file the model's weights are read from (None: safetensors)."""
    caps = cpu_caps()
    if device.type == "cpu":
        dtype = resolve_cpu_dtype(dtype, requested_dtype, caps)
    mode = resolve_quantization(requested, device, tp_size, gguf_path is not None)
    if mode == "gguf" and _block_ops() is None:
        logger.warning("radixlm's compiled CPU ops are off, and with them the kernels that read a GGUF's blocks: "
                       "the model is dequantized to %s instead (about 4-8x the file's size in memory)",
                       str(dtype).removeprefix("torch."))
        mode = "none"
    if mode == "gguf" and dtype != torch.float32:
        # The block kernels take and return fp32 (int8 inside); the norms, attention and KV pool follow them.
        logger.warning("dtype=%s with a GGUF's own blocks: running float32 around them", requested_dtype)
        dtype = torch.float32
    return WeightPlan(mode, dtype, caps, gguf_path)


def _block_ops():
    from radixlm.kernels import cpu

    return cpu.load()


def apply_plan(model: nn.Module, plan: WeightPlan, hf_config) -> None:
    """Quantize the loaded model as planned (int4 from a GGUF's own 4-bit blocks where it has them)."""
    if plan.quantization == "gguf":
        logger.info("weights: the GGUF's own blocks (%s), read in place from %s; CPU %s",
                    _type_summary(model), plan.gguf_path.name, plan.caps.describe())
        return
    source = None
    if plan.quantization == "int4" and plan.gguf_path is not None:
        from radixlm.runtime.model.quant.gguf_source import read_int4_blocks

        source = read_int4_blocks(plan.gguf_path, hf_config)
    dense = plan.caps.native_bf16  # bf16 GEMMs for many-row steps (kernels.DENSE_MIN_ROWS)
    ops = None
    if plan.quantization == "int8":  # the compiled few-row GEMV (kernels.GEMV_MAX_ROWS), where it builds
        from radixlm.kernels import cpu as cpu_ops

        ops = cpu_ops.load()  # the process's build (build.default_isa: AVX2 where torch dispatches at AVX2)
    exact = quantize_model(model, plan.quantization, source, dense, ops)
    kept = dense_first_layers(plan.quantization, len(model.layers))
    detail = {"none": "", "int8": f", int8 per channel, bf16 activations, the LM head and the first {kept} "
                                  f"layer(s) {str(plan.dtype).removeprefix('torch.')}",
              "int4": ", int4 groups of 32, bf16 activations"}[plan.quantization]
    if ops is not None:
        detail += f", compiled int8 GEMV (fp32 activations) for steps of <= {GEMV_MAX_ROWS} rows"
    if dense and plan.quantization != "none":
        detail += f", bf16 copies for steps of >= {DENSE_MIN_ROWS} rows"
    from_gguf = f", {exact} taken from the GGUF's 4-bit blocks as they are" if source is not None else ""
    logger.info("weights: quantization=%s%s%s, dtype=%s, %.1f MB; CPU %s", plan.quantization, detail, from_gguf,
                str(plan.dtype).removeprefix("torch."), weight_bytes(model) / 1e6, plan.caps.describe())


def _type_summary(model: nn.Module) -> str:
    """The GGUF types of the model's linear weights with their counts, e.g. "Q4_K x96, Q6_K x24"."""
    from collections import Counter

    from radixlm.runtime.model.quant.gguf_blocks import KERNEL_TYPES, GGUFWeight

    names = {v: k for k, v in KERNEL_TYPES.items()}
    counts = Counter(names[p.qtype] for m in model.modules() for v in vars(m).values() if isinstance(v, GGUFWeight)
                     for p in v.parts)
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common())
