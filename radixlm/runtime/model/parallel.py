"""Tensor-parallel layers: how one rank's shard of the decoder is cut, and the collectives that join them.

Runs in every tensor-parallel rank: rank 0 inside the scheduler process, ranks 1..N-1 in tp_worker
processes. The layout is Megatron's: attention heads and the MLP's intermediate dim are split across
ranks (q/k/v and gate/up column-parallel, o_proj and down_proj row-parallel followed by an all-reduce),
the embedding and the LM head are split along the vocabulary (masked lookup + all-reduce; per-rank logits
gathered on rank 0, the only rank that samples). With tp_size == 1 none of this is used: llama.py's `tp`
attributes stay None and the model runs exactly as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.model.llama import CausalLM, Dims


@dataclass(frozen=True)
class ShardPlan:
    """The slice of the model one rank holds (head and row indices are into the full model)."""

    rank: int
    tp_size: int
    num_heads: int  # q heads on this rank
    num_kv_heads: int  # kv heads on this rank (1 when replicated)
    q_head_start: int
    kv_head_start: int
    intermediate: int
    intermediate_start: int
    vocab_per_rank: int  # ceil(V / tp_size); the last rank's slice is zero-padded
    vocab_start: int


def plan_shard(d: Dims, tp_size: int, rank: int) -> ShardPlan:
    """Split heads, MLP and vocabulary across tp_size ranks; ValueError when they do not divide."""
    check_divisible(d, tp_size)
    nq = d.num_heads // tp_size
    if d.num_kv_heads >= tp_size:
        nkv, kv_start = d.num_kv_heads // tp_size, rank * (d.num_kv_heads // tp_size)
    else:
        # Fewer kv heads than ranks: each rank keeps (a replica of) the one kv head its q heads read.
        nkv, kv_start = 1, rank * d.num_kv_heads // tp_size
    inter = d.intermediate // tp_size
    vocab = -(-d.vocab_size // tp_size)
    return ShardPlan(rank, tp_size, nq, nkv, rank * nq, kv_start, inter, rank * inter, vocab, rank * vocab)


def check_divisible(d: Dims, tp_size: int) -> None:
    """Start-up check (before any process is spawned) that the model can be split tp_size ways."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1; got {tp_size}")
    problems = []
    if d.num_heads % tp_size:
        problems.append(f"num_attention_heads={d.num_heads} is not divisible by tp_size={tp_size}")
    if d.num_kv_heads >= tp_size and d.num_kv_heads % tp_size:
        problems.append(f"num_key_value_heads={d.num_kv_heads} is not divisible by tp_size={tp_size}")
    if d.num_kv_heads < tp_size and tp_size % d.num_kv_heads:
        problems.append(f"tp_size={tp_size} is not a multiple of num_key_value_heads={d.num_kv_heads} "
                        "(needed to replicate kv heads)")
    if d.intermediate % tp_size:
        problems.append(f"intermediate_size={d.intermediate} is not divisible by tp_size={tp_size}")
    if problems:
        raise ValueError("cannot split the model for tensor parallelism: " + "; ".join(problems)
                         + f". Choose a tp_size that divides the head counts (heads {d.num_heads}, "
                         f"kv heads {d.num_kv_heads}).")


class TPContext:
    """This rank's collectives; llama.py calls these only when its `tp` attribute is set."""

    def __init__(self, plan: ShardPlan, vocab_size: int, comm_device: torch.device):
        self.plan, self.rank, self.size = plan, plan.rank, plan.tp_size
        self.vocab_size = vocab_size
        self.comm_device = comm_device  # gloo moves CPU tensors, NCCL CUDA tensors

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of the row-parallel partial outputs, in place."""
        dist.all_reduce(x)
        return x

    def embed(self, input_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup: ids outside this rank's slice contribute zeros, the all-reduce fills them."""
        local = input_ids - self.plan.vocab_start
        inside = (local >= 0) & (local < self.plan.vocab_per_rank)
        x = F.embedding(local.clamp(0, self.plan.vocab_per_rank - 1), weight)
        x = x * inside.unsqueeze(-1).to(x.dtype)
        return self.all_reduce(x)

    def gather_logits(self, local_logits: torch.Tensor) -> torch.Tensor:
        """[N, V/tp] per rank -> fp32 [N, V] on rank 0 (other ranks get their own slice back, unused)."""
        local = local_logits.float().contiguous()
        if self.rank != 0:
            dist.gather(local, None, dst=0)
            return local
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.gather(local, parts, dst=0)
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]


def shard_model(model: CausalLM, tp: TPContext) -> None:
    """Cut a fully loaded model down to this rank's shard, in place, and switch on the collectives."""
    p, d = tp.plan, model.dims
    for layer in model.layers:
        _shard_attention(layer.self_attn, d, p)
        inter = slice(p.intermediate_start, p.intermediate_start + p.intermediate)
        gate, up = layer.gate_up_weight.data.split(d.intermediate, dim=0)
        layer.gate_up_weight = _new_param(torch.cat([gate[inter], up[inter]]))
        layer.down_weight = _new_param(layer.down_weight.data[:, inter])
        layer.intermediate = p.intermediate
        layer.self_attn.tp = layer.tp = tp
    model.embed_tokens = _new_param(_vocab_slice(model.embed_tokens.data, p))
    if model.lm_head is not None:
        model.lm_head = _new_param(_vocab_slice(model.lm_head.data, p))
    model.dims = dataclasses.replace(d, num_heads=p.num_heads, num_kv_heads=p.num_kv_heads,
                                     intermediate=p.intermediate)  # vocab_size stays the full vocabulary
    model.tp = tp


def _shard_attention(attn: nn.Module, d: Dims, p: ShardPlan) -> None:
    hd = d.head_dim
    q_rows = slice(p.q_head_start * hd, (p.q_head_start + p.num_heads) * hd)
    kv_rows = slice(p.kv_head_start * hd, (p.kv_head_start + p.num_kv_heads) * hd)
    sizes = [d.num_heads * hd, d.num_kv_heads * hd, d.num_kv_heads * hd]

    def cut(t: torch.Tensor) -> torch.Tensor:
        q, k, v = t.split(sizes, dim=0)
        return torch.cat([q[q_rows], k[kv_rows], v[kv_rows]])

    attn.qkv_weight = _new_param(cut(attn.qkv_weight.data))
    if attn.qkv_bias is not None:
        attn.qkv_bias = _new_param(cut(attn.qkv_bias.data))
    attn.o_weight = _new_param(attn.o_weight.data[:, q_rows])
    attn.d = dataclasses.replace(d, num_heads=p.num_heads, num_kv_heads=p.num_kv_heads)
    attn.q_size, attn.kv_size = p.num_heads * hd, p.num_kv_heads * hd


def _vocab_slice(weight: torch.Tensor, p: ShardPlan) -> torch.Tensor:
    """Rows [vocab_start, vocab_start + vocab_per_rank) of a [V, H] weight, zero-padded past V."""
    out = weight.new_zeros(p.vocab_per_rank, weight.shape[1])
    rows = weight[p.vocab_start : p.vocab_start + p.vocab_per_rank]
    out[: rows.shape[0]] = rows
    return out


def _new_param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous().clone(), requires_grad=False)
