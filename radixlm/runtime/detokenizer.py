"""The detokenizer process: scheduler TokenOuts -> native response dicts for the tokenizer manager.

Runs in the detokenizer process (started by runtime/launch.py). It keeps one ResponseState per running
child request (the same class the in-process Engine uses, so the server and the Engine produce
identical text, stop trimming, streaming holdback and logprob formatting). The scheduler forwards each
GenerateReq on the same socket ahead of its outputs, so a state always exists before its first output.
A finished json_schema output is checked in worker processes (check_pool.py), never on this loop: it is
sent when its check is done, or unchecked at the grammar compile deadline, while other outputs flow on.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import msgspec
import zmq

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.generate_input import PreparedReq
from radixlm.runtime.messages import (BatchStrOut, BatchTokenOut, ControlReq, ControlResp, GenerateReq,
                                      ProcessReady, StrOut, TokenOut, encode)
from radixlm.runtime.proc import IpcAddrs
from radixlm.runtime.response import ResponseState

if TYPE_CHECKING:
    from radixlm.constrained.check_pool import OutputChecker

logger = logging.getLogger("radixlm.detokenizer")
_CHECK_POLL_MS = 10  # how often finished checks are collected while some are running

InboundMsg = Union[GenerateReq, BatchTokenOut, ControlReq]


def run_detokenizer_process(tokenizer_path: str, addrs: IpcAddrs, parent_pid: int, log_level: str,
                            grammar: GrammarConfig | None = None) -> None:
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
    grammar = grammar or GrammarConfig()
    detok = Detokenizer(load_tokenizer(tokenizer_path), CheckerConfig(grammar.grammar_num_workers,
                                                                       grammar.grammar_compile_timeout))
    freeze_heap("detokenizer")
    to_tm.send(encode(ProcessReady("detokenizer", os.getpid())))
    decoder = msgspec.msgpack.Decoder(InboundMsg)
    while True:
        # While outputs wait for their JSON check, wake up now and then to send the finished ones.
        if recv.poll(_CHECK_POLL_MS if detok.checking else None):
            try:
                msg = decoder.decode(recv.recv())
            except msgspec.DecodeError:
                logger.error("dropped an undecodable message")
                continue
            if isinstance(msg, ControlReq) and msg.kind == "shutdown":  # the server is exiting and waits for us
                detok.close()
                ctx.destroy(linger=0)  # before exit: a ZMQ context's term() waits for its sockets
                return
            reply = detok.handle(msg)
            if reply is not None:
                to_tm.send(encode(reply))
        checked = detok.checked_outputs()
        if checked is not None:
            to_tm.send(encode(checked))


@dataclass(frozen=True)
class CheckerConfig:
    """Finished-output checks in worker processes (check_pool.py): the grammar compile limits."""

    num_workers: int = 2
    timeout_s: float = 5.0


@dataclass(frozen=True)
class _Checking:
    """A finished output waiting for its JSON check."""

    state: ResponseState
    out: TokenOut
    future: Future


class Detokenizer:
    """Socket-free logic, so tests can drive it directly. Without a CheckerConfig, JSON checks run inline."""

    def __init__(self, tokenizer, checker: CheckerConfig | None = None):
        self.tokenizer = tokenizer
        self.states: dict[str, ResponseState] = {}
        self.sent_chars: dict[str, int] = {}  # streaming: visible characters already sent, per rid
        self.checking: list[_Checking] = []
        self._checker_config = checker
        self._checker: OutputChecker | None = None  # started on the first json_schema request

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
            state = self.states[rid] = ResponseState(rid, prepared, self.tokenizer)
            state.defer_json_check = self._checker_config is not None

    def _update(self, out: TokenOut) -> StrOut | None:
        state = self.states.get(out.rid)
        if state is None:
            return None
        state.update(out)
        streaming = state.prepared.msg.stream
        if state.finished:
            del self.states[out.rid]
            self.sent_chars.pop(out.rid, None)
            if state.defer_json_check and state.needs_json_check():
                future = self._output_checker().submit(state.params.json_schema, state.text,
                                                       state.finish.type != "length")
                self.checking.append(_Checking(state, out, future))
                return None
            return self._final(state, out)
        if not streaming:
            return StrOut(out.rid, len(out.new_ids), False)
        return StrOut(out.rid, len(out.new_ids), False, self._delta(state, out), delta=True,
                      num_rollback=out.num_rollback)

    def _final(self, state: ResponseState, out: TokenOut) -> StrOut:
        streaming = state.prepared.msg.stream
        return StrOut(out.rid, len(out.new_ids), True, state.to_dict(streaming=streaming), error=out.error)

    def _output_checker(self) -> OutputChecker:
        if self._checker is None:
            from radixlm.constrained.check_pool import OutputChecker

            config = self._checker_config or CheckerConfig()
            self._checker = OutputChecker(config.num_workers, config.timeout_s)
        return self._checker

    def checked_outputs(self) -> BatchStrOut | None:
        """The finished outputs whose JSON check is done (or was stopped at its deadline: unchecked)."""
        done = [c for c in self.checking if c.future.done()]
        if not done:
            return None
        self.checking = [c for c in self.checking if all(c is not d for d in done)]
        for c in done:
            c.state.json_check = self._output_checker().outcome(c.future)
        return BatchStrOut([self._final(c.state, c.out) for c in done])

    def close(self) -> None:
        if self._checker is not None:
            self._checker.close()

    def _delta(self, state: ResponseState, out: TokenOut) -> dict[str, Any]:
        """The streaming update with only what is new: the visible text only grows (a tail that may
        become a stop string is held back), and the ids change exactly as this TokenOut says."""
        payload = state.to_dict(streaming=True)
        sent = self.sent_chars.get(out.rid, 0)
        self.sent_chars[out.rid] = len(payload["text"])
        payload["text"] = payload["text"][sent:]
        payload["output_ids"] = list(out.new_ids)
        return payload

