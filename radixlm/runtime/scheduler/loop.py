"""The scheduler loop: ONE lifecycle around the plain Scheduler class, over a transport (transport.py).

Runs in the scheduler process (started by runtime/launch.py, ZMQ transport) and on the in-process
Engine's loop thread (runtime/engine_loop.py, queue transport). Receives GenerateReq / AbortReq /
ControlReq without blocking while there is work, runs one scheduler step at a time, and sends every
step's TokenOuts out. Between steps it sends a Heartbeat (server only), which the tokenizer manager's
watchdog reads: a silent scheduler is hung. With `--dp-size N` the server runs N of these processes
(dp_rank 0..N-1), each with its own model copy, input socket and cache; they share the detokenizer and the
tokenizer manager, and tag their ready and heartbeat messages with dp_rank.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import zmq

from radixlm.errors import InvalidRequestError
from radixlm.runtime.builder import build_scheduler
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.messages import (AbortReq, ControlReq, ControlResp, FinishReason, GenerateReq, Heartbeat,
                                      ProcessReady, RequestError, TokenizedGenerateReq, TokenOut, encode)
from radixlm.runtime.proc import IpcAddrs
from radixlm.runtime.scheduler.dashboard import SnapshotBuilder
from radixlm.runtime.scheduler.info import live_info, model_info
from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.scheduler.status_log import StatusLog
from radixlm.runtime.scheduler.transport import InboundMsg, LocalCall, Transport, ZmqTransport
from radixlm.sampling_params import SamplingParams

logger = logging.getLogger("radixlm.scheduler")

GRAMMAR_POLL_S = 0.002  # only grammars compiling (in worker processes): check often, but do not spin

# (the request message, its sampling params, child rid, child index) -> a scheduler Req
MakeReq = Callable[[TokenizedGenerateReq, SamplingParams, str, int], Req]


def run_scheduler_process(config: EngineConfig, addrs: IpcAddrs, parent_pid: int, log_level: str,
                          dp_rank: int = 0) -> None:
    from radixlm.runtime.builder import make_req
    from radixlm.runtime.heap import freeze_heap
    from radixlm.runtime.proc import die_with_parent, setup_logging

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
    freeze_heap("scheduler")
    to_tm.send(encode(ProcessReady("scheduler", os.getpid(), model_info(built, config), dp_rank=dp_rank)))
    transport = ZmqTransport(recv, to_detok, to_tm)
    device = built.runner.device
    try:
        SchedulerLoop(built.scheduler, transport, lambda m, p, rid, i: make_req(m, p, rid, i, device),
                      dp_rank=dp_rank).run()
        built.scheduler.grammar.close()  # stops the grammar compile workers
        built.runner.close()  # stops tensor-parallel worker ranks (no-op at tp_size 1)
        transport.close()
    finally:
        ctx.destroy(linger=0)


def _rejection(msg: GenerateReq, rid: str, reason: str, error: RequestError) -> TokenOut:
    """The terminal output of a request the scheduler would not take (invariant 4: exactly one)."""
    return TokenOut(rid=rid, new_ids=[], prompt_tokens=len(msg.req.input_ids), completion_tokens=0,
                    cached_tokens=0, finish=FinishReason("abort", message=reason), error=error)


# What the client is told when the scheduler fails a request (the finish message keeps the detail).
QUEUE_FULL = RequestError("queue_full", "server overloaded: the waiting queue is full", None, 503)
INTERNAL_ERROR = RequestError("internal_error", "internal server error", None, 500)


class SchedulerLoop:
    def __init__(self, scheduler: Scheduler, transport: Transport, make_req: MakeReq, dp_rank: int = 0,
                 shutdown_message: str = "shut down"):
        self.scheduler = scheduler
        self.transport = transport
        self.make_req = make_req
        self.dp_rank = dp_rank
        self.shutdown_message = shutdown_message  # the finish message of requests still running at shutdown
        self._last_heartbeat = 0.0
        self.status = StatusLog()
        self.dashboard = SnapshotBuilder()  # builds only when a dashboard_snapshot request comes

    def run(self) -> None:
        """Until a shutdown ControlReq arrives (requests still in flight are then aborted)."""
        while True:
            for msg in self.transport.receive(self._wait_s()):
                if not self._handle(msg):
                    self.transport.send_outputs(self.scheduler.abort_all(self.shutdown_message))
                    return
            if self.scheduler.has_work():
                self._step()
            if not self.scheduler.has_work():  # before any message is read: idle checks find it settled
                self.scheduler.settle()
            self.status.maybe_log(self.scheduler)  # also when idle: work that starts later is measured anew
            self._maybe_heartbeat()

    def _wait_s(self) -> float | None:
        """How long to wait for a message: not at all when a step can run, a few ms when the only work is
        grammars compiling elsewhere (poll them without spinning), else the transport's idle wait."""
        if not self.scheduler.has_work():
            return self.transport.idle_wait_s
        return 0.0 if self.scheduler.has_runnable() else GRAMMAR_POLL_S

    def _handle(self, msg: InboundMsg | LocalCall) -> bool:
        """Act on one message; False on shutdown."""
        if isinstance(msg, GenerateReq):
            self._add(msg)
        elif isinstance(msg, AbortReq):
            outs = self.scheduler.abort_all("aborted") if msg.abort_all else self.scheduler.abort(msg.rid)
            self.transport.send_outputs(outs)
        elif isinstance(msg, LocalCall):
            try:
                msg.future.set_result(msg.fn())
            except BaseException as exc:  # noqa: BLE001 - reported to the caller; the loop keeps serving
                msg.future.set_exception(exc)
        elif msg.kind == "shutdown":  # the owner is exiting and waits for us
            return False
        else:
            self.transport.send_control(self._control(msg))
        return True

    def _add(self, msg: GenerateReq) -> None:
        self.transport.announce(msg)
        rejected = []
        for child, rid in enumerate(msg.child_rids):  # params were validated where the request entered
            try:
                self.scheduler.add_request(self.make_req(msg.req, msg.req.sampling_params, rid, child))
            except OverflowError:
                rejected.append(_rejection(msg, rid, "the waiting queue is full", QUEUE_FULL))
            except InvalidRequestError as exc:  # e.g. a grammar that does not compile: the client's 400
                rejected.append(_rejection(msg, rid, str(exc), RequestError(exc.code, str(exc), exc.param)))
            except Exception as exc:
                logger.exception("could not add request %s", rid)
                rejected.append(_rejection(msg, rid, f"internal error ({type(exc).__name__})", INTERNAL_ERROR))
        self.transport.send_outputs(rejected)

    def _step(self) -> None:
        try:
            outputs = self.scheduler.step()
        except Exception as exc:  # a bug in one step must not take the server down: fail what is in flight
            logger.exception("scheduler step failed")
            outputs = self.scheduler.abort_all(f"internal error ({type(exc).__name__})")
            for out in outputs:
                out.error = INTERNAL_ERROR
        self.status.on_outputs(outputs)
        self.transport.send_outputs(outputs)

    def _maybe_heartbeat(self) -> None:
        interval = self.transport.heartbeat_interval_s
        now = time.monotonic()
        if interval is None or now - self._last_heartbeat < interval:
            return
        self._last_heartbeat = now
        s, kv = self.scheduler, self.scheduler.kv
        self.transport.send_heartbeat(Heartbeat(
            num_forward_steps=s.num_forward_steps, num_running=len(s.running), num_waiting=len(s.waiting),
            num_free_tokens=kv.allocator.num_free(), num_total_tokens=kv.allocator.size,
            num_cached_tokens=kv.tree.total_size() if kv.tree else 0,
            num_evictable_tokens=kv.tree.evictable_size() if kv.tree else 0,
            num_locked_tokens=kv.tree.protected_size() if kv.tree else 0,
            grammar_compile_seconds=s.grammar.drain_compile_seconds(), dp_rank=self.dp_rank))

    # ---- management -------------------------------------------------------------------------------
    def _control(self, msg: ControlReq) -> ControlResp:
        try:
            if msg.kind == "flush_cache":
                return ControlResp(msg.req_id, self.scheduler.flush_cache())
            if msg.kind == "server_info":
                return ControlResp(msg.req_id, True, live_info(self.scheduler))
            if msg.kind == "debug_check":
                return self._debug_check(msg.req_id)
            if msg.kind == "dashboard_snapshot":
                return ControlResp(msg.req_id, True, self.dashboard.snapshot(self.scheduler))
            return ControlResp(msg.req_id, False, error=f"unknown control request {msg.kind!r}")
        except Exception as exc:
            logger.exception("control request %s failed", msg.kind)
            return ControlResp(msg.req_id, False, error=type(exc).__name__)

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
