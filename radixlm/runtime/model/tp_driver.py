"""Rank 0's side of tensor parallelism: start the worker ranks, load this rank's shard, drive the steps.

Runs in the scheduler process (inside ModelRunner, only when tp_size > 1). The scheduler is unchanged:
before each forward, ModelRunner hands the step to `send_step`, which broadcasts it to the workers, then
runs its own shard; the logits come back whole on rank 0 through the LM head's gather.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.forward import ForwardBatch
from radixlm.runtime.model import dist_init
from radixlm.runtime.model.llama import CausalLM, Dims
from radixlm.runtime.model.parallel import TPContext, check_divisible, plan_shard, shard_model
from radixlm.runtime.model.tp_worker import broadcast_int, send_shutdown, send_step

logger = logging.getLogger(__name__)


def load_sharded_model(model_dir: str | Path, hf_config, context_len: int, rank: int, tp_size: int,
                       device: torch.device, dtype: torch.dtype, comm_device: torch.device
                       ) -> tuple[CausalLM, TPContext]:
    """Load the full checkpoint on the host, keep this rank's shard, move it to the device.

    The full fp32 weights live in host memory only while loading (each rank reads the whole checkpoint;
    a loader that reads only the shard's slices is not written yet). Device memory holds just the shard.
    """
    from radixlm.runtime.model.loader import iter_weights
    from radixlm.runtime.model.registry import build_model

    with torch.device("cpu"):
        model = build_model(hf_config, context_len)
    model.load_weights(iter_weights(str(model_dir), torch.float32))
    tp = TPContext(plan_shard(model.dims, tp_size, rank), model.dims.vocab_size, comm_device)
    shard_model(model, tp)
    model.to(device)
    for p in model.parameters():  # rotary cos/sin buffers stay fp32, as in ModelRunner
        p.data = p.data.to(dtype)
    return model, tp


class TPDriver:
    """Owns the worker processes and the process group of one tensor-parallel model (rank 0)."""

    def __init__(self, mc: ModelConfig, model_dir: str | Path, hf_config, context_len: int,
                 device: torch.device, dtype: torch.dtype):
        check_divisible(Dims.from_hf(hf_config), mc.tp_size)  # refuse before spawning anything
        dist_init.check_not_initialized()
        self.layout = dist_init.tp_layout(mc)
        if self.layout.node_rank != 0:
            raise ValueError(f"node_rank={mc.node_rank}: only node 0 runs the scheduler; start the other "
                             "nodes' ranks with radixlm.runtime.model.tp_worker.launch_node")
        if device.type == "cpu":
            torch.set_num_threads(dist_init.tp_num_threads(mc, self.layout))
        self.comm_device = device if device.type == "cuda" else torch.device("cpu")
        worker_config = dataclasses.replace(mc, model_path=str(model_dir))
        self.workers: list[subprocess.Popen] = dist_init.spawn_workers(
            worker_config, self.layout, self.layout.node_ranks()[1:])
        self._closed = False
        try:
            dist_init.init_rank0(self.layout, device, self.workers)
            self.model, self.tp = load_sharded_model(model_dir, hf_config, context_len, 0, mc.tp_size,
                                                     device, dtype, self.comm_device)
        except BaseException:
            self._abandon()
            raise

    def start(self, capacity: Callable[[], int]) -> int:
        """Size the KV pool on rank 0 and tell the workers (every rank's pool has the same slots).

        If sizing fails (e.g. max_total_tokens < 1) the workers, still waiting for the size, are killed."""
        try:
            max_total_tokens = capacity()
        except BaseException:
            self._abandon()
            raise
        broadcast_int(max_total_tokens, self.comm_device)
        return max_total_tokens

    def send_step(self, batch: ForwardBatch, logits_indices: torch.Tensor) -> None:
        send_step(batch, logits_indices, self.comm_device)

    def close(self, timeout_s: float = 30.0) -> None:
        """Send the shutdown header, reap the local workers, leave the process group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            send_shutdown(self.comm_device)
        except Exception:  # a worker already died: its peers see the closed connection
            logger.exception("tp shutdown broadcast failed")
        for proc in self.workers:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _abandon(self) -> None:
        self._closed = True
        for proc in self.workers:
            proc.kill()
            proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()
