"""The server-info dict, built in ONE place for the Engine (get_server_info) and the server (/server_info).

Runs where the scheduler runs (the scheduler process, or the Engine's loop thread): the live part reads
scheduler state, so it is built between steps by the thread that owns the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.runtime.builder import BuiltScheduler
    from radixlm.runtime.config import EngineConfig
    from radixlm.runtime.scheduler.scheduler import Scheduler


def model_info(built: "BuiltScheduler", config: "EngineConfig") -> dict[str, Any]:
    """What does not change while serving (the server sends it once, in the ready handshake)."""
    info = built.runner.info
    return {"model_path": str(built.model_dir), "device": info.device, "dtype": info.dtype,
            "quantization": info.quantization,
            "num_threads": info.num_threads, "context_length": info.context_len,
            "vocab_size": info.vocab_size, "hidden_size": built.runner.dims.hidden,
            "max_total_num_tokens": info.max_total_tokens,
            "architecture": info.architecture, "eos_token_ids": sorted(built.eos_token_ids),
            "max_running_requests": config.scheduler.max_running_requests,
            "max_queued_requests": config.scheduler.max_queued_requests,
            "chunked_prefill_size": config.scheduler.chunked_prefill_size,
            "schedule_policy": config.scheduler.schedule_policy,
            "disable_radix_cache": config.cache.disable_radix_cache,
            "speculative_algorithm": config.speculative.algorithm}


def cache_stats(scheduler: "Scheduler") -> dict[str, float]:
    stats = scheduler.stats.to_dict()
    tree = scheduler.kv.tree
    if tree is not None:
        stats["evicted_tokens"] = getattr(tree.stats, "evicted_tokens", 0)
        stats["cached_tree_tokens"] = tree.total_size()
    return stats


def _load_tokens(scheduler: "Scheduler") -> dict[str, int]:
    """KV tokens that running requests hold (evictable cached prefixes excluded), and the prompt tokens
    still waiting: SGLang's load measure (/get_load)."""
    tree = scheduler.kv.tree
    return {"num_evictable_tokens": tree.evictable_size() if tree is not None else 0,
            "num_waiting_tokens": sum(len(req.input_ids) for req in scheduler.waiting)}


def live_info(scheduler: "Scheduler") -> dict[str, Any]:
    """Counters of the running scheduler (summed over ranks by the server with --dp-size)."""
    return {"cache_stats": cache_stats(scheduler), "num_free_tokens": scheduler.kv.allocator.num_free(),
            "num_forward_steps": scheduler.num_forward_steps, "num_running_reqs": len(scheduler.running),
            "num_waiting_reqs": len(scheduler.waiting), **_load_tokens(scheduler),
            **({"speculative": scheduler.spec.stats.to_dict()} if scheduler.spec is not None else {})}


def server_info(built: "BuiltScheduler", config: "EngineConfig") -> dict[str, Any]:
    return {**model_info(built, config), **live_info(built.scheduler)}
