"""Unit tests for RadixCache: splits, insert ownership, LRU eviction, locks, counters, namespaces."""

from __future__ import annotations

import pytest
import torch

from radixlm.radix_cache import RadixCache


class FakeAllocator:
    """Slots 0..size-1; records every free, refuses double frees and frees of never-allocated slots."""

    def __init__(self, size: int = 64) -> None:
        self.free_set = set(range(size))
        self.freed_log: list[int] = []

    def alloc(self, n: int) -> torch.Tensor:
        picked = sorted(self.free_set)[:n]
        assert len(picked) == n, "fake pool exhausted"
        self.free_set -= set(picked)
        return torch.tensor(picked, dtype=torch.int64)

    def free(self, slots: torch.Tensor) -> None:
        for slot in slots.tolist():
            assert slot not in self.free_set, f"slot {slot} freed twice"
            self.free_set.add(slot)
            self.freed_log.append(slot)


@pytest.fixture
def pool() -> FakeAllocator:
    return FakeAllocator()


@pytest.fixture
def cache(pool: FakeAllocator) -> RadixCache:
    return RadixCache(pool.free)


def test_partial_match_splits_node_and_keeps_the_old_object_as_tail(cache, pool):
    slots = pool.alloc(4)
    cache.insert("", [1, 2, 3, 4], slots)
    leaf = cache.match_prefix("", [1, 2, 3, 4]).last_node
    match = cache.match_prefix("", [1, 2, 9])
    assert match.slots.tolist() == slots[:2].tolist()
    assert match.last_node.key == (1, 2) and match.last_node is not leaf
    # The old object is now the tail, so a holder of `leaf` still means the full 4-token path.
    assert leaf.key == (3, 4) and leaf.parent is match.last_node and leaf.slots.tolist() == slots[2:].tolist()
    again = cache.match_prefix("", [1, 2, 3, 4, 5])
    assert again.last_node is leaf and again.slots.tolist() == slots.tolist()
    assert cache.total_size() == 4 and pool.freed_log == []
    cache.check_integrity()


def test_split_of_a_locked_node_keeps_counters(cache, pool):
    cache.insert("", [1, 2, 3, 4], pool.alloc(4))
    leaf = cache.match_prefix("", [1, 2, 3, 4]).last_node
    cache.inc_lock_ref(leaf)
    head = cache.match_prefix("", [1, 2]).last_node
    assert head.lock_ref == 1 and cache.protected_size() == 4 and cache.evictable_size() == 0
    cache.check_integrity()
    cache.dec_lock_ref(leaf)
    assert head.lock_ref == 0 and cache.evictable_size() == 4
    cache.check_integrity()


def test_insert_returns_prefix_len_and_frees_only_duplicates(cache, pool):
    first = pool.alloc(3)
    assert cache.insert("", [1, 2, 3], first) == 0
    second = pool.alloc(5)
    assert cache.insert("", [1, 2, 3, 4, 5], second) == 3
    assert sorted(pool.freed_log) == sorted(second[:3].tolist())
    match = cache.match_prefix("", [1, 2, 3, 4, 5])
    assert match.slots.tolist() == first.tolist() + second[3:].tolist()
    assert cache.stats.duplicate_tokens_freed == 3
    cache.check_integrity()


def test_insert_does_not_free_the_trees_own_slots(cache, pool):
    cache.insert("", [1, 2, 3], pool.alloc(3))
    match = cache.match_prefix("", [1, 2, 3, 7, 8])
    cache.inc_lock_ref(match.last_node)
    own = torch.cat([match.slots, pool.alloc(2)])
    assert cache.insert("", [1, 2, 3, 7, 8], own) == 3
    assert pool.freed_log == []
    cache.dec_lock_ref(match.last_node)
    assert cache.match_prefix("", [1, 2, 3, 7, 8]).slots.tolist() == own.tolist()
    cache.check_integrity()


def test_insert_mixing_own_prefix_and_a_siblings_later_insert(cache, pool):
    cache.insert("", [1, 2], pool.alloc(2))
    match = cache.match_prefix("", [1, 2, 3, 4])
    mine = torch.cat([match.slots, pool.alloc(2)])
    sibling = torch.cat([match.slots, pool.alloc(1)])
    assert cache.insert("", [1, 2, 3], sibling) == 2  # a sibling cached token 3 first
    assert cache.insert("", [1, 2, 3, 4], mine) == 3
    assert pool.freed_log == [mine[2].item()]  # only my duplicate of token 3
    assert cache.match_prefix("", [1, 2, 3, 4]).slots.tolist() == sibling.tolist() + [mine[3].item()]
    cache.check_integrity()


def test_evict_frees_least_recently_used_leaves_first(cache, pool):
    a, b, c = pool.alloc(2), pool.alloc(2), pool.alloc(2)
    cache.insert("", [1, 1], a)
    cache.insert("", [2, 2], b)
    cache.insert("", [3, 3], c)
    cache.match_prefix("", [1, 1])  # a becomes the most recently used
    assert cache.evict(1) == 2  # whole nodes go: the LRU leaf is b
    assert pool.freed_log == b.tolist()
    assert cache.evict(3) == 4
    assert pool.freed_log == b.tolist() + c.tolist() + a.tolist()
    assert cache.total_size() == 0 and cache.stats.evicted_tokens == 6
    cache.check_integrity()


def test_evict_turns_parents_into_leaves_and_stops_when_enough(cache, pool):
    s3 = pool.alloc(3)
    cache.insert("", [1, 2, 3], s3)  # time 1
    s4 = pool.alloc(3)
    cache.insert("", [1, 2, 4], s4)  # time 2; splits: [1,2] (time 2) -> {[3] (time 1), [4] (time 2)}
    cache.insert("", [9], pool.alloc(1))  # time 3
    assert pool.freed_log == s4[:2].tolist()  # duplicates of [1,2]
    assert cache.evict(2) == 2  # [3] then [4]: one token each, then enough
    assert pool.freed_log[2:] == [s3[2].item(), s4[2].item()]
    # [1,2] became a leaf, last touched at time 2 < 3: it goes before [9], whole (2 tokens for 1 asked).
    assert cache.evict(1) == 2
    assert pool.freed_log[4:] == s3[:2].tolist()
    assert cache.total_size() == 1 and cache.match_prefix("", [9]).prefix_len == 1
    cache.check_integrity()


def test_locked_nodes_are_never_evicted(cache, pool):
    locked_slots = pool.alloc(3)
    cache.insert("", [1, 2, 3], locked_slots)
    cache.insert("", [1, 2, 5], pool.alloc(3))
    cache.insert("", [7, 7], pool.alloc(2))
    node = cache.match_prefix("", [1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    assert cache.protected_size() == 3 and cache.evictable_size() == 3
    assert cache.evict(100) == 3
    assert not set(locked_slots.tolist()) & set(pool.freed_log)
    assert cache.match_prefix("", [1, 2, 3]).slots.tolist() == locked_slots.tolist()
    cache.dec_lock_ref(node)
    assert cache.evictable_size() == 3 and cache.protected_size() == 0
    cache.check_integrity()


def test_counters_follow_locks_along_the_path(cache, pool):
    cache.insert("", [1, 2], pool.alloc(2))
    cache.insert("", [1, 2, 3, 4], pool.alloc(4))
    deep = cache.match_prefix("", [1, 2, 3, 4]).last_node
    shallow = cache.match_prefix("", [1, 2]).last_node
    cache.inc_lock_ref(deep)
    cache.inc_lock_ref(shallow)
    assert (cache.protected_size(), cache.evictable_size(), cache.total_size()) == (4, 0, 4)
    assert shallow.lock_ref == 2 and deep.lock_ref == 1
    cache.dec_lock_ref(deep)
    assert (cache.protected_size(), cache.evictable_size()) == (2, 2)
    cache.dec_lock_ref(shallow)
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(shallow)
    assert (cache.protected_size(), cache.evictable_size()) == (0, 4)
    cache.check_integrity()


def test_reset_refuses_while_locked_then_frees_everything(cache, pool):
    cache.insert("a", [1, 2], pool.alloc(2))
    cache.insert("", [3], pool.alloc(1))
    node = cache.match_prefix("a", [1, 2]).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(RuntimeError):
        cache.reset()
    assert cache.total_size() == 3
    cache.dec_lock_ref(node)
    cache.reset()
    assert cache.total_size() == 0 and len(pool.free_set) == 64 and cache.namespaces() == [""]
    with pytest.raises(ValueError):  # a handle from before the reset cannot lock anything
        cache.inc_lock_ref(node)
    cache.check_integrity()


def test_stale_handle_of_an_evicted_node_cannot_be_locked(cache, pool):
    cache.insert("", [1, 2], pool.alloc(2))
    node = cache.match_prefix("", [1, 2]).last_node
    cache.evict(2)
    with pytest.raises(ValueError):
        cache.inc_lock_ref(node)
    assert cache.protected_size() == 0
    cache.check_integrity()


def test_namespaces_never_share_and_empty_ones_are_pruned(cache, pool):
    a_slots = pool.alloc(3)
    cache.insert("a", [1, 2, 3], a_slots)
    assert cache.match_prefix("b", [1, 2, 3]).prefix_len == 0
    assert cache.match_prefix("", [1, 2, 3]).prefix_len == 0
    assert cache.insert("b", [1, 2, 3], pool.alloc(3)) == 0  # no duplicate across tenants
    assert cache.match_prefix("a", [1, 2, 3]).slots.tolist() == a_slots.tolist()
    unknown = cache.match_prefix("zzz", [1])
    assert unknown.prefix_len == 0 and unknown.last_node.is_root and "zzz" not in cache.namespaces()
    cache.inc_lock_ref(unknown.last_node)  # a bare root locks nothing
    assert cache.protected_size() == 0
    cache.evict(6)
    assert cache.namespaces() == [""]
    cache.check_integrity()


def test_cache_prefix_moves_the_lock_and_returns_the_trees_slots(cache, pool):
    # Two requests with the same first chunk, as in chunked prefill.
    root_a = cache.match_prefix("", [1, 2, 3, 4]).last_node
    root_b = cache.match_prefix("", [1, 2, 3, 4]).last_node
    cache.inc_lock_ref(root_a)
    cache.inc_lock_ref(root_b)
    slots_a, slots_b = pool.alloc(4), pool.alloc(4)
    got_a, node_a = cache.cache_prefix("", [1, 2, 3, 4], slots_a, root_a)
    assert got_a.tolist() == slots_a.tolist() and node_a.lock_ref == 1
    got_b, node_b = cache.cache_prefix("", [1, 2, 3, 4], slots_b, root_b)
    assert got_b.tolist() == slots_a.tolist() and node_b is node_a and node_a.lock_ref == 2
    assert sorted(pool.freed_log) == sorted(slots_b.tolist())
    assert cache.protected_size() == 4
    # The next chunk of request A: its first 4 slots are now the tree's own, so nothing is freed.
    more = torch.cat([got_a, pool.alloc(2)])
    _, node_a2 = cache.cache_prefix("", [1, 2, 3, 4, 5, 6], more, node_a)
    assert len(pool.freed_log) == 4 and node_a2.lock_ref == 1 and node_a.lock_ref == 2
    cache.dec_lock_ref(node_a2)
    cache.dec_lock_ref(node_b)
    assert cache.protected_size() == 0 and cache.evictable_size() == 6
    cache.check_integrity()


def test_disabled_cache_keeps_nothing(pool):
    cache = RadixCache(pool.free, disable=True)
    slots = pool.alloc(3)
    assert cache.insert("", [1, 2, 3], slots) == 0
    assert sorted(pool.freed_log) == slots.tolist()
    match = cache.match_prefix("", [1, 2, 3])
    assert match.prefix_len == 0 and match.last_node.is_root
    mine = pool.alloc(2)
    got, node = cache.cache_prefix("", [4, 5], mine, match.last_node)
    assert got is mine and node is match.last_node and len(pool.freed_log) == 3
    assert cache.total_size() == 0 and cache.evict(10) == 0
    cache.check_integrity()


def test_insert_rejects_mismatched_slots(cache, pool):
    with pytest.raises(ValueError):
        cache.insert("", [1, 2, 3], pool.alloc(2))


def test_all_slots_and_pretty_print(cache, pool):
    a, b = pool.alloc(2), pool.alloc(1)
    cache.insert("", [1, 2], a)
    cache.insert("t", [5], b)
    assert sorted(cache.all_slots().tolist()) == sorted(a.tolist() + b.tolist())
    text = cache.pretty_print()
    assert "namespace 't'" in text and "key=[1, 2]" in text


def _corruptions():
    def counter(c: RadixCache) -> None:
        c._evictable_size += 1

    def lock(c: RadixCache) -> None:
        c.match_prefix("", [1, 2, 3]).last_node.lock_ref = 1  # child locked, parent not

    def shared_slot(c: RadixCache) -> None:
        leaf = c.match_prefix("", [4]).last_node
        leaf.slots = c.match_prefix("", [1]).slots.clone()

    def empty_node(c: RadixCache) -> None:
        node = c.match_prefix("", [4]).last_node
        node.key, node.slots = (), node.slots[:0]

    return [counter, lock, shared_slot, empty_node]


@pytest.mark.parametrize("corrupt", _corruptions())
def test_check_integrity_detects_corruption(cache, pool, corrupt):
    cache.insert("", [1, 2, 3], pool.alloc(3))
    cache.insert("", [1, 2, 5], pool.alloc(3))
    cache.insert("", [4], pool.alloc(1))
    cache.check_integrity()
    corrupt(cache)
    with pytest.raises(AssertionError):
        cache.check_integrity()
