"""Hypothesis state machine: RadixCache against a token-level reference model and a slot-tracking pool.

The model keeps one entry per cached token position, (namespace, token prefix) -> (slot, last touch),
with lock counts derived from the live "requests". After every step the tree must equal the model
token for token (slot, access time, lock count), every slot must be in exactly one place (free,
tree, or a request's uncached tail), and check_integrity() must pass. The pool asserts no slot is
freed twice and no locked slot is ever freed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.radix_cache import MatchResult, RadixCache, TreeNode

NAMESPACES = ["", "a", "b"]
POOL_SIZE = 24
MAX_KEY = 6
# Keys are cuts of a few shared sequences plus a random tail, so prefixes are shared (and nodes split)
# far more often than with independent random lists.
BASES = [(0, 1, 2, 3, 4, 0), (0, 1, 2, 4, 3, 1), (0, 1, 3, 0, 2, 2), (1, 0, 2, 3, 4, 4)]
keys = st.builds(
    lambda base, cut, tail: (list(base[:cut]) + tail)[:MAX_KEY] or [0],
    st.sampled_from(BASES),
    st.integers(0, MAX_KEY),
    st.lists(st.integers(0, 4), max_size=2),
)
namespaces = st.sampled_from(NAMESPACES)
TokenKey = tuple[str, tuple[int, ...]]


@dataclass(eq=False)  # identity: requests.remove must not compare tensors
class Request:
    namespace: str
    key: list[int]
    slots: torch.Tensor  # [len(key)]: [:cached_len] borrowed from the tree (locked), rest owned
    cached_len: int
    node: TreeNode


class Model:
    """Reference at token granularity: no compression, no splits, so nothing to get wrong."""

    def __init__(self) -> None:
        self.slot: dict[TokenKey, int] = {}
        self.time: dict[TokenKey, int] = {}
        self.clock = 0

    def _registered(self, namespace: str) -> bool:
        # The tree keeps a root for "" always, and for other namespaces only while they hold tokens.
        return namespace == "" or any(ns == namespace for ns, _ in self.slot)

    def match(self, namespace: str, key: list[int]) -> list[int]:
        if not self._registered(namespace):
            return []
        self.clock += 1
        out = []
        for i in range(1, len(key) + 1):
            tk = (namespace, tuple(key[:i]))
            if tk not in self.slot:
                break
            out.append(self.slot[tk])
            self.time[tk] = self.clock
        return out

    def insert(self, namespace: str, key: list[int], slots: list[int]) -> tuple[int, list[int]]:
        """Returns (prefix length already cached, caller slots that must be freed)."""
        if not key:
            return 0, []  # the tree does not even tick its clock for an empty key
        self.clock += 1
        prefix_len, freed = 0, []
        for i, slot in enumerate(slots):
            tk = (namespace, tuple(key[: i + 1]))
            if tk in self.slot:
                prefix_len += 1
                if self.slot[tk] != slot:
                    freed.append(slot)
            else:
                self.slot[tk] = slot
            self.time[tk] = self.clock
        return prefix_len, freed

    def eviction_order(self, locks: dict[TokenKey, int]) -> list[TokenKey]:
        """Every evictable token, in the order LRU leaf-first eviction must free them."""
        alive = set(self.slot)
        order = []
        while True:
            leaves = [
                tk for tk in alive
                if not locks.get(tk) and not any((tk[0], tk[1] + (t,)) in alive for t in range(5))
            ]
            if not leaves:
                return order
            times = sorted(self.time[tk] for tk in leaves)
            assert len(times) < 2 or times[0] < times[1], "model: two leaves share a time"
            oldest = min(leaves, key=lambda tk: self.time[tk])
            order.append(oldest)
            alive.remove(oldest)

    def remove(self, tks: list[TokenKey]) -> None:
        for tk in tks:
            del self.slot[tk], self.time[tk]


def tree_tokens(cache: RadixCache) -> dict[TokenKey, tuple[int, int, int]]:
    """(namespace, prefix) -> (slot, last_access_time, lock_ref) read off the real tree."""
    out = {}
    for namespace in cache.namespaces():
        stack: list[tuple[TreeNode, tuple[int, ...]]] = [(cache.root(namespace), ())]
        while stack:
            node, prefix = stack.pop()
            for child in node.children.values():
                path = prefix
                for token, slot in zip(child.key, child.slots.tolist()):
                    path = path + (token,)
                    out[(namespace, path)] = (slot, child.last_access_time, child.lock_ref)
                stack.append((child, path))
    return out


class RadixMachine(RuleBasedStateMachine):
    """Requests borrow matched prefixes (locked), own their uncached tails, then insert or abort."""

    def __init__(self) -> None:
        super().__init__()
        self.free: set[int] = set(range(POOL_SIZE))
        self.cache = RadixCache(self._free_slots)
        self.model = Model()
        self.requests: list[Request] = []

    # ---- the fake allocator --------------------------------------------------------------------

    def _alloc(self, n: int) -> torch.Tensor:
        picked = sorted(self.free)[:n]
        self.free -= set(picked)
        return torch.tensor(picked, dtype=torch.int64)

    def _free_slots(self, slots: torch.Tensor) -> None:
        locked = {s for r in self.requests for s in r.slots[: r.cached_len].tolist()}
        for slot in slots.tolist():
            assert slot not in self.free, f"slot {slot} freed twice"
            assert slot not in locked, f"locked slot {slot} freed"
            self.free.add(slot)

    def _locks(self) -> dict[TokenKey, int]:
        locks: dict[TokenKey, int] = {}
        for r in self.requests:
            for i in range(1, r.cached_len + 1):
                tk = (r.namespace, tuple(r.key[:i]))
                locks[tk] = locks.get(tk, 0) + 1
        return locks

    def _evict(self, num_tokens: int) -> int:
        expected = self.model.eviction_order(self._locks())
        freed = self.cache.evict(num_tokens)
        assert freed >= min(num_tokens, len(expected)), "evict stopped early"
        # Whole nodes go, so it may overshoot, but by less than the last node (<= MAX_KEY tokens).
        assert freed == 0 if num_tokens == 0 else freed < num_tokens + MAX_KEY
        self.model.remove(expected[:freed])  # LRU first: exactly the model's first `freed` tokens
        return freed

    def _check_match(self, namespace: str, key: list[int]) -> MatchResult:
        match = self.cache.match_prefix(namespace, key)
        assert match.slots.tolist() == self.model.match(namespace, key)
        assert match.last_node.depth_tokens() == match.prefix_len
        return match

    def _pick(self, index: int) -> Request:
        return self.requests.pop(index % len(self.requests))

    # ---- rules ---------------------------------------------------------------------------------

    @rule(namespace=namespaces, key=keys)
    def match(self, namespace: str, key: list[int]) -> None:
        self._check_match(namespace, key)

    @rule(namespace=namespaces, key=keys, verify=st.booleans())
    def insert_fresh(self, namespace: str, key: list[int], verify: bool) -> None:
        if len(key) > len(self.free):
            return
        slots = self._alloc(len(key))
        self._insert_and_verify(namespace, key, slots, verify)

    @rule(namespace=namespaces, key=keys)
    def start_request(self, namespace: str, key: list[int]) -> None:
        cached = self._check_match(namespace, key)
        node = cached.last_node
        self.cache.inc_lock_ref(node)
        request = Request(namespace, key, cached.slots, cached.prefix_len, node)
        self.requests.append(request)  # locked before evicting: eviction must spare it
        need = len(key) - cached.prefix_len
        if need > len(self.free):
            self._evict(need - len(self.free))
        if need > len(self.free):
            self.requests.remove(request)
            self.cache.dec_lock_ref(node)
            return
        request.slots = torch.cat([cached.slots, self._alloc(need)])

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100), verify=st.booleans())
    def finish_request(self, index: int, verify: bool) -> None:
        r = self._pick(index)
        self._insert_and_verify(r.namespace, r.key, r.slots, verify)
        self.cache.dec_lock_ref(r.node)

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100), data=st.data())
    def chunk_request(self, index: int, data: st.DataObject) -> None:
        r = self.requests[index % len(self.requests)]
        k = data.draw(st.integers(r.cached_len, len(r.key)))
        free_before = set(self.free)
        got, node = self.cache.cache_prefix(r.namespace, r.key[:k], r.slots[:k], r.node)
        _, freed = self.model.insert(r.namespace, r.key[:k], r.slots[:k].tolist())
        assert got.tolist() == self.model.match(r.namespace, r.key[:k])
        assert node.depth_tokens() == k and (k == 0 or node.lock_ref >= 1)
        assert self.free - free_before == set(freed)
        r.slots, r.cached_len, r.node = torch.cat([got, r.slots[k:]]), k, node

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100))
    def abort_request(self, index: int) -> None:
        r = self._pick(index)
        self.cache.dec_lock_ref(r.node)
        self._free_slots(r.slots[r.cached_len :])  # the engine frees what the request owns

    @rule(num_tokens=st.integers(0, 10))
    def evict(self, num_tokens: int) -> None:
        self._evict(num_tokens)

    @rule()
    def reset(self) -> None:
        if any(r.cached_len for r in self.requests):
            before = self.cache.total_size()
            try:
                self.cache.reset()
            except RuntimeError:
                assert self.cache.total_size() == before
                return
            raise AssertionError("reset succeeded while tokens were locked")
        self.cache.reset()
        self.model.remove(list(self.model.slot))

    def _insert_and_verify(
        self, namespace: str, key: list[int], slots: torch.Tensor, verify: bool
    ) -> None:
        free_before = set(self.free)
        prefix_len = self.cache.insert(namespace, key, slots)
        expected_prefix, expected_freed = self.model.insert(namespace, key, slots.tolist())
        assert prefix_len == expected_prefix
        assert self.free - free_before == set(expected_freed)
        # A match right after an insert returns the whole key: the tree's slots, ours after the prefix.
        # Only sometimes: the match re-touches the path, which would hide the insert's own LRU stamps.
        if verify:
            assert self._check_match(namespace, key).prefix_len == len(key)

    # ---- invariants ----------------------------------------------------------------------------

    @invariant()
    def tree_matches_model_and_slots_are_conserved(self) -> None:
        self.cache.check_integrity()
        locks = self._locks()
        expected = {tk: (s, self.model.time[tk], locks.get(tk, 0)) for tk, s in self.model.slot.items()}
        assert tree_tokens(self.cache) == expected, self.cache.pretty_print()
        assert self.cache.total_size() == len(expected)
        assert self.cache.protected_size() == len(locks)
        tree = self.cache.all_slots().tolist()
        owned = [s for r in self.requests for s in r.slots[r.cached_len :].tolist()]
        everything = sorted(list(self.free) + tree + owned)
        assert everything == list(range(POOL_SIZE)), "a slot is lost or in two places"


RadixMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestRadixStateMachine = RadixMachine.TestCase
