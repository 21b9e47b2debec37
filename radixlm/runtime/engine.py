"""Engine: the scheduler and the model in the user's process, with no sockets (offline API, tests, lang).

A background thread runs scheduler steps while there is work, so calls from several threads (e.g. the
frontend's run_batch) are batched together continuously. `generate` returns the same dicts as the
native /generate route.
"""

from __future__ import annotations

import logging
import queue
from typing import Any, Iterator

import torch

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine_loop import EngineLoop
from radixlm.runtime.generate_input import InputLimits, PreparedReq, prepare_generate
from radixlm.runtime.model.model_runner import ModelRunner
from radixlm.runtime.model.sampler import make_generator
from radixlm.runtime.response import ResponseState
from radixlm.runtime.scheduler.kv_cache import KVCacheManager
from radixlm.runtime.scheduler.memory_pool import ReqToTokenTable, TokenAllocator
from radixlm.runtime.scheduler.output_processor import OutputProcessor
from radixlm.runtime.scheduler.request import LogprobRequest, Req
from radixlm.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class Engine:
    # generate() may be called from many threads at once; the loop thread batches them together.
    supports_concurrent_generate = True

    def __init__(self, model_path: str | None = None, **options: Any):
        from transformers import AutoConfig

        from radixlm.runtime.model.loader import load_tokenizer, resolve_model_path

        self.config = EngineConfig.from_options(model_path, **options)
        mc = self.config.model
        self.model_dir = resolve_model_path(mc.model_path)
        self.tokenizer = load_tokenizer(mc.tokenizer_path or self.model_dir)
        hf_config = AutoConfig.from_pretrained(self.model_dir)
        torch.manual_seed(mc.seed)
        sc = self.config.scheduler
        self.runner = ModelRunner(mc, self.config.cache, str(self.model_dir), hf_config, sc.max_running_requests)
        info = self.runner.info
        kv = KVCacheManager(TokenAllocator(info.max_total_tokens, self.runner.device),
                            ReqToTokenTable(sc.max_running_requests, info.context_len + 1, self.runner.device),
                            self.config.cache.disable_radix_cache)
        self.eos_token_ids = eos_token_ids(self.tokenizer, hf_config, self.model_dir)
        outputs = OutputProcessor(self.tokenizer, info.vocab_size, self.eos_token_ids, info.context_len)
        self.scheduler = Scheduler(self.runner, kv, sc, outputs)
        self.limits = InputLimits(vocab_size=info.vocab_size, context_len=info.context_len,
                                  max_total_tokens=info.max_total_tokens)
        self._loop = EngineLoop(self.scheduler)

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

    def _expand(self, p: PreparedReq) -> list[ResponseState]:
        n = p.params.n
        rids = [p.msg.rid] if n == 1 else [f"{p.msg.rid}-{i}" for i in range(n)]
        return [ResponseState(rid, p, self.tokenizer) for rid in rids]

    def _make_req(self, state: ResponseState, child: int) -> Req:
        msg, params = state.prepared.msg, state.params
        seed = None if params.sampling_seed is None else params.sampling_seed + child
        return Req(rid=state.rid, input_ids=list(msg.input_ids), params=params, namespace=msg.namespace,
                   logprob=LogprobRequest(msg.return_logprob, msg.logprob_start_len, msg.top_logprobs_num,
                                          msg.token_ids_logprob),
                   generator=make_generator(seed, self.runner.device))

    def _submit(self, states: list[ResponseState]) -> queue.Queue:
        inbox: queue.Queue = queue.Queue()
        reqs = []
        for state in states:
            child = int(state.rid.rsplit("-", 1)[1]) if state.rid != state.prepared.msg.rid else 0
            reqs.append(self._make_req(state, child))
        self._loop.submit(reqs, inbox)
        return inbox

    def _run(self, states: list[ResponseState]) -> list[dict[str, Any]]:
        by_rid = {s.rid: s for s in states}
        inbox = self._submit(states)
        pending = len(states)
        while pending:
            out = inbox.get()
            if isinstance(out, BaseException):
                raise out
            state = by_rid[out.rid]
            state.update(out)
            pending -= state.finished
        return [s.to_dict() for s in states]

    def _stream(self, state: ResponseState) -> Iterator[dict[str, Any]]:
        inbox = self._submit([state])
        try:
            while not state.finished:
                out = inbox.get()
                if isinstance(out, BaseException):
                    raise out
                state.update(out)
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
        info = self.runner.info
        kv = self.scheduler.kv
        return {
            "model_path": str(self.model_dir), "device": info.device, "dtype": info.dtype,
            "num_threads": info.num_threads, "context_length": info.context_len,
            "max_total_num_tokens": info.max_total_tokens,
            "max_running_requests": self.config.scheduler.max_running_requests,
            "chunked_prefill_size": self.config.scheduler.chunked_prefill_size,
            "schedule_policy": self.config.scheduler.schedule_policy,
            "disable_radix_cache": self.config.cache.disable_radix_cache,
            "cache_stats": self.cache_stats(),
            "num_free_tokens": kv.allocator.num_free(),
            "num_forward_steps": self.scheduler.num_forward_steps,
        }

    def cache_stats(self) -> dict[str, float]:
        stats = self.scheduler.stats.to_dict()
        tree = self.scheduler.kv.tree
        if tree is not None:
            stats["evicted_tokens"] = getattr(tree.stats, "evicted_tokens", 0)
            stats["cached_tree_tokens"] = tree.total_size()
        return stats

    def shutdown(self) -> None:
        self._loop.stop()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self._loop.stop()
        except Exception:
            pass


def eos_token_ids(tokenizer, hf_config, model_dir) -> frozenset[int]:
    """EOS ids from the config, generation_config.json (what transformers' generate stops on) and the
    tokenizer."""
    from transformers import GenerationConfig

    try:
        gen_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:  # no generation_config.json
        gen_eos = None
    ids: set[int] = set()
    for source in (getattr(hf_config, "eos_token_id", None), gen_eos, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(x) for x in source)
    return frozenset(ids)

