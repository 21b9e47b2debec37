"""Which replica gets a request: cache-aware (approximate radix tree per replica) or round-robin.

The one policy of both data-parallel front ends: the standalone router (radixlm/router, keys are the
prompt's characters: it does not tokenize) and a server's `--dp-size` dispatcher
(runtime/server/dp_dispatch.py, keys are token ids). Runs in whichever process routes. The router never
sees the replicas' real caches; it remembers what it sent where. Each replica has a RadixCache over the
request's routing key with dummy (unique, never used) slots and LRU eviction past `max_tree_chars`, so a
replica's tree approximates what its real radix cache holds. Namespaces are the tenants (the API key),
as on the replicas, where a match never crosses tenants.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from radixlm.radix_cache.radix_cache import RadixCache


@dataclass(frozen=True)
class PolicyConfig:
    worker_urls: tuple[str, ...]  # the replicas (the dp dispatcher names its ranks dp0, dp1, ...)
    policy: str = "cache_aware"  # cache_aware | round_robin
    # Route by cache only when the best replica already holds this share of the key (SGLang's default).
    cache_threshold: float = 0.5
    # Load is "uneven" when the busiest replica has more than abs in-flight requests over the idlest
    # and more than rel times as many; then the idlest replica wins regardless of cache.
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    max_tree_chars: int = 1 << 21  # per replica, approximate tree size (keys) before LRU eviction


@dataclass(frozen=True)
class RouteKey:
    namespace: str  # tenant: replicas never share cache across tenants
    ids: tuple[int, ...]  # characters (ord) of the prompt text, or token ids prefixed by a marker


@dataclass
class Replica:
    url: str
    tree: RadixCache = field(repr=False)
    healthy: bool = True
    load: int = 0  # requests in flight through this router
    num_routed: int = 0
    num_failures: int = 0
    next_slot: int = 0  # dummy slot ids, unique per tree so its integrity check still holds


def new_tree() -> RadixCache:
    return RadixCache(free_slots=lambda slots: None)  # dummy slots: nothing to free


class Policy:
    """Pick a replica for a key, and remember that the replica now holds the key's prefix."""

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.replicas = [Replica(url.rstrip("/"), new_tree()) for url in config.worker_urls]
        self._rr = itertools.count()
        if config.policy not in ("cache_aware", "round_robin"):
            raise ValueError(f"policy must be cache_aware or round_robin; got {config.policy!r}")

    def healthy(self, exclude: frozenset[str] = frozenset()) -> list[Replica]:
        return [r for r in self.replicas if r.healthy and r.url not in exclude]

    def choose(self, key: RouteKey, exclude: frozenset[str] = frozenset()) -> Replica | None:
        """The replica for this request (None when no healthy one is left); records the key there."""
        candidates = self.healthy(exclude)
        if not candidates:
            return None
        if self.config.policy == "round_robin":
            chosen = candidates[next(self._rr) % len(candidates)]
        else:
            chosen = self._cache_aware(key, candidates)
        self.record(chosen, key)
        return chosen

    def _cache_aware(self, key: RouteKey, candidates: list[Replica]) -> Replica:
        c = self.config
        loads = [r.load for r in candidates]
        if max(loads) - min(loads) > c.balance_abs_threshold and max(loads) > c.balance_rel_threshold * min(loads):
            return min(candidates, key=lambda r: r.load)
        matched = [len(r.tree.match_prefix(key.namespace, key.ids).slots) for r in candidates]
        best = max(range(len(candidates)), key=lambda i: (matched[i], -candidates[i].load))
        if key.ids and matched[best] / len(key.ids) >= c.cache_threshold:
            return candidates[best]
        # Nobody holds enough of it: start it where the (approximate) cache is emptiest, then least loaded.
        return min(candidates, key=lambda r: (r.tree.total_size(), r.load))

    def record(self, replica: Replica, key: RouteKey) -> None:
        replica.num_routed += 1
        if not key.ids:
            return
        slots = torch.arange(replica.next_slot, replica.next_slot + len(key.ids), dtype=torch.int64)
        replica.next_slot += len(key.ids)
        replica.tree.insert(key.namespace, key.ids, slots)
        excess = replica.tree.total_size() - self.config.max_tree_chars
        if excess > 0:
            replica.tree.evict(excess)

    def mark(self, replica: Replica, healthy: bool) -> None:
        """Health change; a replica that comes back has lost (or may have lost) its cache."""
        if healthy and not replica.healthy:
            replica.tree = new_tree()
        replica.healthy = healthy

    def forget(self) -> None:
        """After the replicas' caches were flushed."""
        for r in self.replicas:
            r.tree = new_tree()
