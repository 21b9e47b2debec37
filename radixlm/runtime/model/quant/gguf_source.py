"""A GGUF's 4-bit weight blocks (q4_0, q4_1, q4_K) as int4 values, scales and zeros, without requantizing.

Runs in the scheduler process at load time, when the mode is int4 and the model is a GGUF. Each of these
types stores, per group of 32 inputs, w = s * q + m with q in 0..15 (q4_0: m = -8 d; q4_K: s and m from
6-bit sub-block scales times the super-block's d / dmin), which is the int4 kernel's
(q - 8) * scale + zero with scale = s, zero = m + 8 s: exact. Rather than re-implement each type's bit
layout, s and m are read through gguf.quants.dequantize itself: the block with every 4-bit value set to
0 dequantizes to m, with every value set to 1 to s + m; q then follows from the real block's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixlm.runtime.model.gguf_meta import gguf_arch, hf_tensor_name, unpermute_qk
from radixlm.runtime.model.quant.kernels import GROUP

# Byte offset of the 4-bit values inside each block (after the block's scales).
NIBBLE_OFFSET = {"Q4_0": 2, "Q4_1": 4, "Q4_K": 16}


def _dequantize(blocks: np.ndarray, qtype: Any, shape: tuple[int, int]) -> np.ndarray:
    import gguf

    return np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float32).reshape(shape)


def int4_blocks(tensor: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One 4-bit ReaderTensor -> w, m, s as [out, in] float32 arrays (m, s constant over each group)."""
    import gguf

    qtype = tensor.tensor_type
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    blocks = np.asarray(tensor.data).reshape(-1, type_size)
    offset = NIBBLE_OFFSET[qtype.name]
    zeros, ones = blocks.copy(), blocks.copy()
    zeros[:, offset:] = 0x00
    ones[:, offset:] = 0x11
    w = _dequantize(blocks, qtype, shape)
    m = _dequantize(zeros, qtype, shape)
    return w, m, _dequantize(ones, qtype, shape) - m


def to_kernel_params(w: np.ndarray, m: np.ndarray, s: np.ndarray) -> tuple[torch.Tensor, ...]:
    """w = s q + m -> (q [out, in] int32 in 0..15, scale, zero [out, in / GROUP])."""
    safe = np.where(s == 0, 1, s)
    q = np.clip(np.rint((w - m) / safe), 0, 15).astype(np.int32)
    scale, zero = s[:, ::GROUP], m[:, ::GROUP] + 8 * s[:, ::GROUP]
    return torch.from_numpy(q), torch.from_numpy(np.ascontiguousarray(scale)), torch.from_numpy(
        np.ascontiguousarray(zero))


def read_int4_blocks(gguf_path: Path, hf_config: Any) -> dict[str, tuple[torch.Tensor, ...]]:
    """HF weight name -> (q, scale, zero) for every 4-bit 2-D tensor of the GGUF (llama q/k rows
    unpermuted, as gguf_loader does for the fp32 weights)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = gguf_arch(reader)
    heads = {"q_proj": hf_config.num_attention_heads,
             "k_proj": getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads}
    out: dict[str, tuple[torch.Tensor, ...]] = {}
    for t in reader.tensors:
        if t.tensor_type.name not in NIBBLE_OFFSET or len(t.shape) != 2:
            continue
        name = hf_tensor_name(t.name, arch)
        arrays = int4_blocks(t)
        proj = name.split(".")[-2]
        if arch == "llama" and proj in heads and ".self_attn." in name:
            arrays = tuple(unpermute_qk(a, heads[proj]) for a in arrays)
        out[name] = to_kernel_params(*arrays)
    return out
