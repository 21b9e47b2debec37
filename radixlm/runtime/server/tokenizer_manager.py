"""TokenizerManager: the HTTP process's side of the pipeline (asyncio + ZMQ).

Runs in the HTTP process, on uvicorn's event loop. It validates and tokenizes requests (through
runtime/generate_input.py, like the Engine), assigns child rids (n > 1), sends GenerateReq to the
scheduler, and routes the detokenizer's StrOuts back to the waiting route handlers. It also tracks
the children's health (ready handshake, heartbeats) and answers management calls. With `--dp-size N`
there are N schedulers: each request goes to the rank DpDispatcher picks (dp_dispatch.py), management
calls go to every rank and their answers are combined.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Union

import msgspec
import zmq
import zmq.asyncio

from radixlm.runtime.generate_input import InputLimits, PreparedReq, prepare_generate
from radixlm.runtime.messages import (AbortReq, BatchStrOut, ControlReq, ControlResp, FinishReason, GenerateReq,
                                      Heartbeat, ProcessReady, RequestError, StrOut, encode)
from radixlm.runtime.proc import IpcAddrs
from radixlm.runtime.server.dp_dispatch import DpDispatcher, combine, scheduler_name
from radixlm.runtime.server.errors import APIError
from radixlm.runtime.server.metrics import ServerMetrics
from radixlm.runtime.server.stream_assembly import StreamAssembler

logger = logging.getLogger("radixlm.server")

InboundMsg = Union[BatchStrOut, ControlResp, ProcessReady, Heartbeat]
SERVER_UNHEALTHY = RequestError("server_unhealthy", "the server is unhealthy", None, 503)


class RequestHandle:
    """One accepted /generate call: every prompt of a batch and its n children (prompt-major order)."""

    def __init__(self, rids: list[str], stream: bool, namespace: str = ""):
        self.rids = rids
        self.namespace = namespace  # the tenant's: only it (or an operator) may abort the request
        self.index = {rid: i for i, rid in enumerate(rids)}
        self.stream = stream
        self.queue: asyncio.Queue[StrOut] = asyncio.Queue()
        self.results: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, RequestError] = {}  # child rid -> why the scheduler refused or failed it
        self.start = time.perf_counter()
        self.last_token_at: dict[str, float] = {}
        self.client_rids: list[str] = []
        # Awaited with each finished output's text before the route sees it (ChatAgent.settle: the output
        # checks run in worker processes while the event loop serves others); None: nothing to do.
        self.settle: Callable[[str], Awaitable[None]] | None = None

    @property
    def finished(self) -> bool:
        return len(self.results) == len(self.rids)


class TokenizerManager:
    def __init__(self, addrs: IpcAddrs, tokenizer, limits: InputLimits, max_inflight: int, metrics: ServerMetrics,
                 dp_size: int = 1, dp_load_balance: str = "cache_aware"):
        self.addrs = addrs
        self.tokenizer = tokenizer
        self.limits = limits
        self.max_inflight = max_inflight  # children in the schedulers (running + queued) we admit
        self.metrics = metrics
        self.handles: dict[str, RequestHandle] = {}  # child rid -> its request
        self.streams = StreamAssembler()
        self.client_rids: dict[str, list[str]] = {}  # rid as the client named it -> child rids
        self.ready: dict[str, ProcessReady] = {}
        self.state = "starting"  # starting | ok | draining | unhealthy
        self.dp_size = dp_size
        self.dispatch = DpDispatcher(dp_size, dp_load_balance)
        self.scheduler_names = [scheduler_name(r, dp_size) for r in range(dp_size)]
        self.last_heartbeats = [time.monotonic()] * dp_size  # per rank
        self.heartbeats: list[Heartbeat | None] = [None] * dp_size
        self.heartbeat: Heartbeat | None = None  # summed over the ranks
        self._control: dict[str, asyncio.Future] = {}
        self._ready_event = asyncio.Event()
        # Called with (StrOut, RequestHandle, perf_counter now) for every output, before it is recorded
        # (the dashboard's request timelines and rates); a listener must be cheap and never raise.
        self.listeners: list[Callable[[StrOut, RequestHandle, float], None]] = []

    async def start(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.recv = self.ctx.socket(zmq.PULL)
        self.recv.bind(self.addrs.tokenizer_in)
        self.to_schedulers = []
        for addr in self.addrs.scheduler_ins:
            sock = self.ctx.socket(zmq.PUSH)
            sock.connect(addr)
            self.to_schedulers.append(sock)
        self.to_detokenizer = self.ctx.socket(zmq.PUSH)
        self.to_detokenizer.connect(self.addrs.detokenizer_in)
        self._recv_task = asyncio.create_task(self._recv_loop())

    @property
    def receiving(self) -> bool:
        """False once the receive loop has died: no response could ever arrive."""
        return not self._recv_task.done()

    @property
    def last_heartbeat(self) -> float:
        """The stalest rank's last heartbeat: any silent rank makes the server hung."""
        return min(self.last_heartbeats)

    def silent_scheduler(self) -> str:
        """The name of the rank whose heartbeat is the stalest (for the watchdog's message)."""
        return self.scheduler_names[self.last_heartbeats.index(self.last_heartbeat)]

    def scheduler_info(self) -> dict[str, Any]:
        """Rank 0's ready info; the KV capacity is the smallest rank's (one request runs on one rank)."""
        infos = [self.ready[name].info for name in self.scheduler_names]
        return {**infos[0], "max_total_num_tokens": min(i["max_total_num_tokens"] for i in infos),
                "dp_size": self.dp_size}

    async def close(self) -> None:
        """Ask the children to exit (the server then waits briefly before killing them) and close."""
        self._recv_task.cancel()
        for sock in (*self.to_schedulers, self.to_detokenizer):
            try:
                await asyncio.wait_for(sock.send(encode(ControlReq("", "shutdown"))), 1.0)
            except (asyncio.TimeoutError, zmq.ZMQError):
                pass
        self.ctx.destroy(linger=500)

    # ---- incoming ---------------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        decoder = msgspec.msgpack.Decoder(InboundMsg)
        while True:
            raw = await self.recv.recv()
            try:
                self._handle(decoder.decode(raw))
            except Exception:  # one bad message must not stop every response from arriving
                logger.exception("dropped a message from a child process")

    def _handle(self, msg: InboundMsg) -> None:
        if isinstance(msg, BatchStrOut):
            for out in msg.outputs:
                self._route(out)
        elif isinstance(msg, ControlResp):
            fut = self._control.pop(msg.req_id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, Heartbeat):
            self._on_heartbeat(msg)
        else:
            name = scheduler_name(msg.dp_rank, self.dp_size) if msg.process == "scheduler" else msg.process
            self.ready[name] = msg
            if {*self.scheduler_names, "detokenizer"} <= self.ready.keys():
                self._ready_event.set()

    def _on_heartbeat(self, msg: Heartbeat) -> None:
        self.last_heartbeats[msg.dp_rank] = time.monotonic()
        self.heartbeats[msg.dp_rank] = msg
        if self.dp_size == 1:
            self.heartbeat = msg
        else:  # gauges show the server's total; compile times are this heartbeat's own
            beats = [b for b in self.heartbeats if b is not None]
            self.heartbeat = Heartbeat(**{f: sum(getattr(b, f) for b in beats) for f in _SUMMED_HEARTBEAT_FIELDS},
                                       grammar_compile_seconds=msg.grammar_compile_seconds)
        self.metrics.on_heartbeat(self.heartbeat)

    def _route(self, out: StrOut) -> None:
        handle = self.handles.get(out.rid)
        if handle is None:
            return
        out.payload = self.streams.assemble(out)  # streamed deltas -> the cumulative native shape
        now = time.perf_counter()
        for listener in self.listeners:
            try:
                listener(out, handle, now)
            except Exception:  # a display bug must never lose an output
                logger.exception("output listener failed")
        if out.num_new_tokens:
            last = handle.last_token_at.get(out.rid)
            if last is None:
                self.metrics.on_first_token(now - handle.start)
            else:
                self.metrics.on_tokens(out.num_new_tokens, now - last)
            handle.last_token_at[out.rid] = now
        if out.finished:
            self.handles.pop(out.rid, None)
            self.dispatch.release(out.rid)
            handle.results[out.rid] = out.payload or {}
            if out.error is not None:
                handle.errors[out.rid] = out.error
            self.metrics.on_finish(out.payload["meta_info"] if out.payload else {}, now - handle.start, out.error)
            if handle.finished:
                for client_rid in handle.client_rids:
                    self.client_rids.pop(client_rid, None)
            elif out.error is not None:
                self.abort(handle)  # the request fails as a whole: stop its other children now
        handle.queue.put_nowait(out)

    # ---- requests ---------------------------------------------------------------------------------
    def prepare(self, namespace: str, **fields: Any) -> tuple[list[PreparedReq], bool]:
        return prepare_generate(self.tokenizer, self.limits, namespace=namespace, **fields)

    def check_admission(self, num_children: int) -> None:
        if self.state != "ok":
            raise APIError(503, f"server is {self.state}", None, f"server_{self.state}")
        if len(self.handles) + num_children > self.max_inflight:
            raise APIError(503, "server overloaded: too many requests in flight", None, "queue_full")

    def submit(self, prepared: list[PreparedReq], stream: bool, request_id: str = "",
               rank: int | None = None) -> RequestHandle:
        """Send every prompt to its scheduler rank: `rank` if given (health probes), else the dispatcher's."""
        groups = [_child_rids(p) for p in prepared]
        rids = [rid for group in groups for rid in group]
        self.check_admission(len(rids))
        if len(set(rids)) != len(rids) or any(r in self.handles for r in rids):
            raise APIError(400, "a request with this rid is already running", "rid", "duplicate_rid")
        handle = RequestHandle(rids, stream, prepared[0].msg.namespace)
        ranks = []
        for p, group in zip(prepared, groups):
            for rid in group:
                self.handles[rid] = handle
            self.client_rids[p.msg.rid] = group
            handle.client_rids.append(p.msg.rid)
            chosen = self.dispatch.choose(p.msg.namespace, p.msg.input_ids) if rank is None else rank
            self.dispatch.assign(group, chosen)
            ranks.append(str(chosen))
            self.to_schedulers[chosen].send(encode(GenerateReq(p.msg, group, p.return_text_in_logprobs)))
        # Joins the access log line (request_id) to scheduler-side logs and /abort_request (rids).
        logger.info("request_id=%s rids=%s prompt_tokens=%s stream=%s%s", request_id, ",".join(rids),
                    ",".join(str(len(p.msg.input_ids)) for p in prepared), stream,
                    f" dp_ranks={','.join(ranks)}" if self.dp_size > 1 else "")
        return handle

    async def wait(self, handle: RequestHandle) -> list[dict[str, Any]]:
        while not handle.finished:
            await handle.queue.get()
        results = [handle.results[rid] for rid in handle.rids]
        if handle.settle is not None:
            for result in results:
                await handle.settle(result.get("text", ""))
        return results

    async def events(self, handle: RequestHandle) -> AsyncIterator[tuple[int, StrOut]]:
        while not (handle.finished and handle.queue.empty()):
            out = await handle.queue.get()
            if out.finished and handle.settle is not None and out.payload is not None:
                await handle.settle(out.payload.get("text", ""))
            yield handle.index[out.rid], out

    def _abort_child(self, rid: str) -> None:
        rank = self.dispatch.rank_of(rid)
        if rank is not None:  # None: already finished
            self.to_schedulers[rank].send(encode(AbortReq(rid=rid)))

    def abort(self, handle: RequestHandle) -> None:
        for rid in handle.rids:
            if rid not in handle.results:
                self._abort_child(rid)

    def abort_rid(self, rid: str, namespace: str | None = None) -> bool:
        """Exact match on the rid the client gave (all its children) or on one child rid. With a namespace,
        only that tenant's request: another tenant's rid is answered like an unknown one (False)."""
        children = self.client_rids.get(rid) or ([rid] if rid in self.handles else [])
        owners = {self.handles[c].namespace for c in children if c in self.handles}
        if namespace is not None and owners - {namespace}:
            return False
        for child in children:
            self._abort_child(child)
        return bool(children)

    def abort_all(self, namespace: str | None = None) -> None:
        """Every request (namespace None: the schedulers drop all they hold), or every one of a tenant's."""
        if namespace is None:
            for sock in self.to_schedulers:
                sock.send(encode(AbortReq(abort_all=True)))
            return
        for handle in {id(h): h for h in self.handles.values() if h.namespace == namespace}.values():
            self.abort(handle)

    def fail_all(self, message: str) -> None:
        """The scheduler or detokenizer is gone: end every waiting request with an abort now."""
        for rid, handle in list(self.handles.items()):
            payload = {"text": "", "output_ids": [], "meta_info": {
                "id": rid, "finish_reason": FinishReason("abort", message=message).to_json(), "prompt_tokens": 0,
                "completion_tokens": 0, "cached_tokens": 0}}
            self._route(StrOut(rid, 0, True, payload, error=SERVER_UNHEALTHY))

    # ---- management -------------------------------------------------------------------------------
    async def control(self, target: str, kind: str, timeout: float = 10.0) -> ControlResp:
        """Ask the detokenizer, or every scheduler rank (answers combined: dp_dispatch.combine)."""
        if target != "scheduler":
            return await self._ask(self.to_detokenizer, target, kind, timeout)
        return combine(list(await self.control_ranks(kind, timeout)))

    async def control_ranks(self, kind: str, timeout: float = 10.0) -> tuple[ControlResp, ...]:
        return await asyncio.gather(*(self._ask(sock, name, kind, timeout)
                                      for sock, name in zip(self.to_schedulers, self.scheduler_names)))

    async def flush_cache(self) -> ControlResp:
        """Flush every rank; ranks that flushed forget their routing tree even if another rank was busy."""
        resps = await self.control_ranks("flush_cache")
        self.dispatch.forget([rank for rank, resp in enumerate(resps) if resp.ok])
        return combine(list(resps))

    async def _ask(self, sock: zmq.asyncio.Socket, target: str, kind: str, timeout: float) -> ControlResp:
        req_id = uuid.uuid4().hex
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._control[req_id] = fut
        await sock.send(encode(ControlReq(req_id, kind)))
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            self._control.pop(req_id, None)
            raise APIError(503, f"the {target} did not answer in time", None, "timeout") from None

    async def wait_ready(self, timeout: float) -> None:
        await asyncio.wait_for(self._ready_event.wait(), timeout)
        self.last_heartbeats = [time.monotonic()] * self.dp_size
        self.dispatch.set_capacity(self.scheduler_info()["max_total_num_tokens"])
        self.state = "ok"


# Heartbeat fields summed over the ranks for the server-wide gauges.
_SUMMED_HEARTBEAT_FIELDS = ("num_forward_steps", "num_running", "num_waiting", "num_free_tokens", "num_total_tokens",
                            "num_cached_tokens", "num_evictable_tokens", "num_locked_tokens")


def _child_rids(p: PreparedReq) -> list[str]:
    n = p.params.n
    return [p.msg.rid] if n == 1 else [f"{p.msg.rid}-{i}" for i in range(n)]
