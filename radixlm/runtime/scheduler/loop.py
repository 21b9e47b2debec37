"""The scheduler process: ZMQ IO around the plain Scheduler class.

Runs in the scheduler process (started by runtime/launch.py). Receives GenerateReq / AbortReq /
ControlReq from the tokenizer manager without blocking while there is work, runs one scheduler step
at a time, and sends every step's TokenOuts to the detokenizer. Between steps it sends a Heartbeat to
the tokenizer manager, whose watchdog treats a silent scheduler as hung. With `--dp-size N` the server
runs N of these processes (dp_rank 0..N-1), each with its own model copy, input socket and cache; they
share the detokenizer and the tokenizer manager, and tag their ready and heartbeat messages with dp_rank.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Union

import msgspec
import zmq

from radixlm.errors import InvalidRequestError
from radixlm.runtime.builder import BuiltScheduler, build_scheduler, make_req
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.messages import (AbortReq, BatchTokenOut, ControlReq, ControlResp, GenerateReq, Heartbeat,
                                      ProcessReady, TokenOut, encode)
from radixlm.runtime.scheduler.status_log import StatusLog
from radixlm.sampling_params import SamplingParams

logger = logging.getLogger("radixlm.scheduler")

HEARTBEAT_INTERVAL_S = 0.5
_IDLE_POLL_MS = 100  # how long to block for a message when there is no work
_GRAMMAR_POLL_MS = 2  # only grammars compiling (in worker processes): check often, but do not spin

InboundMsg = Union[GenerateReq, AbortReq, ControlReq]


def run_scheduler_process(config: EngineConfig, addrs: Any, parent_pid: int, log_level: str,
                          dp_rank: int = 0) -> None:
    from radixlm.runtime.launch import die_with_parent, setup_logging

    die_with_parent(parent_pid)
    setup_logging(log_level)
    if config.model.device.startswith("cuda:"):  # a data-parallel rank's own device (launch._rank_config)
        import torch

        torch.cuda.set_device(config.model.device)  # kernels launch on the current device
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)  # never block exit on messages to a server that is already gone
    recv = ctx.socket(zmq.PULL)
    recv.bind(addrs.scheduler_in)
    to_detok = ctx.socket(zmq.PUSH)
    to_detok.connect(addrs.detokenizer_in)
    to_tm = ctx.socket(zmq.PUSH)
    to_tm.connect(addrs.tokenizer_in)
    built = build_scheduler(config)  # an exception here exits non-zero: the server reports it and exits
    to_tm.send(encode(ProcessReady("scheduler", os.getpid(), model_info(built, config), dp_rank=dp_rank)))
    try:
        SchedulerLoop(built, recv, to_detok, to_tm, dp_rank).run()
    finally:
        ctx.destroy(linger=0)


def model_info(built: BuiltScheduler, config: EngineConfig) -> dict[str, Any]:
    info = built.runner.info
    return {"model_path": str(built.model_dir), "device": info.device, "dtype": info.dtype,
            "num_threads": info.num_threads, "context_length": info.context_len,
            "vocab_size": info.vocab_size, "max_total_num_tokens": info.max_total_tokens,
            "architecture": info.architecture, "eos_token_ids": sorted(built.eos_token_ids),
            "max_running_requests": config.scheduler.max_running_requests,
            "max_queued_requests": config.scheduler.max_queued_requests,
            "chunked_prefill_size": config.scheduler.chunked_prefill_size,
            "schedule_policy": config.scheduler.schedule_policy,
            "disable_radix_cache": config.cache.disable_radix_cache}


def _rejection(msg: GenerateReq, rid: str, message: str, code: str, param: str | None = None) -> TokenOut:
    """The terminal output of a request the scheduler would not take (invariant 4: exactly one)."""
    return TokenOut(rid=rid, new_ids=[], prompt_tokens=len(msg.req.input_ids), completion_tokens=0,
                    cached_tokens=0, finish={"type": "abort", "message": message},
                    error={"message": message, "param": param, "code": code})


class SchedulerLoop:
    def __init__(self, built: BuiltScheduler, recv: zmq.Socket, to_detok: zmq.Socket, to_tm: zmq.Socket,
                 dp_rank: int = 0):
        self.built = built
        self.dp_rank = dp_rank
        self.scheduler = built.scheduler
        self.recv = recv
        self.to_detok = to_detok
        self.to_tm = to_tm
        self.decoder = msgspec.msgpack.Decoder(InboundMsg)
        self._last_heartbeat = 0.0
        self.status = StatusLog()

    def run(self) -> None:
        while True:
            timeout = 0 if self.scheduler.has_runnable() else (
                _GRAMMAR_POLL_MS if self.scheduler.has_work() else _IDLE_POLL_MS)
            if self.recv.poll(timeout):
                self._drain_inbox()
            if self.scheduler.has_work():
                self._step()
            self.status.maybe_log(self.scheduler)  # also when idle: work that starts later is measured anew
            self._maybe_heartbeat()

    def _drain_inbox(self) -> None:
        while True:
            try:
                raw = self.recv.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = self.decoder.decode(raw)
            except msgspec.DecodeError:
                logger.error("dropped an undecodable message")
                continue
            self._handle(msg)

    def _handle(self, msg: InboundMsg) -> None:
        if isinstance(msg, GenerateReq):
            self._add(msg)
        elif isinstance(msg, AbortReq):
            outs = self.scheduler.abort_all("aborted") if msg.abort_all else self.scheduler.abort(msg.rid)
            self._send_outputs(outs)
        elif msg.kind == "shutdown":  # the server is exiting and waits for us
            self.scheduler.grammar.close()  # stops the grammar compile workers
            self.built.runner.close()  # stops tensor-parallel worker ranks (no-op at tp_size 1)
            for sock in (self.recv, self.to_detok, self.to_tm):
                sock.close(linger=0)  # closed before exit: a ZMQ context's term() waits for its sockets
            raise SystemExit(0)
        else:
            self.to_tm.send(encode(self._control(msg)))

    def _add(self, msg: GenerateReq) -> None:
        # The detokenizer must know the request before its first output: same socket, sent first.
        self.to_detok.send(encode(msg))
        rejected = []
        for child, rid in enumerate(msg.child_rids):
            try:
                params = SamplingParams.from_dict(msg.req.sampling_params)
                self.scheduler.add_request(make_req(msg.req, params, rid, child, self.built.runner.device))
            except OverflowError:
                rejected.append(_rejection(msg, rid, "the waiting queue is full", "queue_full"))
            except InvalidRequestError as exc:  # e.g. a grammar that does not compile: the client's 400
                rejected.append(_rejection(msg, rid, str(exc), exc.code, exc.param))
            except Exception as exc:
                logger.exception("could not add request %s", rid)
                rejected.append(_rejection(msg, rid, f"internal error ({type(exc).__name__})", "internal_error"))
        self._send_outputs(rejected)

    def _step(self) -> None:
        try:
            outputs = self.scheduler.step()
        except Exception as exc:  # a bug in one step must not take the server down: fail what is in flight
            logger.exception("scheduler step failed")
            outputs = self.scheduler.abort_all(f"internal error ({type(exc).__name__})")
            for out in outputs:
                out.error = {"message": "internal error", "param": None, "code": "internal_error"}
        self.status.on_outputs(outputs)
        self._send_outputs(outputs)

    def _send_outputs(self, outputs: list[TokenOut]) -> None:
        if outputs:
            self.to_detok.send(encode(BatchTokenOut(outputs)))

    def _maybe_heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_INTERVAL_S:
            return
        self._last_heartbeat = now
        kv = self.scheduler.kv
        self.to_tm.send(encode(Heartbeat(
            num_forward_steps=self.scheduler.num_forward_steps, num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting), num_free_tokens=kv.allocator.num_free(),
            num_total_tokens=kv.allocator.size, num_cached_tokens=kv.tree.total_size() if kv.tree else 0,
            num_evictable_tokens=kv.tree.evictable_size() if kv.tree else 0,
            num_locked_tokens=kv.tree.protected_size() if kv.tree else 0,
            grammar_compile_seconds=self.scheduler.grammar.drain_compile_seconds(), dp_rank=self.dp_rank)))

    # ---- management -------------------------------------------------------------------------------
    def _control(self, msg: ControlReq) -> ControlResp:
        try:
            if msg.kind == "flush_cache":
                return ControlResp(msg.req_id, self.scheduler.flush_cache())
            if msg.kind == "server_info":
                return ControlResp(msg.req_id, True, self._server_info())
            if msg.kind == "debug_check":
                return self._debug_check(msg.req_id)
            return ControlResp(msg.req_id, False, error=f"unknown control request {msg.kind!r}")
        except Exception as exc:
            logger.exception("control request %s failed", msg.kind)
            return ControlResp(msg.req_id, False, error=type(exc).__name__)

    def _server_info(self) -> dict[str, Any]:
        stats = self.scheduler.stats.to_dict()
        tree = self.scheduler.kv.tree
        if tree is not None:
            stats["cached_tree_tokens"] = tree.total_size()
        return {"cache_stats": stats, "num_free_tokens": self.scheduler.kv.allocator.num_free(),
                "num_forward_steps": self.scheduler.num_forward_steps,
                "num_running_reqs": len(self.scheduler.running), "num_waiting_reqs": len(self.scheduler.waiting)}

    def _debug_check(self, req_id: str) -> ControlResp:
        """robustness.md invariants: pool and tree integrity always; idle invariants when idle."""
        s, kv = self.scheduler, self.scheduler.kv
        data: dict[str, Any] = {
            "idle": not s.has_work(), "num_running": len(s.running), "num_waiting": len(s.waiting),
            "num_free_tokens": kv.allocator.num_free(), "num_total_tokens": kv.allocator.size,
            "num_evictable_tokens": kv.tree.evictable_size() if kv.tree else 0,
            "num_locked_tokens": kv.tree.protected_size() if kv.tree else 0,
            "num_free_req_rows": kv.table.num_free(), "num_req_rows": kv.table.max_requests}
        try:
            s.check_integrity()
            if not s.has_work():
                kv.check_idle()
        except AssertionError as exc:
            return ControlResp(req_id, False, data, error=str(exc))
        return ControlResp(req_id, True, data)
