"""The two transports of the scheduler loop (loop.py): where its messages come from and where its outputs go.

ZmqTransport runs in the scheduler process (msgpack-encoded structs over ipc:// sockets: in from the
tokenizer manager, out to the detokenizer, control answers and heartbeats back to the tokenizer manager).
QueueTransport runs in the user's process for the in-process Engine: plain queues, the same structs
unencoded, each request's outputs delivered to the queue of the caller that submitted it.
"""

from __future__ import annotations

import logging
import queue
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Union

import msgspec
import zmq

from radixlm.runtime.messages import (AbortReq, BatchTokenOut, ControlReq, ControlResp, GenerateReq, Heartbeat,
                                      TokenOut, encode)

logger = logging.getLogger("radixlm.scheduler")

InboundMsg = Union[GenerateReq, AbortReq, ControlReq]


@dataclass
class LocalCall:
    """In-process only: run fn on the loop thread, between steps, and resolve future with its result."""

    fn: Callable[[], Any]
    future: Future


class Transport(Protocol):
    # How long the loop may block waiting for a message when the scheduler has no work (None: until one
    # arrives) and how often it sends a heartbeat (None: never).
    idle_wait_s: float | None
    heartbeat_interval_s: float | None

    def receive(self, timeout_s: float | None) -> list[InboundMsg | LocalCall]:
        """Every message that has arrived, waiting up to timeout_s for the first (0: do not wait)."""
        ...

    def announce(self, msg: GenerateReq) -> None:
        """A request is being added; whoever assembles its outputs must know it before the first one."""
        ...

    def send_outputs(self, outputs: list[TokenOut]) -> None: ...

    def send_control(self, resp: ControlResp) -> None: ...

    def send_heartbeat(self, beat: Heartbeat) -> None: ...


class ZmqTransport:
    idle_wait_s = 0.1  # wake at least this often when idle, so heartbeats keep flowing
    heartbeat_interval_s = 0.5

    def __init__(self, recv: zmq.Socket, to_detok: zmq.Socket, to_tm: zmq.Socket):
        self.recv, self.to_detok, self.to_tm = recv, to_detok, to_tm
        self.decoder = msgspec.msgpack.Decoder(InboundMsg)

    def receive(self, timeout_s: float | None) -> list[InboundMsg | LocalCall]:
        if not self.recv.poll(None if timeout_s is None else int(timeout_s * 1000)):
            return []
        out: list[InboundMsg | LocalCall] = []
        while True:
            try:
                raw = self.recv.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                out.append(self.decoder.decode(raw))
            except msgspec.DecodeError:
                logger.error("dropped an undecodable message")

    def announce(self, msg: GenerateReq) -> None:
        self.to_detok.send(encode(msg))  # same socket as the outputs, so it arrives first

    def send_outputs(self, outputs: list[TokenOut]) -> None:
        if outputs:
            self.to_detok.send(encode(BatchTokenOut(outputs)))

    def send_control(self, resp: ControlResp) -> None:
        self.to_tm.send(encode(resp))

    def send_heartbeat(self, beat: Heartbeat) -> None:
        self.to_tm.send(encode(beat))

    def close(self) -> None:
        for sock in (self.recv, self.to_detok, self.to_tm):
            sock.close(linger=0)  # closed before exit: a ZMQ context's term() waits for its sockets


class QueueTransport:
    idle_wait_s = None  # nothing to report while idle: sleep until a command arrives
    heartbeat_interval_s = None

    def __init__(self) -> None:
        self._commands: queue.Queue = queue.Queue()
        self._inboxes: dict[str, queue.Queue] = {}  # rid -> the submitting caller's queue (loop thread only)
        # rid -> its TokenOuts so far, for callers that take them at the finish (loop thread only)
        self._held: dict[str, list[TokenOut]] = {}

    # ---- user threads ---------------------------------------------------------------------------------
    def submit(self, msg: GenerateReq, inbox: queue.Queue, at_finish: bool = False) -> None:
        """Each child rid's TokenOuts go to inbox, the last one with finish set. at_finish: all of a rid's
        TokenOuts arrive together when it finishes (or fails), for a caller that does not stream. Why: each
        put wakes the caller's thread, and the two threads then hand the GIL back and forth once per token;
        on a 2-core VM that cost the loop ~0.1 ms a token, at batch 1 (docs/benchmarks.md)."""
        self._commands.put((msg, inbox, at_finish))

    def put(self, msg: InboundMsg | LocalCall) -> None:
        self._commands.put((msg, None, False))

    # ---- the loop thread --------------------------------------------------------------------------------
    def receive(self, timeout_s: float | None) -> list[InboundMsg | LocalCall]:
        out: list[InboundMsg | LocalCall] = []
        try:
            item = self._commands.get_nowait() if timeout_s == 0 else self._commands.get(timeout=timeout_s)
            while True:
                msg, inbox, at_finish = item
                if inbox is not None:
                    self._inboxes.update((rid, inbox) for rid in msg.child_rids)
                    if at_finish:
                        self._held.update((rid, []) for rid in msg.child_rids)
                out.append(msg)
                item = self._commands.get_nowait()
        except queue.Empty:
            return out

    def announce(self, msg: GenerateReq) -> None:
        pass  # the caller holds the request's state already

    def send_outputs(self, outputs: list[TokenOut]) -> None:
        for out in outputs:
            inbox = self._inboxes.get(out.rid)
            if inbox is None:
                continue
            held = self._held.get(out.rid)
            if held is not None and out.finish is None and out.error is None:
                held.append(out)
                continue
            for earlier in self._held.pop(out.rid, ()):
                inbox.put(earlier)
            inbox.put(out)
            if out.finish is not None:
                del self._inboxes[out.rid]

    def send_control(self, resp: ControlResp) -> None:
        pass  # the Engine asks through LocalCall, which answers through its future

    def send_heartbeat(self, beat: Heartbeat) -> None:
        pass
