"""torch.distributed start-up for tensor parallelism: rank layout, rendezvous, spawning local worker ranks.

Runs in the scheduler process (rank 0) and in every tp_worker process. The rendezvous is a
torch.distributed TCPStore on rank 0's node at `dist_init_addr` (host:port); each worker writes a ready
key after connecting, so rank 0 can notice a worker that died on start-up instead of blocking in
init_process_group. Backend: NCCL on CUDA, gloo on CPU. Nothing is pickled: workers get their ModelConfig
as JSON on the command line, and steps travel as tensors over torch.distributed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from radixlm.runtime.config import ModelConfig

# A worker waits in a broadcast for as long as the server is idle, so collectives must not time out
# (a dead peer still fails fast: its closed connection raises in every other rank).
COLLECTIVE_TIMEOUT = timedelta(days=365)
STARTUP_TIMEOUT_S = 600.0
_READY_KEY = "radixlm/tp_ready/{}"


@dataclass(frozen=True)
class TPLayout:
    tp_size: int
    nnodes: int
    node_rank: int
    host: str
    port: int

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    def node_ranks(self) -> list[int]:
        """Global ranks hosted on this node (rank 0 is the scheduler, on node 0)."""
        first = self.node_rank * self.ranks_per_node
        return list(range(first, first + self.ranks_per_node))

    def local_index(self, rank: int) -> int:
        """Index of `rank` among its node's ranks: its CUDA device ordinal."""
        return rank % self.ranks_per_node


def tp_layout(mc: ModelConfig) -> TPLayout:
    """Validate the tp/multi-node options; pick a free loopback port when single-node without an address."""
    if mc.tp_size < 1 or mc.nnodes < 1:
        raise ValueError(f"tp_size and nnodes must be >= 1; got tp_size={mc.tp_size}, nnodes={mc.nnodes}")
    if mc.tp_size % mc.nnodes:
        raise ValueError(f"tp_size={mc.tp_size} must be a multiple of nnodes={mc.nnodes}")
    if not 0 <= mc.node_rank < mc.nnodes:
        raise ValueError(f"node_rank={mc.node_rank} must be in [0, nnodes={mc.nnodes})")
    if mc.dist_init_addr is None:
        if mc.nnodes > 1:
            raise ValueError("dist_init_addr (host:port of node 0) is required when nnodes > 1")
        return TPLayout(mc.tp_size, 1, 0, "127.0.0.1", free_port())
    host, sep, port = mc.dist_init_addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"dist_init_addr must be host:port; got {mc.dist_init_addr!r}")
    return TPLayout(mc.tp_size, mc.nnodes, mc.node_rank, host.strip("[]"), int(port))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def comm_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, layout: TPLayout, rank: int) -> torch.device:
    return torch.device("cuda", layout.local_index(rank)) if device.type == "cuda" else device


def tp_num_threads(mc: ModelConfig, layout: TPLayout) -> int:
    """CPU threads per rank: the node's cores shared by its ranks (oversubscription is what hurts)."""
    if mc.num_threads:
        return mc.num_threads
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // layout.ranks_per_node)


def spawn_workers(mc: ModelConfig, layout: TPLayout, ranks: list[int]) -> list[subprocess.Popen]:
    """Start `python -m radixlm.runtime.model.tp_worker` for each rank; the config travels as JSON."""
    config = dataclasses.replace(mc, dist_init_addr=f"{layout.host}:{layout.port}")
    blob = json.dumps(dataclasses.asdict(config))
    env = dict(os.environ, RADIXLM_TP_PARENT_PID=str(os.getpid()))
    return [subprocess.Popen([sys.executable, "-m", "radixlm.runtime.model.tp_worker", "--rank", str(r),
                              "--config", blob], env=env) for r in ranks]


def init_rank0(layout: TPLayout, device: torch.device, local_workers: list[subprocess.Popen]) -> None:
    """Host the rendezvous, wait for every worker (failing fast if a local one dies), join the group."""
    store = dist.TCPStore(layout.host, layout.port, layout.tp_size, is_master=True,
                          timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    waiting = set(range(1, layout.tp_size))
    while waiting:
        waiting = {r for r in waiting if not store.check([_READY_KEY.format(r)])}
        for proc in local_workers:
            if proc.poll() is not None:
                raise RuntimeError(f"tensor-parallel worker (pid {proc.pid}) exited with code {proc.returncode} "
                                   "during start-up; its error is in the log above")
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"tensor-parallel ranks {sorted(waiting)} did not connect to "
                               f"{layout.host}:{layout.port} within {STARTUP_TIMEOUT_S:.0f}s")
        if waiting:
            time.sleep(0.05)
    dist.init_process_group(comm_backend(device), store=store, rank=0, world_size=layout.tp_size,
                            timeout=COLLECTIVE_TIMEOUT)


def init_worker(layout: TPLayout, device: torch.device, rank: int) -> None:
    """Connect to rank 0's rendezvous, announce readiness, join the group."""
    store = dist.TCPStore(layout.host, layout.port, layout.tp_size, is_master=False,
                          timeout=timedelta(seconds=STARTUP_TIMEOUT_S))
    store.set(_READY_KEY.format(rank), "1")
    dist.init_process_group(comm_backend(device), store=store, rank=rank, world_size=layout.tp_size,
                            timeout=COLLECTIVE_TIMEOUT)


def check_not_initialized() -> None:
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process: only one "
                           "tensor-parallel engine per process (shut the other one down first)")
