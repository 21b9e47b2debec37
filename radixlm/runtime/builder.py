"""Build the scheduler stack (model runner, KV cache, scheduler) from an EngineConfig, and turn a
TokenizedGenerateReq into a scheduler Req. Shared by the in-process Engine and the scheduler process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.generate_input import InputLimits
from radixlm.runtime.messages import TokenizedGenerateReq
from radixlm.runtime.model.model_runner import ModelRunner
from radixlm.runtime.sampling.sampler import make_generator
from radixlm.runtime.scheduler.grammar import GrammarManager
from radixlm.runtime.scheduler.kv_cache import KVCacheManager
from radixlm.runtime.scheduler.memory_pool import ReqToTokenTable, TokenAllocator
from radixlm.runtime.scheduler.output_processor import OutputProcessor
from radixlm.runtime.scheduler.request import LogprobRequest, Req
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.sampling_params import SamplingParams


@dataclass
class BuiltScheduler:
    model_dir: Path
    tokenizer: object
    hf_config: object
    runner: ModelRunner
    scheduler: Scheduler
    eos_token_ids: frozenset[int]
    limits: InputLimits


def build_scheduler(config: EngineConfig) -> BuiltScheduler:
    from transformers import AutoConfig

    from radixlm.runtime.model.loader import load_tokenizer, resolve_model_path

    mc, sc = config.model, config.scheduler
    model_dir = resolve_model_path(mc.model_path)
    tokenizer = load_tokenizer(mc.tokenizer_path or model_dir)
    hf_config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(mc.seed)
    runner = ModelRunner(mc, config.cache, str(model_dir), hf_config, sc.max_running_requests)
    info = runner.info
    kv = KVCacheManager(TokenAllocator(info.max_total_tokens, runner.device),
                        ReqToTokenTable(sc.max_running_requests, info.context_len + 1, runner.device),
                        config.cache.disable_radix_cache, min(config.cache.logprob_cache_top_k, info.vocab_size))
    if runner.wants_cuda_graphs(mc):
        max_bs = mc.cuda_graph_max_bs or min(sc.max_running_requests, 128)
        runner.capture_decode_graphs(kv.table.table, max_bs)
        if config.speculative.algorithm is not None:  # verify rows: the last token and up to max_draft more
            runner.capture_verify_graphs(kv.table.table, max_bs, 1 + config.speculative.max_draft)
    eos = eos_token_ids(tokenizer, hf_config, model_dir)
    grammar = GrammarManager(tokenizer, info.vocab_size, config.grammar)
    outputs = OutputProcessor(tokenizer, info.vocab_size, eos, info.context_len, grammar, kv.truncate)
    limits = InputLimits(vocab_size=info.vocab_size, context_len=info.context_len,
                         max_total_tokens=info.max_total_tokens)
    scheduler = Scheduler(runner, kv, sc, outputs, grammar)
    if config.speculative.algorithm is not None:
        from radixlm.runtime.speculative.setup import build_speculation

        scheduler.spec = outputs.spec = build_speculation(config, runner, info.context_len, tokenizer, eos)
    return BuiltScheduler(model_dir, tokenizer, hf_config, runner, scheduler, eos, limits)


def make_req(msg: TokenizedGenerateReq, params: SamplingParams, rid: str, child: int,
             device: torch.device) -> Req:
    """A scheduler request; child i of an n > 1 request samples with seed + i."""
    seed = None if params.sampling_seed is None else params.sampling_seed + child
    return Req(rid=rid, input_ids=list(msg.input_ids), params=params, namespace=msg.namespace,
               logprob=LogprobRequest(msg.return_logprob, msg.logprob_start_len, msg.top_logprobs_num,
                                      msg.token_ids_logprob),
               generator=make_generator(seed, device), embed=msg.embed)


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
