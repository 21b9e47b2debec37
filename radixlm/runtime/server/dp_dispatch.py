"""Data parallelism inside one server (`--dp-size N`): which scheduler rank runs a request, and how the
N ranks' answers to one management call become one answer.

Runs in the HTTP process, on the tokenizer manager's event loop (no locks needed). The choice reuses the
standalone router's Policy (radixlm/radix_cache/routing.py, shared) over token ids instead of characters: one
approximate radix tree per rank, filled with the prompts sent there (namespace = tenant), LRU-bounded
by the rank's KV capacity. Load is the number of child requests in flight per rank, released when the
request's final output (finish or abort) arrives. Every rank is vital: the watchdog treats any dead or
silent rank as a dead server (runner.py), so there is no per-rank health state here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from radixlm.radix_cache.routing import Policy, PolicyConfig, RouteKey, new_tree
from radixlm.runtime.messages import ControlResp


def scheduler_name(rank: int, dp_size: int) -> str:
    """The process name of a scheduler rank (in logs, procs and /debug/invariants pids). dp_size 1 keeps
    the single scheduler's name."""
    return "scheduler" if dp_size == 1 else f"scheduler{rank}"


class DpDispatcher:
    def __init__(self, dp_size: int, policy: str = "cache_aware", max_tree_tokens: int = 1 << 21):
        self.dp_size = dp_size
        self.policy = Policy(PolicyConfig(tuple(f"dp{r}" for r in range(dp_size)), policy=policy,
                                          max_tree_chars=max_tree_tokens))
        self.owner: dict[str, int] = {}  # child rid in flight -> its rank

    def set_capacity(self, max_tree_tokens: int) -> None:
        """Bound each approximate tree by what a rank's real cache can hold (known after start-up)."""
        self.policy.config = dataclasses.replace(self.policy.config, max_tree_chars=max(1, max_tree_tokens))

    def choose(self, namespace: str, input_ids: list[int]) -> int:
        if self.dp_size == 1:  # nothing to decide: keep dp_size 1 as it was (no tree upkeep)
            self.policy.replicas[0].num_routed += 1
            return 0
        replica = self.policy.choose(RouteKey(namespace, tuple(input_ids)))
        assert replica is not None  # every rank is always a candidate (no health marking)
        return self.policy.replicas.index(replica)

    def assign(self, rids: list[str], rank: int) -> None:
        """All children of one prompt share it, so they go to one rank together."""
        for rid in rids:
            self.owner[rid] = rank
        self.policy.replicas[rank].load += len(rids)

    def release(self, rid: str) -> None:
        rank = self.owner.pop(rid, None)
        if rank is not None:
            self.policy.replicas[rank].load -= 1

    def rank_of(self, rid: str) -> int | None:
        return self.owner.get(rid)

    def forget(self, ranks: list[int]) -> None:
        """These ranks flushed their cache: their approximate trees start empty again."""
        for rank in ranks:
            self.policy.replicas[rank].tree = new_tree()

    def stats(self) -> list[dict[str, Any]]:
        return [{"dp_rank": i, "load": r.load, "num_routed": r.num_routed, "tree_tokens": r.tree.total_size()}
                for i, r in enumerate(self.policy.replicas)]


def combine(resps: list[ControlResp]) -> ControlResp:
    """One answer from every rank's: ok when all are; numbers summed, flags and-ed, nested dicts merged
    the same way (a hit rate is recomputed from the sums), other values rank 0's; the per-rank answers
    are kept under "dp_ranks"."""
    if len(resps) == 1:
        return resps[0]
    data = _merge([r.data for r in resps])
    data["dp_ranks"] = [r.data for r in resps]
    errors = [f"dp rank {i}: {r.error}" for i, r in enumerate(resps) if not r.ok]
    return ControlResp(resps[0].req_id, not errors, data, "; ".join(errors))


def _merge(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in dicts[0].items():
        values = [d.get(key) for d in dicts]
        if all(isinstance(v, bool) for v in values):
            out[key] = all(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = sum(values)
        elif all(isinstance(v, dict) for v in values):
            out[key] = _merge(values)
        else:
            out[key] = first
    if "hit_rate" in out and "prompt_tokens" in out and "cached_tokens" in out:
        out["hit_rate"] = out["cached_tokens"] / out["prompt_tokens"] if out["prompt_tokens"] else 0.0
    if "spec_acceptance_rate" in out:  # speculative decoding totals (SpecStats.to_dict): rates from the sums
        proposed, rows = out["spec_proposed_tokens"], out["spec_verify_rows"]
        out["spec_acceptance_rate"] = out["spec_accepted_tokens"] / proposed if proposed else 0.0
        out["spec_tokens_per_verify_row"] = sum(d["spec_tokens_per_verify_row"] * d["spec_verify_rows"]
                                                for d in dicts) / rows if rows else 0.0
    return out
