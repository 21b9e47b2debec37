"""Run the HTTP process: wait for the children's ready handshake, serve with uvicorn, and watch health.

Runs in the HTTP process (called by runtime/launch.py inside asyncio.run). The watch task turns a dead
child or a silent scheduler (no heartbeat for watchdog_timeout) into an unhealthy server that fails
in-flight requests and exits with code 1 (with --dp-size N, any one of the N schedulers dead or silent
is fatal: no rank is taken out while the others serve); SIGTERM/SIGINT start a drain (new requests get
503, in-flight ones finish, then exit 0; a second signal or the drain timeout aborts what is left).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sys
import time
from dataclasses import asdict
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import uvicorn

from radixlm.runtime.config import EngineConfig, ServerConfig
from radixlm.runtime.generate_input import InputLimits
from radixlm.runtime.heap import freeze_heap
from radixlm.runtime.proc import IpcAddrs
from radixlm.runtime.server.context import AppContext
from radixlm.runtime.server.http_server import create_app
from radixlm.runtime.server.metrics import ServerMetrics
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger("radixlm.server")

_WATCH_INTERVAL_S = 0.1


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose exit signals request a drain instead of closing the listener at once (and
    are not re-raised after shutdown, so a drained server exits 0)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.drain_requested = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain_requested:
            self.should_exit = True  # a second signal: stop now
        self.drain_requested = True


def _announce(message: str) -> None:
    print(f"radixlm: {message}", flush=True)


async def _wait_children_ready(tm: TokenizerManager, procs: dict[str, BaseProcess],
                               timeout: float) -> str | None:
    """None when every child is ready, else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [name for name, p in procs.items() if not p.is_alive()]
        if dead:
            return f"the {dead[0]} process exited during start-up (exit code {procs[dead[0]].exitcode})"
        try:
            await tm.wait_ready(_WATCH_INTERVAL_S)
            return None
        except asyncio.TimeoutError:
            continue
    return f"start-up did not finish within {timeout:.0f}s"


async def serve(engine_config: EngineConfig, server_config: ServerConfig, addrs: IpcAddrs,
                procs: dict[str, BaseProcess], tokenizer_path: str, listener: socket.socket) -> int:
    from radixlm.runtime.model.loader import load_tokenizer

    # The port actually bound (port 0 asks the OS for a free one).
    server_config = dataclasses.replace(server_config, port=listener.getsockname()[1])
    tokenizer = load_tokenizer(tokenizer_path)
    sc = engine_config.scheduler
    dp = server_config.dp_size
    tm = TokenizerManager(addrs, tokenizer, None, dp * (sc.max_running_requests + sc.max_queued_requests),
                          ServerMetrics(), dp, server_config.dp_load_balance)
    await tm.start()
    try:
        failure = await _wait_children_ready(tm, procs, server_config.startup_timeout)
        if failure:
            logger.error("start-up failed: %s", failure)
            return 1
        info = tm.scheduler_info()
        tm.limits = InputLimits(info["vocab_size"], info["context_length"], info["max_total_num_tokens"],
                                server_config.max_prompt_chars)
        ctx = AppContext(tm, server_config, info, tokenizer_path,
                         server_config.served_model_name or Path(info["model_path"]).name,
                         _server_args(engine_config, server_config), engine_config.grammar)
        app = create_app(ctx)
        freeze_heap("tokenizer manager")
        server = DrainingServer(uvicorn.Config(app, host=server_config.host, port=server_config.port,
                                               log_level=server_config.log_level.lower(), access_log=False,
                                               lifespan="off", timeout_graceful_shutdown=5))
        _announce(f"model {ctx.served_model_name} loaded; listening on "
                  f"http://{server_config.host}:{server_config.port}")
        watcher = asyncio.ensure_future(_watch(tm, server, procs, server_config))
        await server.serve(sockets=[listener])
        watcher.cancel()
        return 1 if tm.state == "unhealthy" else 0
    finally:
        logger.info("closing the tokenizer manager")
        await tm.close()


async def _watch(tm: TokenizerManager, server: DrainingServer, procs: dict[str, BaseProcess],
                 cfg: ServerConfig) -> None:
    announced, drain_deadline = False, None
    while True:
        await asyncio.sleep(_WATCH_INTERVAL_S)
        if server.started and not announced:
            announced = True
            _announce(f"ready on http://{cfg.host}:{cfg.port}")
        problem = _health_problem(tm, procs, cfg.watchdog_timeout)
        if problem and tm.state != "unhealthy":
            logger.error("server unhealthy: %s; shutting down", problem)
            print(f"radixlm: unhealthy ({problem}); exiting", file=sys.stderr, flush=True)
            tm.state = "unhealthy"
            tm.fail_all(problem)
            server.should_exit = True
        if server.drain_requested and tm.state == "ok":
            logger.info("draining: %d requests in flight", len(tm.handles))
            tm.state, drain_deadline = "draining", time.monotonic() + cfg.drain_timeout
        if tm.state == "draining":
            if not tm.handles:
                server.should_exit = True
            elif drain_deadline is not None and time.monotonic() > drain_deadline:
                tm.abort_all()
                drain_deadline = None


def _health_problem(tm: TokenizerManager, procs: dict[str, BaseProcess], watchdog_timeout: float) -> str | None:
    for name, proc in procs.items():
        if not proc.is_alive():
            return f"the {name} process died (exit code {proc.exitcode})"
    if not tm.receiving:
        return "the tokenizer manager stopped receiving"
    if time.monotonic() - tm.last_heartbeat > watchdog_timeout:
        return f"the {tm.silent_scheduler()} sent no heartbeat for {watchdog_timeout:.0f}s (hung)"
    return None


def _server_args(engine_config: EngineConfig, server_config: ServerConfig) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for part in (engine_config.model, engine_config.cache, engine_config.scheduler, engine_config.grammar,
                 engine_config.speculative):
        args.update(asdict(part))
    public = asdict(server_config)
    public["api_keys"] = len(server_config.api_keys)  # never echo secrets
    public["admin_api_key"] = server_config.admin_api_key is not None
    return {**args, **public}
