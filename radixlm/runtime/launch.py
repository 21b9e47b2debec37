"""Start the server: the scheduler and detokenizer processes, the ready handshake, then uvicorn.

Runs in the server's main process (which becomes the HTTP + tokenizer-manager process). Addresses,
logging, the children's parent-death watch and exit_now live in runtime/proc.py.

Process tree: main (uvicorn + TokenizerManager) -> scheduler (or --dp-size schedulers, one model copy
each), detokenizer; all started with the "spawn" context so they never inherit a forked torch or
event-loop state. They talk over ZMQ ipc:// sockets in a private 0700 temp directory that the main
process removes on exit; every message is a msgspec struct (runtime/messages.py).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.process import BaseProcess

from radixlm.runtime.config import EngineConfig, ServerConfig
from radixlm.runtime.proc import IpcAddrs, setup_logging

logger = logging.getLogger("radixlm.server")

def start_children(engine_config: EngineConfig, server_config: ServerConfig, addrs: IpcAddrs,
                   tokenizer_path: str) -> dict[str, BaseProcess]:
    import multiprocessing as mp

    from radixlm.runtime.detokenizer import run_detokenizer_process
    from radixlm.runtime.scheduler.loop import run_scheduler_process
    from radixlm.runtime.server.dp_dispatch import scheduler_name

    ctx = mp.get_context("spawn")
    parent = os.getpid()
    dp_size = server_config.dp_size
    procs: dict[str, BaseProcess] = {}
    # Not daemonic: the scheduler may start its own worker processes (grammar compilation).
    for rank in range(dp_size):
        name = scheduler_name(rank, dp_size)
        procs[name] = ctx.Process(target=run_scheduler_process, name=f"radixlm-{name}",
                                  args=(_rank_config(engine_config, rank, dp_size), addrs.for_rank(rank),
                                        parent, server_config.log_level, rank))
    procs["detokenizer"] = ctx.Process(target=run_detokenizer_process, name="radixlm-detokenizer",
                                       args=(tokenizer_path, addrs, parent, server_config.log_level,
                                             engine_config.grammar))
    for proc in procs.values():
        proc.start()
    return procs


def stop_children(procs: dict[str, BaseProcess], grace_s: float = 3.0) -> None:
    """The server has asked the children to exit; SIGKILL whatever has not within grace_s (they ignore
    SIGTERM, and a hung scheduler ignores messages too)."""
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs.values():
        if proc.is_alive():
            proc.kill()
            proc.join(10.0)


def _scheduler_threads(model_config, dp_size: int = 1) -> int:
    """Torch threads per scheduler process, split between dp ranks (at least one each). An explicit
    --num-threads is per scheduler.

    The HTTP and detokenizer processes work on every token too, so on 3-8 cores the schedulers leave them
    one. On 2 cores they do not: with one thread the scheduler loses the blocks weight layout
    (model/weight_layout.py), and SmolLM2 served with 2 threads measured 21.0 / 24.6 vs 19.0 / 21.5 output
    tok/s at concurrency 1 and 64.9 / 72.7 vs 53.1 / 48.4 at concurrency 8 (bench_serving.py, two rounds).
    (Before the blocks layout, 2 threads had measured 5x slower there: a second thread spinning at
    barriers took the core the IO processes needed, and gained nothing for single-row GEMVs.)"""
    from radixlm.runtime.model.model_runner import default_num_threads

    if model_config.num_threads is not None:
        return model_config.num_threads
    cores = default_num_threads()
    usable = cores - 1 if 3 <= cores <= 8 else cores
    return max(1, usable // dp_size)


def check_dp_options(engine_config: EngineConfig, server_config: ServerConfig) -> None:
    """--dp-size > 1 runs N independent single-rank schedulers. Refused with tensor parallelism: a tp
    rank picks its device and thread share from its tp rank alone, so two dp groups would land on the
    same devices and cores."""
    dp, model = server_config.dp_size, engine_config.model
    if dp > 1 and (model.tp_size > 1 or model.nnodes > 1):
        raise ValueError(f"--dp-size {dp} cannot be combined with --tp-size {model.tp_size} / --nnodes "
                         f"{model.nnodes}: data parallelism inside one server needs tp_size 1; run several "
                         "tensor-parallel servers behind `python -m radixlm.router` instead (docs/scaling.md)")


def _rank_config(engine_config: EngineConfig, rank: int, dp_size: int) -> EngineConfig:
    """On CUDA, data-parallel ranks take devices round-robin (they share a device when there are fewer
    devices than ranks; each then sizes its KV pool from the memory still free when it loads)."""
    device = engine_config.model.device
    if dp_size == 1 or device not in ("auto", "cuda"):
        return engine_config
    import torch

    if not torch.cuda.is_available():
        return engine_config
    device = f"cuda:{rank % torch.cuda.device_count()}"
    return dataclasses.replace(engine_config, model=dataclasses.replace(engine_config.model, device=device))


class PortInUseError(OSError):
    """The server's address cannot be listened on (taken, or not this machine's)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a taken port fails in a second, not after the
    load (uvicorn serves on this socket; it would otherwise bind only once everything is ready)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise PortInUseError(f"cannot listen on {host}:{port}: {exc}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a TIME_WAIT port is free
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise PortInUseError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(False)  # the children never hold the port
    return sock


def launch_server(engine_config: EngineConfig, server_config: ServerConfig) -> int:
    """Run the server until it is drained (exit code 0) or a child dies or hangs (exit code 1). A port
    that cannot be listened on raises PortInUseError before anything loads."""
    import asyncio

    from radixlm.runtime.model.loader import resolve_model_path
    from radixlm.runtime.server.runner import serve

    setup_logging(server_config.log_level)
    check_dp_options(engine_config, server_config)
    listener = bind_listener(server_config.host, server_config.port)
    # A SIGTERM while the model loads must still clean up children and sockets (finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Resolve once here (the default model may be downloaded and converted) so children get a plain dir.
    model_dir = str(resolve_model_path(engine_config.model.model_path))
    threads = _scheduler_threads(engine_config.model, server_config.dp_size)
    # The schedulers' thread count already accounts for the IO processes: small steps use all of it.
    small = engine_config.model.small_step_threads or threads
    engine_config = dataclasses.replace(engine_config, model=dataclasses.replace(
        engine_config.model, model_path=model_dir, num_threads=threads, small_step_threads=small))
    tokenizer_path = engine_config.model.tokenizer_path or model_dir
    ipc_dir = tempfile.mkdtemp(prefix="radixlm-ipc-")  # mode 0700: only this user can connect
    procs: dict[str, BaseProcess] = {}
    try:
        addrs = IpcAddrs.in_dir(ipc_dir, server_config.dp_size)
        procs = start_children(engine_config, server_config, addrs, tokenizer_path)
        return asyncio.run(serve(engine_config, server_config, addrs, procs, tokenizer_path, listener))
    finally:
        listener.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        logger.info("stopping child processes")
        stop_children(procs)
        logger.info("child processes stopped")
        shutil.rmtree(ipc_dir, ignore_errors=True)
