"""Tensor-parallel worker ranks 1..N-1, and the step protocol rank 0 uses to drive them.

`python -m radixlm.runtime.model.tp_worker --rank R --config JSON` runs in its own process (spawned by
rank 0 for its node, or by `launch_node` on the other nodes). It loads the checkpoint, keeps its shard,
builds a KV pool holding only its heads, then loops in lock step with rank 0: receive a step over
torch.distributed broadcast (a fixed int64 header with the sizes, then one packed int64 tensor), run the
same forward (joining every all-reduce and the logits gather), until a shutdown header arrives.

The workers have no request table: rank 0 sends the slot rows of the step's requests ([B, max_seq_len]),
so every rank reads and writes the same slot indices of its own pool.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.forward import AttentionMetadata, ForwardBatch
from radixlm.runtime.proc import setup_logging, watch_parent

logger = logging.getLogger(__name__)

CMD_STEP, CMD_SHUTDOWN = 1, 2
HEADER_LEN = 8  # cmd, T, B, max_seq_len, N (logits rows), is_decode, unused, unused


# ---- rank 0 side ----------------------------------------------------------------------------------
def send_step(batch: ForwardBatch, logits_indices: torch.Tensor, comm_device: torch.device) -> None:
    meta = batch.meta
    num_rows, max_len = len(meta.seq_lens_list), max(meta.seq_lens_list)
    slots = meta.req_to_token.index_select(0, meta.req_pool_indices)[:, :max_len]
    header = [CMD_STEP, batch.num_tokens, num_rows, max_len, logits_indices.numel(), int(meta.is_decode), 0, 0]
    dist.broadcast(torch.tensor(header, dtype=torch.int64, device=comm_device), src=0)
    parts = [batch.input_ids, batch.positions, meta.out_cache_loc, meta.seq_lens, meta.prefix_lens,
             meta.extend_lens, meta.extend_start_loc, logits_indices, slots.reshape(-1)]
    payload = torch.cat([t.to(comm_device, torch.int64) for t in parts])
    dist.broadcast(payload, src=0)


def send_shutdown(comm_device: torch.device) -> None:
    header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=comm_device)
    header[0] = CMD_SHUTDOWN
    dist.broadcast(header, src=0)


def broadcast_int(value: int, comm_device: torch.device) -> int:
    """Rank 0's value on every rank (used once: the KV pool capacity)."""
    t = torch.tensor([value], dtype=torch.int64, device=comm_device)
    dist.broadcast(t, src=0)
    return int(t.item())


# ---- worker side ----------------------------------------------------------------------------------
def recv_step(comm_device: torch.device, device: torch.device, sm_scale: float
              ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor] | None:
    """The next step's (input_ids, positions, meta, logits_indices), or None on shutdown."""
    header = torch.empty(HEADER_LEN, dtype=torch.int64, device=comm_device)
    dist.broadcast(header, src=0)
    cmd, t, b, max_len, n, is_decode = header[:6].tolist()
    if cmd == CMD_SHUTDOWN:
        return None
    payload = torch.empty(3 * t + 4 * b + n + b * max_len, dtype=torch.int64, device=comm_device)
    dist.broadcast(payload, src=0)
    ids, pos, out_loc, seq, prefix, ext, ext_start, logits_idx, slots = payload.to(device).split(
        [t, t, t, b, b, b, b, n, b * max_len])
    meta = AttentionMetadata(
        req_to_token=slots.view(b, max_len), req_pool_indices=torch.arange(b, device=device),
        seq_lens=seq, prefix_lens=prefix, extend_lens=ext, extend_start_loc=ext_start, out_cache_loc=out_loc,
        is_decode=bool(is_decode), sm_scale=sm_scale, seq_lens_list=seq.tolist(),
        prefix_lens_list=prefix.tolist(), extend_lens_list=ext.tolist(), extend_start_loc_list=ext_start.tolist())
    return ids, pos, meta, logits_idx


def run_worker(mc: ModelConfig, rank: int) -> None:
    from transformers import AutoConfig

    from radixlm.runtime.heap import freeze_heap
    from radixlm.runtime.model import dist_init
    from radixlm.runtime.model.model_runner import ModelRunner, _context_len, resolve_device, resolve_dtype
    from radixlm.runtime.model.kv_pool import KVPool
    from radixlm.runtime.model.tp_driver import load_sharded_model

    layout = dist_init.tp_layout(mc)
    device = dist_init.rank_device(resolve_device(mc.device), layout, rank)
    dtype = resolve_dtype(mc.dtype, device)
    if device.type == "cpu":
        torch.set_num_threads(dist_init.tp_num_threads(mc, layout))
    else:
        torch.cuda.set_device(device)
    hf_config = AutoConfig.from_pretrained(mc.model_path)
    dist_init.init_worker(layout, device, rank)
    comm = device if device.type == "cuda" else torch.device("cpu")
    model, _ = load_sharded_model(mc.model_path, hf_config, _context_len(hf_config, mc.context_length),
                                  rank, mc.tp_size, device, dtype, comm)
    d = model.dims
    kv_pool = KVPool(broadcast_int(0, comm), d.num_layers, d.num_kv_heads, d.head_dim, dtype, device)
    # The backend choice reads only the runner's device and compiled ops (none under TP: cpu_ops.py).
    backend = ModelRunner._attention_backend(SimpleNamespace(device=device, cpu_ops=None), mc.attention_backend)
    freeze_heap(f"tp rank {rank}")
    num_steps = 0
    while (step := recv_step(comm, device, d.sm_scale)) is not None:
        ids, pos, meta, logits_idx = step
        model(ids, pos, backend, kv_pool, meta, logits_idx)
        num_steps += 1
    logger.info("tp rank %d: shutdown after %d steps", rank, num_steps)
    dist.destroy_process_group()


def launch_node(mc: ModelConfig) -> int:
    """On a node other than 0 (multi-node): start this node's ranks and wait for them; returns an exit code."""
    from radixlm.runtime.model import dist_init
    from radixlm.runtime.model.loader import resolve_model_path

    layout = dist_init.tp_layout(mc)
    if layout.node_rank == 0:
        raise ValueError("node 0 hosts rank 0 (the scheduler): start the server there, not launch_node")
    mc = dataclasses.replace(mc, model_path=str(resolve_model_path(mc.model_path)))  # this node's copy
    procs = dist_init.spawn_workers(mc, layout, layout.node_ranks())
    return max(p.wait() for p in procs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="radixlm tensor-parallel worker rank (started by rank 0)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--config", required=True, help="ModelConfig as JSON")
    args = p.parse_args(argv)
    setup_logging("info", f"[tp{args.rank}] %(levelname)s %(message)s")
    parent = os.environ.get("RADIXLM_TP_PARENT_PID")
    if parent:  # a worker must not outlive the process that spawned it (it would block in a broadcast forever)
        watch_parent(int(parent), poll_s=1.0)
    run_worker(ModelConfig(**json.loads(args.config)), args.rank)


if __name__ == "__main__":
    main()
