"""The decoder-only transformer shared by Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm) and Phi-3
(fused checkpoint projections, partial rotary); gemma.py builds Gemma-3 from its pieces.

Runs inside the scheduler process. Tokens of all requests in a step are one flat [T] batch; attention
goes through the backend over the paged KV pool. Q/K/V and gate/up projections are fused into one
matmul each after loading (fewer, larger GEMMs are what make CPU decode fast).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.forward import AttentionMetadata
from radixlm.runtime.model.layers.attention import AttentionBackend, KVPoolLike, short_extend
from radixlm.runtime.model.layers.norm import RMSNorm
from radixlm.runtime.model.layers.rotary import RotaryEmbedding, apply_rotary, apply_rotary_one


@dataclass(frozen=True)
class ArchSpec:
    """What distinguishes the supported architectures (the registry maps `architectures` to one)."""

    qkv_bias: bool = False  # Qwen2 (or Llama's attention_bias)
    qk_norm: bool = False  # Qwen3, Gemma-3
    norm: type[RMSNorm] = RMSNorm  # every RMSNorm of the model (Gemma: GemmaRMSNorm, scale 1 + weight)


@dataclass(frozen=True)
class Dims:
    hidden: int
    intermediate: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_eps: float
    tie_embeddings: bool
    rotary_dim: int  # the rotated dims of a head: head_dim unless partial_rotary_factor < 1 (Phi-3 style)
    sm_scale: float  # attention scale: head_dim ** -0.5, Gemma's query_pre_attn_scalar ** -0.5

    @classmethod
    def from_hf(cls, c) -> "Dims":
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                   getattr(c, "num_key_value_heads", None) or c.num_attention_heads, head_dim,
                   c.vocab_size, c.rms_norm_eps, bool(getattr(c, "tie_word_embeddings", False)),
                   int(head_dim * _partial_rotary_factor(c)),
                   float(getattr(c, "query_pre_attn_scalar", None) or head_dim) ** -0.5)


def _partial_rotary_factor(c) -> float:
    """transformers 5 keeps it in rope_parameters (per layer type for Gemma-3: no factor there), 4 on the config."""
    params = getattr(c, "rope_parameters", None) or {}
    return float(params.get("partial_rotary_factor") or getattr(c, "partial_rotary_factor", None) or 1.0)


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, d: Dims, arch: ArchSpec, layer_id: int, window: int | None = None):
        """window: this layer's sliding window (a token sees itself and the window - 1 before it); None: the
        whole context."""
        super().__init__()
        self.d, self.layer_id, self.window = d, layer_id, window
        self.q_size, self.kv_size = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
        self.qkv_weight = _param(self.q_size + 2 * self.kv_size, d.hidden)
        self.qkv_bias = _param(self.q_size + 2 * self.kv_size) if arch.qkv_bias else None
        self.o_weight = _param(d.hidden, self.q_size)
        self.q_norm = arch.norm(d.head_dim, d.rms_eps) if arch.qk_norm else None
        self.k_norm = arch.norm(d.head_dim, d.rms_eps) if arch.qk_norm else None
        self.tp = None  # parallel.TPContext when tensor-parallel (set by parallel.shard_model)
        self.linear = F.linear  # x @ W^T for this layout of the weights (weight_layout.py may swap it)
        # Compiled CPU ops (cpu_ops.py) for decode steps and short extends (speculative verify rows): rotary +
        # K/V store in one op, then the torch backend's paged decode attention on the stored K/V. None: torch.
        self.native = None

    @property
    def compiled_rotary(self) -> bool:
        """Whether the compiled rotary + K/V store (and the whole-layer decode op) compute this attention: the
        full head rotated straight after the projection (no q/k norms in between, no partial rotary), over
        the whole context (their attention has no window)."""
        return self.q_norm is None and self.d.rotary_dim == self.d.head_dim and self.window is None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                backend: AttentionBackend, kv_pool: KVPoolLike, meta: AttentionMetadata) -> torch.Tensor:
        d = self.d
        qkv = self.linear(x, self.qkv_weight, self.qkv_bias)
        if self.native is not None and (meta.is_decode or short_extend(meta)):
            q = self.native.rope_store_kv(qkv, *rope, kv_pool.k_buffer[self.layer_id], kv_pool.v_buffer[self.layer_id],
                                          meta.out_cache_loc, d.num_heads, d.num_kv_heads)
            if meta.is_decode:
                o = backend.decode_stored(q, self.layer_id, kv_pool, meta)
            else:  # a verify step: each of a row's tokens attends as a decode row (attention.short_extend)
                o = backend.extend_stored(q, self.layer_id, kv_pool, meta)
            return self.linear(o.reshape(-1, self.q_size), self.o_weight)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        v = v.reshape(-1, d.num_kv_heads, d.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, d.num_heads, d.head_dim))
            k = self.k_norm(k.reshape(-1, d.num_kv_heads, d.head_dim))
            q, k = apply_rotary(q, k, *rope)
        else:
            # q and k are adjacent in the fused output: rotate them as one [T, Hq + Hkv, D] tensor
            # (half the elementwise kernels; decode at batch 1 is dominated by per-kernel overhead).
            qk = qkv[:, : self.q_size + self.kv_size].view(-1, d.num_heads + d.num_kv_heads, d.head_dim)
            q, k = apply_rotary_one(qk, *rope).split([d.num_heads, d.num_kv_heads], dim=1)
        o = backend.forward(q, k, v.contiguous(), self.layer_id, kv_pool, meta, self.window)
        out = self.linear(o.reshape(-1, self.q_size), self.o_weight)
        return out if self.tp is None else self.tp.all_reduce(out)  # row-parallel o_proj


class DecoderLayer(nn.Module):
    def __init__(self, d: Dims, arch: ArchSpec, layer_id: int, window: int | None = None):
        super().__init__()
        self.input_layernorm = arch.norm(d.hidden, d.rms_eps)
        self.self_attn = Attention(d, arch, layer_id, window)
        self.post_attention_layernorm = arch.norm(d.hidden, d.rms_eps)
        self.gate_up_weight = _param(2 * d.intermediate, d.hidden)
        self.down_weight = _param(d.hidden, d.intermediate)
        self.intermediate = d.intermediate
        self.tp = None  # parallel.TPContext when tensor-parallel
        self.linear = F.linear  # see Attention.linear
        self.native = None  # compiled CPU ops for silu(gate) * up (cpu_ops.py); None: torch
        # With the compiled ops: the (qkv, o, gate_up, down) weights a one-row matmul uses, for the whole-layer
        # decode op (cpu_ops.one_row_weights); None: the step runs module by module.
        self.decode_weights = None  # cpu_ops.OneRowWeights

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: tuple[torch.Tensor, torch.Tensor],
                backend, kv_pool, meta) -> tuple[torch.Tensor, torch.Tensor]:
        if self.decode_weights is not None and meta.is_decode and x.shape[0] == 1:
            return self._decode_one_token(x, residual, rope, kv_pool, meta)
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.forward_residual(x, residual)
        h = self.self_attn(h, rope, backend, kv_pool, meta)
        h, residual = self.post_attention_layernorm.forward_residual(h, residual)
        gate_up = self.linear(h, self.gate_up_weight)
        if self.native is not None:
            act = self.native.silu_mul(gate_up)
        else:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            act = F.silu(gate).mul_(up)  # in place: one [T, I] buffer, not two
        out = self.linear(act, self.down_weight)
        return (out if self.tp is None else self.tp.all_reduce(out)), residual  # row-parallel down_proj

    def _decode_one_token(self, x: torch.Tensor, residual: torch.Tensor | None, rope, kv_pool, meta
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward() for a one-token decode step as one compiled op (kernels/cpu/csrc/decode_layer.cpp): the
        same chain of ops, without ~30 Python-level calls. residual is updated in place (the first layer's is
        the embedding output x)."""
        attn, d = self.self_attn, self.self_attn.d
        residual = x if residual is None else residual
        w = self.decode_weights
        qkv, o, gate_up, down = w.weights
        out = self.native.decode_layer(
            x, residual, self.input_layernorm.weight, self.post_attention_layernorm.weight, d.rms_eps, qkv,
            attn.qkv_bias, o, gate_up, down, *rope, kv_pool.k_buffer[attn.layer_id], kv_pool.v_buffer[attn.layer_id],
            meta.out_cache_loc, meta.req_to_token, meta.req_pool_indices, meta.seq_lens, d.num_heads,
            d.num_kv_heads, meta.sm_scale, residual is x, *w.scales, w.tiled)
        return out, residual


class CausalLM(nn.Module):
    def __init__(self, hf_config, arch: ArchSpec, max_positions: int):
        super().__init__()
        self.dims = d = Dims.from_hf(hf_config)
        self.embed_tokens = _param(d.vocab_size, d.hidden)
        self.layers = nn.ModuleList(self._make_layer(hf_config, arch, i) for i in range(d.num_layers))
        self.norm = arch.norm(d.hidden, d.rms_eps)
        self.lm_head = None if d.tie_embeddings else _param(d.vocab_size, d.hidden)
        self.rotary = self._make_rotary(hf_config, max_positions)
        # Gemma-2 style tanh(logits / c) * c on the logits (None: raw logits).
        self.logit_softcap: float | None = getattr(hf_config, "final_logit_softcapping", None)
        self.tp = None  # parallel.TPContext when tensor-parallel: vocab-parallel embedding and LM head
        # How weight_layout.py stores the LM head for matmuls (None: as loaded), and the column layout's
        # column-major copy for single-row logits.
        self.linear = F.linear  # see Attention.linear
        # The embedding lookup for this form of embed_tokens (gguf_model.py gives a GGUF's blocks their own).
        self.embedding = F.embedding
        self.lm_head_matmul: torch.Tensor | None = None
        self.lm_head_single_row: torch.Tensor | None = None
        # Compiled CPU ops: every layer of a one-token decode step and the final norm as one call
        # (cpu_ops.decode_stack, set by the model runner once the KV pool exists); None: layer by layer.
        # It holds that pool's K/V buffers, so it serves only forwards over that pool.
        self.decode_stack = None
        self.decode_stack_pool = None
        # Compiled CPU ops: the LM head of a one-row step that wants only the argmax (cpu_ops.ArgmaxHead);
        # None: every logit is computed.
        self.lm_head_argmax = None
        # ... and of a step of several such rows (cpu_ops.ArgmaxRows); None: every logit is computed.
        self.lm_head_argmax_rows = None
        self.last_hidden: torch.Tensor | None = None  # forward(keep_hidden=True)'s final hidden states

    # ---- what a variant (gemma.py) replaces -------------------------------------------------------
    def _make_layer(self, hf_config, arch: ArchSpec, layer_id: int) -> nn.Module:
        return DecoderLayer(self.dims, arch, layer_id)

    def _make_rotary(self, hf_config, max_positions: int) -> nn.Module:
        return RotaryEmbedding(hf_config, self.dims.rotary_dim, max_positions)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """What every layer's forward gets as `rope`, looked up once per forward."""
        return self.rotary.lookup(positions, dtype)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return self.embedding(input_ids, self.embed_tokens)
        return self.tp.embed(input_ids, self.embed_tokens)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend,
                kv_pool: KVPoolLike, meta: AttentionMetadata, logits_indices: torch.Tensor,
                argmax_only: bool = False, keep_hidden: bool = False) -> torch.Tensor:
        """input_ids/positions [T] -> logits [N, V] (fp32) for the N token positions in logits_indices.
        argmax_only: the caller reads only each row's argmax (first maximum); logits that cannot be it may
        then be -inf (ArgmaxHead), while the argmax's own value and every tie with it stay exact.
        keep_hidden: also keep those positions' final hidden states (after the final norm, [N, hidden]) in
        self.last_hidden (embeddings: the pooled vector of a request is its last token's)."""
        x = self._embed(input_ids)
        rope = self._rope(positions, x.dtype)
        if (self.decode_stack is not None and kv_pool is self.decode_stack_pool and meta.is_decode
                and x.shape[0] == 1 and logits_indices.numel() == 1):
            h = self.decode_stack.forward(x, *rope, meta.out_cache_loc, meta.req_to_token, meta.req_pool_indices,
                                          meta.seq_lens, meta.sm_scale)
            self.last_hidden = h if keep_hidden else None
            return self._logits(h, argmax_only)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, backend, kv_pool, meta)
        if residual is not None and self.norm.native is not None:
            # The compiled add + norm over every row, then the selection (a row's norm does not depend on
            # the other rows): one op instead of an add, a select and a norm.
            h = self.norm.forward_residual(x, residual)[0].index_select(0, logits_indices)
        else:
            h = x if residual is None else x + residual
            h = self.norm(h.index_select(0, logits_indices))
        self.last_hidden = h if keep_hidden else None
        return self._logits(h, argmax_only)

    def _logits(self, h: torch.Tensor, argmax_only: bool = False) -> torch.Tensor:
        """h [N, hidden] (after the final norm) -> logits [N, V] (fp32)."""
        if self.logit_softcap is not None:
            argmax_only = False  # the capped logits can tie where the raw ones did not: compute them all
        if argmax_only and h.shape[0] == 1 and self.lm_head_argmax is not None:
            return self.lm_head_argmax(h)
        if argmax_only and h.shape[0] > 1 and self.lm_head_argmax_rows is not None:
            return self.lm_head_argmax_rows(h)
        head = self.lm_head_matmul
        if h.shape[0] == 1 and self.lm_head_single_row is not None:
            head = self.lm_head_single_row
        elif head is None:
            head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = self.linear(h, head)
        if self.logit_softcap is not None:  # in the model dtype, before the fp32 cast, as transformers does
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits.float() if self.tp is None else self.tp.gather_logits(logits)

    # ---- weights ----------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take HF-named tensors one at a time, each copied into its parameter as it comes: q/k/v and
        gate/up into their rows of the fused parameters (Phi-3's checkpoints hold them fused already:
        qkv_proj, gate_up_proj in the same order), so no tensor is kept past its own copy."""
        loaded: set[str] = set()
        fused_parts: dict[str, int] = {}
        params = {n for n, _ in self.named_parameters()}
        unknown = []
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name:
                continue
            target = self._direct_target(name, params)
            slot = None if target is not None else self._fused_slot(name, params)
            if target is not None:
                _copy(self.get_parameter(target), tensor, name)
                loaded.add(target)
            elif slot is not None:
                rows, target, count = slot
                _copy(rows, tensor, name)
                fused_parts[target] = fused_parts.get(target, 0) + 1
                if fused_parts[target] == count:
                    loaded.add(target)
            else:
                unknown.append(name)
        if unknown:
            raise ValueError(f"unexpected weights in checkpoint: {unknown[:5]}")
        if self.lm_head is not None and "lm_head" not in loaded and "embed_tokens" in loaded:
            self.lm_head.data.copy_(self.embed_tokens.data)  # checkpoint ties without saying so
            loaded.add("lm_head")
        missing = {n for n, _ in self.named_parameters()} - loaded
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:5]}")

    @staticmethod
    def _direct_target(name: str, params: set[str]) -> str | None:
        """The parameter an HF tensor loads into as is: a renamed projection, or a parameter of the same
        name (the norms); None for the parts of a fused parameter."""
        if name in ("embed_tokens.weight", "lm_head.weight"):
            return name.removesuffix(".weight")
        renames = {"self_attn.o_proj.weight": "self_attn.o_weight", "mlp.down_proj.weight": "down_weight",
                   "self_attn.qkv_proj.weight": "self_attn.qkv_weight", "mlp.gate_up_proj.weight": "gate_up_weight"}
        prefix, _, rest = name.partition(".")
        if prefix == "layers":
            idx, _, sub = rest.partition(".")
            if sub in renames:
                return f"layers.{idx}.{renames[sub]}"
        return name if name in params else None

    def _fused_slot(self, name: str, params: set[str]) -> tuple[torch.Tensor, str, int] | None:
        """For a part of a fused parameter (q/k/v, gate/up): its rows of that parameter, the parameter's
        name and how many parts it has; None for any other name."""
        prefix, _, rest = name.partition(".")
        idx, _, sub = rest.partition(".")
        group = next(((t, parts) for t, parts in _FUSED_GROUPS.items() if sub in parts), None)
        if prefix != "layers" or group is None or f"layers.{idx}.{group[0]}" not in params:
            return None
        target, parts = group
        layer = self.layers[int(idx)]
        sizes = _part_rows(layer, target)
        start = sum(sizes[: parts.index(sub)])
        rows = layer.get_parameter(target).data[start:start + sizes[parts.index(sub)]]
        return rows, f"layers.{idx}.{target}", len(parts)


# Fused parameter -> the HF tensors stacked into it, in row order.
_FUSED_GROUPS = {"self_attn.qkv_weight": [f"self_attn.{p}_proj.weight" for p in "qkv"],
                 "self_attn.qkv_bias": [f"self_attn.{p}_proj.bias" for p in "qkv"],
                 "gate_up_weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"]}


def _part_rows(layer: nn.Module, target: str) -> list[int]:
    if target == "gate_up_weight":
        return [layer.intermediate, layer.intermediate]
    attn = layer.self_attn
    return [attn.q_size, attn.kv_size, attn.kv_size]


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(f"weight {name}: shape {tuple(tensor.shape)} does not match {tuple(param.shape)}")
    param.data.copy_(tensor)
