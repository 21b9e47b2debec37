"""The detokenizer process: scheduler TokenOuts -> native response dicts for the tokenizer manager.

Runs in the detokenizer process (started by runtime/launch.py). It keeps one ResponseState per running
child request (the same class the in-process Engine uses, so the server and the Engine produce
identical text, stop trimming, streaming holdback and logprob formatting). The scheduler forwards each
GenerateReq on the same socket ahead of its outputs, so a state always exists before its first output.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Union

import msgspec
import zmq

from radixlm.runtime.generate_input import PreparedReq
from radixlm.runtime.messages import (BatchStrOut, BatchTokenOut, ControlReq, ControlResp, GenerateReq,
                                      ProcessReady, StrOut, TokenOut, encode)
from radixlm.runtime.proc import IpcAddrs
from radixlm.runtime.response import ResponseState

logger = logging.getLogger("radixlm.detokenizer")

InboundMsg = Union[GenerateReq, BatchTokenOut, ControlReq]


def run_detokenizer_process(tokenizer_path: str, addrs: IpcAddrs, parent_pid: int, log_level: str) -> None:
    from radixlm.runtime.proc import die_with_parent, setup_logging
    from radixlm.runtime.heap import freeze_heap
    from radixlm.runtime.model.loader import load_tokenizer

    die_with_parent(parent_pid, cleanup_dir=addrs.directory)
    setup_logging(log_level)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)  # never block exit on messages to a server that is already gone
    recv = ctx.socket(zmq.PULL)
    recv.bind(addrs.detokenizer_in)
    to_tm = ctx.socket(zmq.PUSH)
    to_tm.connect(addrs.tokenizer_in)
    detok = Detokenizer(load_tokenizer(tokenizer_path))
    freeze_heap("detokenizer")
    to_tm.send(encode(ProcessReady("detokenizer", os.getpid())))
    decoder = msgspec.msgpack.Decoder(InboundMsg)
    while True:
        try:
            msg = decoder.decode(recv.recv())
        except msgspec.DecodeError:
            logger.error("dropped an undecodable message")
            continue
        if isinstance(msg, ControlReq) and msg.kind == "shutdown":  # the server is exiting and waits for us
            ctx.destroy(linger=0)  # before exit: a ZMQ context's term() waits for its sockets
            return
        reply = detok.handle(msg)
        if reply is not None:
            to_tm.send(encode(reply))


class Detokenizer:
    """Socket-free logic, so tests can drive it directly."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, ResponseState] = {}
        self.sent_chars: dict[str, int] = {}  # streaming: visible characters already sent, per rid

    def handle(self, msg: InboundMsg) -> BatchStrOut | ControlResp | None:
        if isinstance(msg, GenerateReq):
            self._register(msg)
            return None
        if isinstance(msg, BatchTokenOut):
            outs = [o for o in (self._update(out) for out in msg.outputs) if o is not None]
            return BatchStrOut(outs) if outs else None
        if msg.kind == "debug_state":
            return ControlResp(msg.req_id, True, {"num_states": len(self.states)})
        return ControlResp(msg.req_id, False, error=f"unknown control request {msg.kind!r}")

    def _register(self, msg: GenerateReq) -> None:
        prepared = PreparedReq(0, msg.req, msg.req.sampling_params, msg.return_text_in_logprobs)  # validated
        for rid in msg.child_rids:
            self.states[rid] = ResponseState(rid, prepared, self.tokenizer)

    def _update(self, out: TokenOut) -> StrOut | None:
        state = self.states.get(out.rid)
        if state is None:
            return None
        state.update(out)
        streaming = state.prepared.msg.stream
        if state.finished:
            del self.states[out.rid]
            self.sent_chars.pop(out.rid, None)
            return StrOut(out.rid, len(out.new_ids), True, state.to_dict(streaming=streaming), error=out.error)
        if not streaming:
            return StrOut(out.rid, len(out.new_ids), False)
        return StrOut(out.rid, len(out.new_ids), False, self._delta(state, out), delta=True,
                      num_rollback=out.num_rollback)

    def _delta(self, state: ResponseState, out: TokenOut) -> dict[str, Any]:
        """The streaming update with only what is new: the visible text only grows (a tail that may
        become a stop string is held back), and the ids change exactly as this TokenOut says."""
        payload = state.to_dict(streaming=True)
        sent = self.sent_chars.get(out.rid, 0)
        self.sent_chars[out.rid] = len(payload["text"])
        payload["text"] = payload["text"][sent:]
        payload["output_ids"] = list(out.new_ids)
        return payload

