"""Engine: the scheduler and the model in the user's process, with no sockets (offline API, tests, lang).

A background thread runs scheduler steps while there is work, so calls from several threads (e.g. the
frontend's run_batch) are batched together continuously. `generate` returns the same dicts as the
native /generate route.
"""

from __future__ import annotations

import logging
import queue
from typing import Any, Iterator

import numpy as np

from radixlm.errors import InvalidRequestError
from radixlm.runtime.builder import build_scheduler
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine_loop import EngineLoop
from radixlm.runtime.generate_input import PreparedReq, prepare_generate
from radixlm.runtime.heap import freeze_heap, release_heap
from radixlm.runtime.messages import GenerateReq, RequestError
from radixlm.runtime.response import ResponseState
from radixlm.runtime.scheduler import info

logger = logging.getLogger(__name__)


class Engine:
    # generate() may be called from many threads at once; the loop thread batches them together.
    supports_concurrent_generate = True

    def __init__(self, model_path: str | None = None, **options: Any):
        self.config = EngineConfig.from_options(model_path, **options)
        self._loop = EngineLoop(lambda: build_scheduler(self.config))  # loads the model on the loop thread
        built = self._built = self._loop.built
        self.model_dir = built.model_dir
        self.tokenizer = built.tokenizer
        self.runner = built.runner
        self.scheduler = built.scheduler
        self.eos_token_ids = built.eos_token_ids
        self.limits = built.limits
        freeze_heap("engine")  # the loaded model and tokenizer stay out of the collector's full passes
        self._frozen = True

    # ---- generation -------------------------------------------------------------------------------
    def generate(self, prompt: str | list[str] | None = None, sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, return_logprob: bool | list[bool] = False,
                 logprob_start_len: int | list[int] = -1, top_logprobs_num: int | list[int] = 0,
                 token_ids_logprob: list[int] | None = None, return_text_in_logprobs: bool = False,
                 stream: bool = False, rid: str | list[str] | None = None, namespace: str = ""):
        """Native-/generate semantics. Returns a dict (one prompt, n == 1), a list of dicts (a batch, or
        n > 1: prompt-major), or with stream=True an iterator of cumulative chunk dicts (one request)."""
        prepared, is_batch = prepare_generate(
            self.tokenizer, self.limits, text=prompt, input_ids=input_ids, sampling_params=sampling_params,
            return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num, token_ids_logprob=token_ids_logprob,
            return_text_in_logprobs=return_text_in_logprobs, stream=stream, rid=rid, namespace=namespace)
        states = [s for p in prepared for s in self._expand(p)]
        if stream:
            if len(states) != 1:
                raise ValueError("stream=True supports one prompt with n == 1")
            return self._stream(states[0])
        results = self._run(states)
        return results if is_batch or len(results) > 1 else results[0]

    def encode(self, prompt: str | list[str] | None = None, input_ids: list[int] | list[list[int]] | None = None,
               rid: str | list[str] | None = None, namespace: str = "") -> dict[str, Any] | list[dict[str, Any]]:
        """Embeddings, as SGLang's Engine.encode: {"embedding": [floats], "meta_info": {...}} per prompt (a dict
        for one prompt, a list for a batch). The vector is the last prompt token's final hidden state (after
        the final norm), L2-normalized; the request is a prefill that shares the radix cache (docs/engine.md)."""
        prepared, is_batch = prepare_generate(self.tokenizer, self.limits, text=prompt, input_ids=input_ids, rid=rid,
                                              namespace=namespace, embed=True)
        results = [_embedding_result(r) for r in self._run([s for p in prepared for s in self._expand(p)])]
        return results if is_batch else results[0]

    def _expand(self, p: PreparedReq) -> list[ResponseState]:
        n = p.params.n
        rids = [p.msg.rid] if n == 1 else [f"{p.msg.rid}-{i}" for i in range(n)]
        return [ResponseState(rid, p, self.tokenizer, child=i) for i, rid in enumerate(rids)]

    def _submit(self, states: list[ResponseState], at_finish: bool = False) -> queue.Queue:
        """One GenerateReq per prompt (its n copies as child rids), as the server sends them. at_finish: a
        request's outputs arrive together when it finishes (QueueTransport.submit)."""
        inbox: queue.Queue = queue.Queue()
        by_prompt: dict[int, list[ResponseState]] = {}
        for state in states:
            by_prompt.setdefault(id(state.prepared), []).append(state)
        for group in by_prompt.values():
            p = group[0].prepared
            self._loop.submit(GenerateReq(p.msg, [s.rid for s in group], p.return_text_in_logprobs), inbox,
                              at_finish)
        return inbox

    def _run(self, states: list[ResponseState]) -> list[dict[str, Any]]:
        by_rid = {s.rid: s for s in states}
        inbox = self._submit(states, at_finish=True)
        pending = len(states)
        while pending:
            out = inbox.get()
            state = by_rid[out.rid]
            state.update(out)
            pending -= state.finished
            if state.error is not None:  # e.g. a grammar that does not compile: fail the whole call
                for other in states:
                    if not other.finished:
                        self._loop.abort(other.rid)
                raise _refused(state.error)
        return [s.to_dict() for s in states]

    def _stream(self, state: ResponseState) -> Iterator[dict[str, Any]]:
        inbox = self._submit([state])
        try:
            while not state.finished:
                out = inbox.get()
                state.update(out)
                if state.error is not None:
                    raise _refused(state.error)
                yield state.to_dict(streaming=True)
        finally:
            if not state.finished:  # the consumer stopped early: free the request's KV now
                self._loop.abort(state.rid)

    # ---- management -------------------------------------------------------------------------------
    def abort(self, rid: str) -> None:
        self._loop.abort(rid)

    def flush_cache(self) -> bool:
        return self._loop.call(self.scheduler.flush_cache)

    def check_integrity(self, idle: bool = True) -> None:
        """Pool and tree invariants (robustness.md); with idle=True also the idle invariants."""
        def check() -> None:
            self.scheduler.check_integrity()
            if idle:
                assert not self.scheduler.has_work(), "engine is not idle"
                self.scheduler.kv.check_idle()
        self._loop.call(check)

    def get_server_info(self) -> dict[str, Any]:
        return info.server_info(self._built, self.config)

    def cache_stats(self) -> dict[str, float]:
        return info.cache_stats(self.scheduler)

    def shutdown(self) -> None:
        self._loop.stop()
        self.scheduler.grammar.close()
        self.runner.close()
        self._release_heap()

    def _release_heap(self) -> None:
        if getattr(self, "_frozen", False):
            self._frozen = False
            release_heap()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self._loop.stop()
            self._release_heap()
        except Exception:
            pass


def _embedding_result(result: dict[str, Any]) -> dict[str, Any]:
    if result["embedding"] is None:  # ended without a vector (aborted, e.g. the KV pool could not hold it)
        raise RuntimeError(f"the embedding request ended: {result['meta_info']['finish_reason']}")
    vector = np.frombuffer(result["embedding"], dtype="<f4")
    return {"embedding": vector.tolist(), "meta_info": result["meta_info"]}


def _refused(error: RequestError) -> Exception:
    """The scheduler refused or failed the request: a full queue is OverflowError, a failed step RuntimeError,
    anything else (e.g. a grammar that does not compile) the caller's 400, InvalidRequestError."""
    if error.code == "queue_full":
        return OverflowError(error.message)
    if error.status >= 500:
        return RuntimeError(error.message)
    return InvalidRequestError(error.message, error.param, error.code)
