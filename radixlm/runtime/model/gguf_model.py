"""A GGUF file's tensors into a CausalLM: as the file's own blocks (quantization=gguf) or dequantized.

Runs in the scheduler process. The file is memory-mapped (gguf_file.py): with the blocks kept, loading
costs no copy of the weights, the process holds the file's pages as llama.cpp does, and a model runs in
about its file's size. Every 2-D tensor becomes a quant.gguf_blocks.BlockMatrix; the 1-D ones (norms,
biases) are read as fp32 through the model's own load_weights.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from radixlm.runtime.model.gguf_file import GGUFFile
from radixlm.runtime.model.gguf_meta import (
    NON_PARAMETER_TENSORS, dequantize_tensor, gguf_arch, hf_tensor_name, hf_tensor_offset, unpermute_qk,
)
from radixlm.runtime.model.quant.gguf_blocks import (
    KERNEL_TYPES, BlockMatrix, GGUFWeight, embedding, gguf_linear, pack,
)

logger = logging.getLogger(__name__)


def open_gguf(path: Path) -> GGUFFile:
    return GGUFFile(path)


def _qk_heads(hf_config, hf_name: str) -> int | None:
    """llama.cpp's converter permuted llama's q/k rows; the head count to undo it with, else None."""
    if hf_name.endswith("self_attn.q_proj.weight") or hf_name.endswith("self_attn.q_proj.bias"):
        return hf_config.num_attention_heads
    if hf_name.endswith("self_attn.k_proj.weight") or hf_name.endswith("self_attn.k_proj.bias"):
        return getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    return None


def _rows_view(tensor: Any) -> np.ndarray:
    """The tensor's bytes as [rows, row_bytes] uint8, still a view of the mapped file."""
    rows = int(np.prod(tensor.shape[1:]))  # GGUF lists the row length first
    return np.asarray(tensor.data).view(np.uint8).reshape(rows, -1)


def block_matrix(tensor: Any, heads: int | None) -> BlockMatrix:
    """One 2-D GGUF tensor as a BlockMatrix; ValueError naming the type when no kernel reads it."""
    qtype = tensor.tensor_type.name
    if qtype not in KERNEL_TYPES:
        raise ValueError(
            f"GGUF tensor {tensor.name!r} has type {qtype}, which radixlm cannot run from its blocks (it runs "
            f"{', '.join(KERNEL_TYPES)}); pass quantization=none to dequantize the model to fp32 instead")
    rows = _rows_view(tensor)
    if heads is not None:
        rows = unpermute_qk(rows, heads)  # a copy: q/k rows only
    with warnings.catch_warnings():  # the map is read-only and nothing here writes to it
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(rows)
    return BlockMatrix(data, KERNEL_TYPES[qtype], int(tensor.shape[0]))


def _dense_values(tensor: Any, arch: str, name: str, heads: int | None) -> np.ndarray:
    """A tensor dequantized to fp32 with the HF checkpoint's values (q/k rows unpermuted, Gemma's norms
    stored as 1 + weight brought back)."""
    values = dequantize_tensor(tensor)
    if heads is not None:
        values = unpermute_qk(values, heads)
    offset = hf_tensor_offset(arch, name)
    return values + np.float32(offset) if offset else values


def _parameters(reader: Any, hf_config) -> Iterator[tuple[Any, str, str, int | None]]:
    """(tensor, arch, HF name, q/k heads to unpermute with or None) for every parameter tensor."""
    arch = gguf_arch(reader)
    for t in reader.tensors:
        if t.name in NON_PARAMETER_TENSORS:
            continue
        name = hf_tensor_name(t.name, arch)
        yield t, arch, name, _qk_heads(hf_config, name) if arch == "llama" else None


def _read(reader: Any, hf_config) -> tuple[dict[str, BlockMatrix], dict[str, torch.Tensor]]:
    """HF name -> BlockMatrix for the 2-D tensors, HF name -> fp32 tensor for the 1-D ones."""
    blocks: dict[str, BlockMatrix] = {}
    dense: dict[str, torch.Tensor] = {}
    for t, arch, name, heads in _parameters(reader, hf_config):
        if len(t.shape) == 1:
            dense[name] = torch.from_numpy(_dense_values(t, arch, name, heads))
        else:
            blocks[name] = block_matrix(t, heads)
    return blocks, dense


def _replace(owner: nn.Module, attr: str, value: object) -> None:
    owner._parameters.pop(attr, None)  # a plain attribute now, which the module's `linear` knows
    setattr(owner, attr, value)


# Each fused runtime weight and the checkpoint tensors it stacks, in row order: separate ones, or one
# already fused in the file (Phi-3's attn_qkv and ffn_up).
_FUSED = {("self_attn", "qkv_weight"): (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                                        ("self_attn.qkv_proj",)),
          ("self_attn", "o_weight"): (("self_attn.o_proj",),),
          ("", "gate_up_weight"): (("mlp.gate_proj", "mlp.up_proj"), ("mlp.gate_up_proj",)),
          ("", "down_weight"): (("mlp.down_proj",),)}


def _take(blocks: dict[str, BlockMatrix], prefix: str, spellings: tuple[tuple[str, ...], ...]) -> GGUFWeight:
    for names in spellings:
        keys = [f"{prefix}{n}.weight" for n in names]
        if all(k in blocks for k in keys):
            return GGUFWeight(tuple(blocks.pop(k) for k in keys))
    raise ValueError(f"the GGUF lacks the weight {prefix}{spellings[0][0]}.weight")


def _layer_weights(model: nn.Module, blocks: dict[str, BlockMatrix]) -> None:
    for i, layer in enumerate(model.layers):
        for (owner_path, attr), spellings in _FUSED.items():
            owner = layer.get_submodule(owner_path) if owner_path else layer
            _replace(owner, attr, _take(blocks, f"model.layers.{i}.", spellings))
        layer.linear = layer.self_attn.linear = gguf_linear


def _pack_weights(model: nn.Module, reader: GGUFFile) -> None:
    """Every GGUFWeight of the model repacked into panels where its types allow (quant.gguf_blocks.pack),
    one at a time, each one's file pages released as it is done: the process never holds the weights twice.
    The embedding table stays as the file's blocks (a lookup reads a few rows, mapped again as read)."""
    for module in model.modules():
        for attr, value in list(vars(module).items()):
            if not isinstance(value, GGUFWeight) or (packed := pack(value)) is value:
                continue
            setattr(module, attr, packed)
            for part in value.parts:
                reader.release(part.data.data_ptr(), part.data.nbytes)


def load_gguf_blocks(model: nn.Module, gguf_path: Path, hf_config) -> None:
    """Give the model the GGUF's tensors: linear weights, the embedding and the LM head as blocks, the linear
    ones then repacked for the kernels."""
    reader = open_gguf(gguf_path)
    blocks, dense = _read(reader, hf_config)
    table = blocks.pop("model.embed_tokens.weight")
    head = blocks.pop("lm_head.weight", table)  # a tied head reads the embedding's blocks (or a packed copy)
    _layer_weights(model, blocks)
    _replace(model, "embed_tokens", table)
    _replace(model, "lm_head", None)
    model.embedding = embedding
    model.lm_head_matmul, model.linear = GGUFWeight((head,)), gguf_linear
    model.load_weights(dense.items())  # norms and biases (q/k/v biases fused as for any checkpoint)
    _pack_weights(model, reader)


def iter_dequantized(reader: Any, hf_config) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, fp32 tensor) for every parameter of the GGUF, one at a time (quantization none / int8 /
    int4, tensor-parallel ranks, and the default model's fp32 conversion)."""
    for t, arch, name, heads in _parameters(reader, hf_config):
        yield name, torch.from_numpy(_dense_values(t, arch, name, heads))
