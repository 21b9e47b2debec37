"""The dashboard's snapshot of one scheduler: radix tree, KV pool, requests, counters (a plain dict).

Runs in the scheduler process (or the Engine's loop thread), between steps, only when asked (a
`dashboard_snapshot` ControlReq): never on the step path. Rate-limited here as well as by the asker: a
request within MIN_INTERVAL_S of the last build (or longer after a slow build: at most BUDGET of the
scheduler's time goes to builds) gets that build again. The tree is capped at MAX_NODES: the largest
subtrees are kept, the smallest folded into their parent's `folded_*` counts. Namespaces and token ids are
raw here; the HTTP process makes namespaces opaque and shows token text only to the admin key.
"""

from __future__ import annotations

import heapq
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.radix_cache.radix_cache import RadixCache
    from radixlm.radix_cache.tree_node import TreeNode
    from radixlm.runtime.scheduler.request import Req
    from radixlm.runtime.scheduler.scheduler import Scheduler

MAX_NODES = 400  # tree nodes per snapshot (the rest folded)
MAX_KEY_TOKENS = 48  # token ids kept per node (for the admin's hover text): its first ones
MIN_INTERVAL_S = 0.2  # at most 5 builds a second, however many viewers ask
# And at most this share of the scheduler's time: after a build that took t seconds, the next is built no
# sooner than t / BUDGET later (a huge tree is shown less often rather than slowing the steps down).
BUDGET = 0.005


class SnapshotBuilder:
    def __init__(self, min_interval_s: float = MIN_INTERVAL_S, max_nodes: int = MAX_NODES):
        self.min_interval_s = min_interval_s
        self.max_nodes = max_nodes
        self._last: dict[str, Any] | None = None
        self._last_at = float("-inf")
        self._interval = min_interval_s
        self.num_builds = 0
        self.build_seconds = 0.0  # total, so the cost per build can be reported (benchmarks/)

    def snapshot(self, scheduler: "Scheduler") -> dict[str, Any]:
        now = time.monotonic()
        if self._last is not None and now - self._last_at < self._interval:
            return self._last
        self._last = build_snapshot(scheduler, self.max_nodes)
        self._last_at = time.monotonic()
        took = self._last_at - now
        self._interval = max(self.min_interval_s, took / BUDGET)
        self.num_builds += 1
        self.build_seconds += took
        self._last["build_ms"] = 1000 * took
        return self._last


def build_snapshot(scheduler: "Scheduler", max_nodes: int = MAX_NODES) -> dict[str, Any]:
    kv, tree = scheduler.kv, scheduler.kv.tree
    size, free = kv.allocator.size, kv.allocator.num_free()
    evictable = tree.evictable_size() if tree else 0
    locked = tree.protected_size() if tree else 0
    now = time.monotonic()
    compiling = [r for r, _ in getattr(scheduler.grammar, "_pending", [])]  # grammar still compiling
    reqs = ([_req_view(r, "grammar") for r in compiling] + [_req_view(r, "queued") for r in scheduler.waiting] +
            [_req_view(r, "prefill" if r.remaining_prefill() > 1 else "decode") for r in scheduler.running])
    return {"pool": {"total": size, "free": free, "evictable": evictable, "locked": locked,
                     "used": size - free - evictable},
            "tree": tree_view(tree, max_nodes, now) if tree else {"nodes": [], "clock": 0},
            "requests": reqs,
            "counters": {"num_forward_steps": scheduler.num_forward_steps,
                         "num_computed_tokens": scheduler.num_computed_tokens,
                         **scheduler.stats.to_dict(),
                         "evicted_tokens": tree.stats.evicted_tokens if tree else 0,
                         "evicted_nodes": tree.stats.evicted_nodes if tree else 0}}


def _req_view(req: "Req", state: str) -> dict[str, Any]:
    return {"rid": req.rid, "ns": req.namespace, "state": state, "prompt": len(req.input_ids),
            "cached": req.cached_len if req.first_admitted else req.prefix_len, "kv": req.kv_len,
            "out": len(req.output_ids), "max_new": req.max_new_tokens, "retractions": req.num_retractions,
            "jump_forward": req.num_jump_forward_tokens}


def tree_view(tree: "RadixCache", max_nodes: int, now: float) -> dict[str, Any]:
    """The tree as a flat node list (parents before children); a root's children have parent -1."""
    sizes, counts = _subtree_sizes(tree)
    heap: list[tuple[int, int, "TreeNode", int]] = []  # (-subtree tokens, node id, node, parent's id)
    for ns in tree.namespaces():
        for child in tree.root(ns).children.values():
            heap.append((-sizes[child.node_id], child.node_id, child, -1))
    heapq.heapify(heap)
    nodes: list[dict[str, Any]] = []
    folded: dict[int, list[int]] = {}  # parent id -> [nodes, tokens, hits] folded into it
    while heap and len(nodes) < max_nodes:
        _, _, node, parent = heapq.heappop(heap)
        nodes.append({"id": node.node_id, "parent": parent, "ns": node.namespace, "len": len(node.key),
                      "hits": node.hit_count, "lock": node.lock_ref, "tick": node.last_access_time,
                      "age_s": round(max(0.0, now - node.last_access_s), 3),
                      "subtree": sizes[node.node_id], "tokens": list(node.key[:MAX_KEY_TOKENS])})
        for child in node.children.values():
            heapq.heappush(heap, (-sizes[child.node_id], child.node_id, child, node.node_id))
    for _, node_id, node, parent in heap:  # past the cap: the smallest subtrees, folded into their parent
        entry = folded.setdefault(parent, [0, 0, 0])
        entry[0] += counts[node_id]
        entry[1] += sizes[node_id]
        entry[2] += node.hit_count
    for view in nodes:
        f = folded.get(view["id"])
        if f:
            view["folded_nodes"], view["folded_tokens"], view["folded_hits"] = f
    return {"nodes": nodes, "clock": tree.clock, "num_nodes": len(sizes),
            "folded_at_root": folded.get(-1, [0])[0]}


def _subtree_sizes(tree: "RadixCache") -> tuple[dict[int, int], dict[int, int]]:
    """node id -> (tokens, nodes) in its subtree, itself included; one pass, no recursion."""
    order: list["TreeNode"] = []
    for ns in tree.namespaces():
        stack = list(tree.root(ns).children.values())
        while stack:  # parents before their descendants
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
    sizes = {n.node_id: len(n.key) for n in order}
    counts = dict.fromkeys(sizes, 1)
    for node in reversed(order):  # children before parents: add each finished subtree to its parent
        parent = node.parent
        if parent is not None and not parent.is_root:
            sizes[parent.node_id] += sizes[node.node_id]
            counts[parent.node_id] += counts[node.node_id]
    return sizes, counts
