"""Scheduling policies: the order in which waiting requests are considered. Scheduler process.

Cache-aware policies (SGLang's): "lpm" serves the longest cached prefix first; "dfs-weight" walks the
radix tree visiting the subtrees with more waiting requests first, so requests that share a prefix run
back to back while it is cached. Cache-agnostic: "fcfs" (arrival), "lof" (largest max_new_tokens
first), "random" (seeded). Cache-aware policies fall back to fcfs when the tree is absent or disabled,
and when the queue is longer than `fcfs_threshold` (matching every request each step stops paying off).

Matching is done with match_prefix, which locks nothing: the `prefix_len` / `last_node` a cache-aware
policy writes on a request are hints valid until the tree next changes. The engine must match again
and lock at admission (a hint's node may be split or evicted in between).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from radixlm.radix_cache import RadixCache, TreeNode

POLICY_NAMES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
CACHE_AWARE = frozenset({"lpm", "dfs-weight"})
# SGLang's cut-off: beyond this many waiting requests, prefix matching costs more than it saves.
DEFAULT_FCFS_THRESHOLD = 128


class WaitingLike(Protocol):
    """What a policy needs from a waiting request (the scheduler's Req satisfies it)."""

    namespace: str
    input_ids: list[int]
    output_ids: list[int]  # non-empty for retracted requests: the cache key is input + output
    max_new_tokens: int
    arrival: int  # monotonic admission counter; ties in every policy break by it
    prefix_len: int  # written by cache-aware policies
    last_node: TreeNode | None  # written by cache-aware policies


class SchedulePolicy:
    """Orders the waiting queue; `order` returns a new list and never locks anything."""

    def __init__(
        self,
        name: str,
        tree: RadixCache | None,
        fcfs_threshold: int = DEFAULT_FCFS_THRESHOLD,
        seed: int = 0,
    ) -> None:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown schedule policy {name!r}; valid: {', '.join(POLICY_NAMES)}")
        self.name = name
        self.tree = tree
        self.fcfs_threshold = fcfs_threshold
        self._rng = random.Random(seed)
        self._sorters: dict[str, Callable[[list[WaitingLike]], list[WaitingLike]]] = {
            "lpm": self._lpm,
            "dfs-weight": self._dfs_weight,
            "fcfs": _fcfs,
            "lof": _lof,
            "random": self._random,
        }

    def active_policy(self, num_waiting: int) -> str:
        """The policy actually used for a queue of this length (after the fcfs fallbacks)."""
        if self.name in CACHE_AWARE:
            if self.tree is None or self.tree.disable or num_waiting > self.fcfs_threshold:
                return "fcfs"
        return self.name

    def order(self, waiting: list[WaitingLike]) -> list[WaitingLike]:
        return self._sorters[self.active_policy(len(waiting))](list(waiting))

    # ---- cache-aware ---------------------------------------------------------------------------

    def _match_all(self, waiting: list[WaitingLike]) -> None:
        assert self.tree is not None
        for req in waiting:
            match = self.tree.match_prefix(req.namespace, [*req.input_ids, *req.output_ids])
            req.prefix_len = match.prefix_len
            req.last_node = match.last_node

    def _lpm(self, waiting: list[WaitingLike]) -> list[WaitingLike]:
        self._match_all(waiting)
        return sorted(waiting, key=lambda r: (-r.prefix_len, r.arrival))

    def _dfs_weight(self, waiting: list[WaitingLike]) -> list[WaitingLike]:
        """SGLang's dfs-weight: weight(node) = waiting requests ending at or below it; post-order DFS
        visiting heavier children first (ties: sibling insertion order); a node's own requests come
        after its subtree's. Namespace roots are ordered the same way."""
        assert self.tree is not None
        # Match everything first: a later match may split a node, which leaves earlier last_nodes
        # valid (the split keeps the old object as the deeper part) but must happen before the walk.
        self._match_all(waiting)
        by_node: dict[TreeNode, list[WaitingLike]] = {}
        weight: dict[TreeNode, int] = {}
        for req in sorted(waiting, key=lambda r: r.arrival):
            assert req.last_node is not None
            by_node.setdefault(req.last_node, []).append(req)
            node: TreeNode | None = req.last_node
            while node is not None:
                weight[node] = weight.get(node, 0) + 1
                node = node.parent
        roots = [self.tree.root(ns) for ns in self.tree.namespaces()]
        ordered = _heavier_first([r for r in roots if r is not None], weight)
        out: list[WaitingLike] = []
        for root in ordered:
            out.extend(_post_order(root, weight, by_node))
        # Requests whose last_node hangs off no registered root (a namespace the tree has never
        # seen gets a detached root) were not reached by the walk: they keep arrival order.
        emitted = {id(r) for r in out}
        out.extend(r for r in sorted(waiting, key=lambda r: r.arrival) if id(r) not in emitted)
        return out

    # ---- cache-agnostic ------------------------------------------------------------------------

    def _random(self, waiting: list[WaitingLike]) -> list[WaitingLike]:
        self._rng.shuffle(waiting)
        return waiting


def _fcfs(waiting: list[WaitingLike]) -> list[WaitingLike]:
    return sorted(waiting, key=lambda r: r.arrival)


def _lof(waiting: list[WaitingLike]) -> list[WaitingLike]:
    return sorted(waiting, key=lambda r: (-r.max_new_tokens, r.arrival))


def _heavier_first(nodes: list[TreeNode], weight: dict[TreeNode, int]) -> list[TreeNode]:
    # Stable sort: equal weights keep insertion order. Zero-weight subtrees hold no request: skip.
    return sorted((n for n in nodes if weight.get(n, 0) > 0), key=lambda n: -weight[n])


def _post_order(
    root: TreeNode, weight: dict[TreeNode, int], by_node: dict[TreeNode, list[WaitingLike]]
) -> list[WaitingLike]:
    """Iterative post-order over weighted nodes (radix chains can exceed the recursion limit)."""
    out: list[WaitingLike] = []
    stack: list[tuple[TreeNode, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.extend(by_node.get(node, []))
            continue
        stack.append((node, True))
        # Reversed so the heaviest child is popped (visited) first.
        stack.extend((c, False) for c in reversed(_heavier_first(list(node.children.values()), weight)))
    return out
