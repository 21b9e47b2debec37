"""RadixCache: (namespace, token ids) -> KV slots, with lock refs and LRU eviction. Scheduler process.

Ownership (the invariant everything else protects): every KV slot is in exactly one place, the
allocator's free list, one tree node, or a running request. `insert` transfers a request's slots to
the tree (freeing the ones that duplicate what the tree already holds); `evict` and `reset` hand tree
slots back through `free_slots`. A request that uses matched slots borrows them and must hold a lock.

Counters: evictable_size + protected_size == total_size == tokens held by non-root nodes; a node's
tokens are protected iff its lock_ref > 0. Times come from a logical clock (one tick per match or
insert), never the wall clock, so eviction order is deterministic.

Prompt logprobs ride along (token_logprobs.py): `insert` keeps a request's computed entries on the nodes it
creates and fills in the unknown entries of the nodes it passes; `cached_logprobs` tells a request that wants
prompt logprobs how much of its prompt the tree can answer, KV and logprobs both.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from radixlm.radix_cache.token_logprobs import CachedLogprobs, TokenLogprobs, known_or_none
from radixlm.radix_cache.tree_node import (
    MatchResult,
    RadixStats,
    TreeNode,
    check_node,
    common_prefix_len,
    format_subtree,
    split_node,
    subtree,
)

DEFAULT_NAMESPACE = ""
DEFAULT_LOGPROB_TOP_K = 5  # top-k alternatives kept per cached token (requests asking for more recompute)


class RadixCache:
    """Radix tree over token ids, one root per namespace; a match never crosses namespaces."""

    def __init__(
        self,
        free_slots: Callable[[torch.Tensor], None],
        disable: bool = False,
        device: torch.device | str = "cpu",
        logprob_top_k: int = DEFAULT_LOGPROB_TOP_K,
    ) -> None:
        self.free_slots = free_slots
        self.logprob_top_k = logprob_top_k
        self.disable = disable
        self.device = torch.device(device)
        self.stats = RadixStats()
        self._clock = 0
        self._roots: dict[str, TreeNode] = {}
        self._evictable_size = 0
        self._protected_size = 0
        self._clear()

    def match_prefix(self, namespace: str, token_ids: Sequence[int]) -> MatchResult:
        """Longest cached prefix of token_ids in `namespace`; splits a node on a partial match.

        Touches the matched path (LRU); changes no lock and no counter, so it is safe to call
        repeatedly (the scheduling policy does, every step). An unknown namespace yields a fresh
        detached root: locking it is a no-op, and match never registers namespaces (no leak).
        """
        if self.disable:
            return MatchResult(self._empty(), self._roots[DEFAULT_NAMESPACE])
        root = self._roots.get(namespace)
        if root is None:
            return MatchResult(self._empty(), TreeNode.new_root(namespace, self.device))
        node, path, _ = self._walk(root, tuple(map(int, token_ids)), self._tick())
        slots = torch.cat([n.slots for n in path]) if path else self._empty()
        return MatchResult(slots, node)

    def cached_logprobs(self, namespace: str, token_ids: Sequence[int], start: int, top_k: int
                        ) -> CachedLogprobs | None:
        """For a request that wants the logprobs of prompt tokens (start, len(token_ids)): the longest prefix
        [0, m) whose KV it may reuse because the tree also knows the logprobs of tokens (start, m] (token m's
        comes from the logits at m - 1, so it must be on the tree path too), with those logprobs; None when
        that is no longer than start (then the request computes from start, as without this). Read-only: no
        split, no touch. top_k: the alternatives the request wants (more than the tree keeps: None)."""
        root = self._roots.get(namespace)
        if self.disable or root is None or top_k > self.logprob_top_k or start < 0:
            return None
        key = tuple(map(int, token_ids))
        pieces: list[TokenLogprobs] = []
        node, pos = root, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            matched = common_prefix_len(child.key, key, pos)
            if child.logprobs is None and pos + matched > start + 1:  # nothing known past start + 1 here
                pieces.append(TokenLogprobs.unknown(max(0, start + 1 - pos), self.logprob_top_k))
                pos = max(pos, start + 1)
                break
            pieces.append(child.logprobs.slice(0, matched) if child.logprobs is not None
                          else TokenLogprobs.unknown(matched, self.logprob_top_k))
            node, pos = child, pos + matched
            if matched < len(child.key):
                break
        return _usable(pieces, start)

    def evictable_size(self) -> int:  # unlocked tokens: free capacity the pool may reclaim
        return self._evictable_size

    def protected_size(self) -> int:  # tokens under a lock
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def all_slots(self) -> torch.Tensor:
        """Every slot the tree holds (int64 [total_size]), for the engine's pool-wide check."""
        pieces = [node.slots for node in self._nodes()]
        return torch.cat(pieces) if pieces else self._empty()

    def namespaces(self) -> list[str]:
        return list(self._roots)

    def root(self, namespace: str = DEFAULT_NAMESPACE) -> TreeNode | None:
        """The registered root of `namespace` (None if it holds nothing); used by dfs-weight."""
        return self._roots.get(namespace)

    # ---- mutation ------------------------------------------------------------------------------

    def insert(self, namespace: str, token_ids: Sequence[int], slots: torch.Tensor,
               logprobs: TokenLogprobs | None = None) -> int:
        """Add token_ids -> slots; return how many leading tokens the tree already held.

        For those leading positions the caller's slot is freed unless it is the very slot the tree
        holds there (a request's own matched prefix). Afterwards the tree owns every position.
        logprobs (one entry per token, NaN = unknown): kept on the new node, and filling the unknown
        entries of the nodes already there (a prefix cached without logprobs learns them).
        Disabled cache: nothing is kept, so every caller slot is freed and 0 is returned.
        """
        key = tuple(map(int, token_ids))
        if slots.shape != (len(key),):
            raise ValueError(f"slots shape {tuple(slots.shape)} != ({len(key)},) for the key")
        slots = slots.to(torch.int64)
        if self.disable:
            if slots.numel():
                self.free_slots(slots)
            return 0
        if not key:
            return 0
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = TreeNode.new_root(namespace, self.device)
        now = self._tick()
        node, path, prefix_len = self._walk(root, key, now)
        if prefix_len:
            self._free_duplicates(slots[:prefix_len], torch.cat([n.slots for n in path]))
            if logprobs is not None:
                _fill_path(path, logprobs)
        if prefix_len < len(key):
            leaf = self._add_leaf(node, key[prefix_len:], slots[prefix_len:].clone(), now)
            if logprobs is not None:
                leaf.logprobs = known_or_none(logprobs.slice(prefix_len, len(key)))
        return prefix_len

    def cache_prefix(
        self, namespace: str, token_ids: Sequence[int], slots: torch.Tensor, old_node: TreeNode,
        logprobs: TokenLogprobs | None = None,
    ) -> tuple[torch.Tensor, TreeNode]:
        """Chunked prefill: insert a request's computed prefix and move its lock to the new node.

        Returns (the tree's slots for the prefix, which the request must use from now on since its
        duplicates were freed, the new locked node). Disabled cache: nothing changes.
        """
        if self.disable:
            return slots, old_node
        self.insert(namespace, token_ids, slots, logprobs)
        match = self.match_prefix(namespace, token_ids)
        # Nothing can evict between the insert and the match, so the whole prefix is there.
        if match.prefix_len != len(token_ids):
            raise RuntimeError("cache_prefix: prefix vanished between insert and match")
        # Lock the new node before unlocking the old one so shared ancestors never touch 0.
        self.inc_lock_ref(match.last_node)
        self.dec_lock_ref(old_node)
        return match.slots, match.last_node

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock node and its ancestors; tokens move evictable -> protected when a ref goes 0 -> 1."""
        path = self._path_to_root(node)
        for cur in path:
            if cur.lock_ref == 0:
                self._evictable_size -= len(cur.key)
                self._protected_size += len(cur.key)
            cur.lock_ref += 1

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one inc_lock_ref(node); tokens move back to evictable when a ref goes 1 -> 0."""
        path = self._path_to_root(node)
        if any(cur.lock_ref <= 0 for cur in path):
            raise RuntimeError(f"dec_lock_ref on an unlocked path at {node!r}")
        for cur in path:
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self._protected_size -= len(cur.key)
                self._evictable_size += len(cur.key)

    def record_hit(self, node: TreeNode) -> None:
        """A request was admitted with a cached prefix ending at `node`: count a hit on its path (display
        and statistics only; nothing else reads hit_count)."""
        cur: TreeNode | None = node
        while cur is not None and not cur.is_root:
            cur.hit_count += 1
            cur = cur.parent

    @property
    def clock(self) -> int:
        """The logical clock's current tick (a node's age in ticks is clock - last_access_time)."""
        return self._clock

    def evict(self, num_tokens: int) -> int:
        """Free least-recently-used unlocked leaves until num_tokens are freed; return tokens freed.

        Whole nodes go (it may free a little more than asked). A parent whose last child goes joins
        the heap; parents are never older than children, so nodes leave in LRU order.
        """
        heap = [(n.last_access_time, n.node_id, n) for n in self._nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            freed += self._delete_leaf(node)
            assert parent is not None
            if not parent.is_root and self._evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access_time, parent.node_id, parent))
        return freed

    def reset(self) -> None:
        """Free every slot the tree holds and forget every namespace; refuses while anything is locked."""
        if self._protected_size:
            raise RuntimeError(f"reset with {self._protected_size} locked tokens in the radix tree")
        slots = self.all_slots()
        self._clear()
        self.stats.resets += 1
        if slots.numel():
            self.free_slots(slots)

    def check_integrity(self) -> None:
        """Recompute every counter from scratch and check the invariants; AssertionError if broken."""
        assert DEFAULT_NAMESPACE in self._roots, "default namespace root missing"
        evictable = protected = 0
        seen: list[torch.Tensor] = []
        for namespace, root in self._roots.items():
            assert root.is_root and root.parent is None and not root.key, f"bad root for {namespace!r}"
            assert root.namespace == namespace and root.lock_ref == 0, f"bad root state {root!r}"
            # Empty non-default roots are pruned so tenants that come and go do not leak roots.
            assert namespace == DEFAULT_NAMESPACE or root.children, f"empty root {namespace!r} kept"
            for node in subtree(root):
                check_node(node, namespace)
                seen.append(node.slots)
                if node.lock_ref:
                    protected += len(node.key)
                else:
                    evictable += len(node.key)
        assert evictable == self._evictable_size, f"evictable {self._evictable_size} != {evictable}"
        assert protected == self._protected_size, f"protected {self._protected_size} != {protected}"
        slots = torch.cat(seen) if seen else self._empty()
        assert slots.unique().numel() == slots.numel(), "a KV slot is held by two tree positions"

    def pretty_print(self) -> str:
        return "\n".join(line for root in self._roots.values() for line in format_subtree(root))

    # ---- internals -----------------------------------------------------------------------------

    def _clear(self) -> None:
        self._roots = {DEFAULT_NAMESPACE: TreeNode.new_root(DEFAULT_NAMESPACE, self.device)}
        self._evictable_size = 0
        self._protected_size = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    def _walk(
        self, root: TreeNode, key: tuple[int, ...], now: int
    ) -> tuple[TreeNode, list[TreeNode], int]:
        """Follow key from root, splitting where it ends mid-node; touch the path with `now`.

        Returns (last node on the matched path, the path's nodes in order, matched length).
        """
        node, pos = root, 0
        path: list[TreeNode] = []
        wall = time.monotonic()  # display only (dashboard); eviction uses the logical time
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            matched = common_prefix_len(child.key, key, pos)
            if matched < len(child.key):
                child = split_node(child, matched)
            child.last_access_time = now
            child.last_access_s = wall
            path.append(child)
            # After a split the next token differs from the tail's first token, so the loop ends.
            node, pos = child, pos + matched
        return node, path, pos

    def _add_leaf(
        self, parent: TreeNode, key: tuple[int, ...], slots: torch.Tensor, now: int
    ) -> TreeNode:
        leaf = TreeNode(parent.namespace, key, slots, parent, now)
        parent.children[key[0]] = leaf
        self._evictable_size += len(key)
        self.stats.inserted_tokens += len(key)
        return leaf

    def _free_duplicates(self, caller_slots: torch.Tensor, tree_slots: torch.Tensor) -> None:
        # A caller slot equal to the tree's slot is the tree's own (a matched prefix): keep it.
        dup = caller_slots[caller_slots != tree_slots.to(caller_slots.device)]
        if dup.numel():
            self.stats.duplicate_tokens_freed += int(dup.numel())
            self.free_slots(dup)

    def _delete_leaf(self, node: TreeNode) -> int:
        parent = node.parent
        assert parent is not None and not node.children and node.lock_ref == 0
        del parent.children[node.key[0]]
        node.parent = None  # detached: _path_to_root refuses it, so a stale handle cannot lock
        self._evictable_size -= len(node.key)
        self.stats.evicted_tokens += len(node.key)
        self.stats.evicted_nodes += 1
        if parent.is_root and not parent.children and parent.namespace != DEFAULT_NAMESPACE:
            del self._roots[parent.namespace]
        self.free_slots(node.slots)
        return len(node.key)

    @staticmethod
    def _evictable_leaf(node: TreeNode) -> bool:
        return not node.is_root and not node.children and node.lock_ref == 0

    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """Non-root nodes from node up to its root; raises if node is no longer in this tree."""
        path, cur = [], node
        while not cur.is_root:
            path.append(cur)
            if cur.parent is None:
                raise ValueError(f"{node!r} was evicted; match_prefix again before locking")
            cur = cur.parent
        # A stale handle from before reset() hangs off a discarded root: locking it would count
        # tokens the tree no longer holds. (A bare root, e.g. an unknown namespace's, locks nothing.)
        if path and self._roots.get(cur.namespace) is not cur:
            raise ValueError(f"{node!r} is not in the tree (reset?); match_prefix again")
        return path

    def _nodes(self) -> Iterator[TreeNode]:
        for root in self._roots.values():
            yield from subtree(root)


def _fill_path(path: list[TreeNode], logprobs: TokenLogprobs) -> None:
    """Give each node of a matched path the known entries it lacks (entries of one path: same values)."""
    pos = 0
    for node in path:
        piece = logprobs.slice(pos, pos + len(node.key))
        pos += len(node.key)
        if node.logprobs is None:
            node.logprobs = known_or_none(piece)
        else:
            node.logprobs.fill_unknown(piece)


def _usable(pieces: list[TokenLogprobs], start: int) -> CachedLogprobs | None:
    """The longest m with tokens (start, m] known, m < the tokens found (see cached_logprobs)."""
    if not pieces:
        return None
    found = TokenLogprobs.cat(pieces)
    unknown = (~found.known()[start + 1 :]).nonzero()
    end = start + 1 + (int(unknown[0]) if unknown.numel() else len(found) - start - 1)  # first unknown token
    length = end - 1
    if length <= start:
        return None
    return CachedLogprobs(length, found.slice(start + 1, end))
