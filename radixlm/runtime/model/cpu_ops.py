"""Hands radixlm's compiled CPU ops (radixlm.kernels.cpu) to the model's modules, once, at model load.

Runs inside the scheduler process. At batch-1 decode the per-step work outside the matmuls is ~1000 small
ATen calls (RMSNorm, rotary, K/V stores, gathers, SDPA, SiLU); each op here replaces several of them
(docs/engine.md, "CPU speed"). Only for fp32 on the CPU without tensor parallelism (the ops are fp32
loops; the TP path keeps torch and its all-reduces), and only where load() found or built them: without a
compiler, or with RADIXLM_CPU_OPS=0, every module keeps its torch code.

The modules hold the ops namespace as an attribute (`native`) rather than looking it up per call:
  RMSNorm (the decoder's two a layer and the final one; Qwen3's q/k norms run on strided views: torch)
  Attention (decode steps: rotary + K/V store; not with q/k norms, which come before the rotary, nor with
             partial rotary)
  DecoderLayer (silu(gate) * up; and a one-token decode step as one op, decode_layer, with fp32 weights in
               any layout of weight_layout.py, and int8 weights through their tiled copy; not int4)
and TorchAttentionBackend(ops) runs decode rows with the paged decode attention. Once the KV pool exists,
decode_stack() gives the model every layer of a one-token step as one call (csrc/decode_stack.cpp). With the
packed_tiles layout the model also gets an ArgmaxHead: the LM head of a one-row step that only wants the
argmax, read as bf16 with f32_linear's exact result (csrc/argmax_head.cpp); and, where the CPU multiplies
bf16 natively, an ArgmaxRows: the same for a step of several such rows (a batch's greedy decode rows, a
greedy verify row's positions), screened by a bf16 matmul.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.model.quant.cpu_caps import cpu_caps
from radixlm.runtime.model.quant.kernels import Int8Weight, quant_linear
from radixlm.runtime.model.weight_layout import PackedRows, Tiles, blocked_linear, packed_linear


def load_cpu_ops(device: torch.device, dtype: torch.dtype, tensor_parallel: bool, attention_backend: str):
    """The ops namespace when they apply to this model run, else None. The attention ops are part of the
    torch backend (the decode path stores K/V itself and hands q to TorchAttentionBackend.decode_stored)."""
    if device.type != "cpu" or dtype != torch.float32 or tensor_parallel or attention_backend not in ("auto", "torch"):
        return None
    from radixlm.kernels.cpu import load

    return load()


def apply_cpu_ops(model: nn.Module, ops) -> None:
    """Give the model's modules the compiled ops (see the module docstring); in place."""
    for layer in model.layers:
        layer.input_layernorm.native = layer.post_attention_layernorm.native = ops
        if layer.self_attn.compiled_rotary:
            layer.self_attn.native = ops
            layer.decode_weights = one_row_weights(layer)
        layer.native = ops
    model.norm.native = ops
    model.lm_head_argmax = argmax_head(model, ops)
    model.lm_head_argmax_rows = argmax_rows_head(model, ops)


@dataclass(frozen=True, eq=False)
class ArgmaxHead:
    """The LM head for one row whose token is the argmax of its raw logits: the candidates' exact fp32
    logits (f32_linear's bits), -inf elsewhere, from a bf16 read of the weights (csrc/argmax_head.cpp)."""

    tiles: Tiles
    screen: torch.Tensor  # bf16, the tiles' layout
    coef: torch.Tensor  # fp32 [out]: each row's error bound per unit of ||x||
    op: Callable[..., torch.Tensor]  # the build's argmax_linear (x [1, in], data, screen, coef, out)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.op(h, self.tiles.data, self.screen, self.coef, self.tiles.out_features)


def argmax_head(model: nn.Module, ops) -> ArgmaxHead | None:
    """An ArgmaxHead where the LM head's one-row form is f32_linear's tiled copy (packed_tiles, fp32); it
    keeps a bf16 copy of the head (half its bytes) beside it. None otherwise."""
    head = model.lm_head_matmul
    tiles = head.rows if isinstance(head, PackedRows) else None
    if not isinstance(tiles, Tiles) or tiles.linear is not ops.f32_linear:
        return None
    screen, coef = ops.argmax_screen(tiles.data, tiles.out_features)
    return ArgmaxHead(tiles, screen, coef, ops.argmax_linear)


@dataclass(frozen=True, eq=False)
class ArgmaxRows:
    """The LM head for several rows whose tokens are the argmax of their raw logits. With many rows the
    head is bound by its arithmetic: a bf16 x bf16 matmul (oneDNN, ~2x fp32's rate where bf16 is native)
    screens every logit, and each row's candidates get f32_linear's exact logits, -inf elsewhere
    (csrc/argmax_head.cpp argmax_rows): each row's result is the same bits as the one-row head's."""

    tiles: Tiles
    screen: torch.Tensor  # the head as bf16, oneDNN-packed
    coef: torch.Tensor  # fp32 [out]: argmax_screen's bound per unit of ||x||
    wnorm: torch.Tensor  # fp32 [out]: each row's norm, rounded up
    op: Callable[..., torch.Tensor]  # the build's argmax_rows

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        screened = torch.ops.mkldnn._linear_pointwise(h.to(torch.bfloat16), self.screen, None, "none", [], "")
        return self.op(h, screened, self.tiles.data, self.coef, self.wnorm, self.tiles.out_features)


def argmax_rows_head(model: nn.Module, ops) -> ArgmaxRows | None:
    """An ArgmaxRows beside the one-row ArgmaxHead, where the CPU multiplies bf16 natively (elsewhere oneDNN
    emulates bf16 through fp32, slower than the fp32 head itself). Keeps a bf16 copy of the head (half
    its fp32 bytes)."""
    one_row = model.lm_head_argmax
    if one_row is None or not cpu_caps().native_bf16 or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    dense = model.lm_head_matmul.packed.to_dense()  # oneDNN's copy back in [out, in] (the exact values)
    screen = torch.ops.mkldnn._reorder_linear_weight(dense.to(torch.bfloat16))
    return ArgmaxRows(one_row.tiles, screen, one_row.coef, row_norms_up(dense), ops.argmax_rows)


def row_norms_up(w: torch.Tensor) -> torch.Tensor:
    """Each row's Euclidean norm as fp32, rounded up (never below the exact norm: ArgmaxRows' bound)."""
    norms = torch.linalg.vector_norm(w.double(), dim=1)
    rounded = norms.float()
    return torch.where(rounded.double() < norms, torch.nextafter(rounded, torch.tensor(float("inf"))), rounded)


@dataclass(frozen=True)
class OneRowWeights:
    """What decode_layer multiplies one row with, per weight (qkv, o, gate_up, down): the tensor, the int8
    scales (None unless int8), and the tiled output rows (0 unless the weight is gemv.cpp's tiled copy)."""

    weights: tuple[torch.Tensor, ...]
    scales: tuple[torch.Tensor | None, ...]
    tiled: tuple[int, ...]


def one_row_weights(layer: nn.Module) -> OneRowWeights | None:
    """The weights the layer's `linear` multiplies one row with, when decode_layer's matmul takes each the
    same way: row blocks [p, out/p, in] -> bmm, oneDNN-packed -> its inner product, [out, in] -> linear, a
    tiled copy -> the compiled fp32 GEMV (packed_tiles) or int8 GEMV (int8 weights with `tiles`, the same
    kernel quant_linear runs at one row). None otherwise (int4, int8 without the tiled copy), which keeps
    the module-by-module path."""
    attn = layer.self_attn
    if attn.linear is not layer.linear or layer.linear not in (F.linear, blocked_linear, packed_linear, quant_linear):
        return None
    out = []
    for w in (attn.qkv_weight, attn.o_weight, layer.gate_up_weight, layer.down_weight):
        entry = _one_row(w, layer.linear)
        if entry is None:
            return None
        out.append(entry)
    weights, scales, tiled = zip(*out)
    return OneRowWeights(weights, scales, tiled)


def decode_stack(model: nn.Module, ops, kv_pool):
    """A DecodeStack (csrc/decode_stack.cpp) holding every layer's one-row weights and K/V buffers, or None
    when a layer steps module by module (decode_weights None: Qwen3's q/k norms, int4). With it, a one-token
    decode step of the whole model is one call: the ~1 ms a token of Python between 30 layers' decode_layer
    calls goes (docs/benchmarks.md)."""
    if not model.layers or any(layer.decode_weights is None for layer in model.layers):
        return None
    d = model.dims
    stack = getattr(torch.classes, ops.name).DecodeStack(d.rms_eps, d.num_heads, d.num_kv_heads, model.norm.weight)
    for i, layer in enumerate(model.layers):
        attn, w = layer.self_attn, layer.decode_weights
        qkv, o, gate_up, down = w.weights
        stack.add_layer(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qkv, attn.qkv_bias, o,
                        gate_up, down, kv_pool.k_buffer[i], kv_pool.v_buffer[i], *w.scales, list(w.tiled))
    return stack


def _one_row(w, linear) -> tuple[torch.Tensor, torch.Tensor | None, int] | None:
    if linear is quant_linear:
        if not isinstance(w, Int8Weight) or w.tiles is None:
            return None
        return w.tiles.data, w.tiles.scales, w.tiles.scales.numel()
    if isinstance(w, PackedRows):
        w = w.rows  # what packed_linear multiplies one row with
    if isinstance(w, Tiles):
        return w.data, None, w.out_features
    if not isinstance(w, torch.Tensor) or w.dtype != torch.float32 or w.dim() not in (2, 3):
        return None
    if (w.dim() == 3 and linear is F.linear) or (w.is_mkldnn and linear is not packed_linear):
        return None
    return w, None, 0
