"""The prompt logprobs kept beside the radix tree's KV: insert keeps and fills them, splits cut them with the
node, eviction drops them with it, and cached_logprobs answers only what is known on the request's own path."""

from __future__ import annotations

import math

import torch

from radixlm.radix_cache import RadixCache
from radixlm.radix_cache.token_logprobs import TokenLogprobs

K = 2


class FakeAllocator:
    """Fresh slots on every alloc; a free of a slot not handed out (or freed twice) fails the test."""

    def __init__(self) -> None:
        self.next, self.held = 0, set()

    def alloc(self, n: int) -> torch.Tensor:
        slots = list(range(self.next, self.next + n))
        self.next += n
        self.held.update(slots)
        return torch.tensor(slots, dtype=torch.int64)

    def free(self, slots: torch.Tensor) -> None:
        for slot in slots.tolist():
            self.held.remove(slot)


def entries(n: int, known: range | None = None, base: float = 0.0) -> TokenLogprobs:
    """n entries; token i's logprob is -(base + i) and its top-k ids 10 * i, 10 * i + 1 (known ones only)."""
    out = TokenLogprobs.unknown(n, K)
    for i in known if known is not None else range(1, n):
        out.put(i, torch.tensor([-(base + i)]), torch.tensor([[-0.5, -1.5]]), torch.tensor([[10 * i, 10 * i + 1]]))
    return out


def make(pool: FakeAllocator) -> RadixCache:
    return RadixCache(pool.free, logprob_top_k=K)


def insert(cache: RadixCache, pool: FakeAllocator, ids: list[int], logprobs: TokenLogprobs | None) -> None:
    cache.insert("", ids, pool.alloc(len(ids)), logprobs)


def values(found) -> list[float]:
    return found.logprobs.values.tolist()


def test_a_prefix_with_known_logprobs_is_reused_up_to_the_last_known_token():
    pool = FakeAllocator()
    cache = make(pool)
    insert(cache, pool, [1, 2, 3, 4, 5, 6], entries(6))
    # Same prefix, then a new token: KV of tokens [0, 5) reused; token 5's logprob (from position 4) is known.
    found = cache.cached_logprobs("", [1, 2, 3, 4, 5, 6, 9, 9], start=0, top_k=K)
    assert found.length == 5 and values(found) == [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert found.logprobs.top_ids[:, 0].tolist() == [10, 20, 30, 40, 50]
    # A prompt that diverges at token 4: token 4 is not on the tree path, so only [0, 3) is reused.
    found = cache.cached_logprobs("", [1, 2, 3, 7, 8], start=0, top_k=K)
    assert found.length == 2 and values(found) == [-1.0, -2.0]
    # A later logprob start needs only the tokens after it.
    found = cache.cached_logprobs("", [1, 2, 3, 4, 5, 6, 9], start=3, top_k=K)
    assert found.length == 5 and values(found) == [-4.0, -5.0]
    cache.check_integrity()


def test_nothing_is_reused_when_logprobs_are_unknown_or_more_alternatives_are_asked():
    pool = FakeAllocator()
    cache = make(pool)
    insert(cache, pool, [1, 2, 3, 4], None)  # computed without logprobs
    assert cache.root().children[1].logprobs is None  # and holds no arrays
    assert cache.cached_logprobs("", [1, 2, 3, 4, 5], start=0, top_k=K) is None
    insert(cache, pool, [5, 6, 7, 8], entries(4))
    assert cache.cached_logprobs("", [5, 6, 7, 8, 9], start=0, top_k=K + 1) is None
    assert cache.cached_logprobs("", [5, 6, 7, 8, 9], start=0, top_k=K).length == 3
    assert cache.cached_logprobs("other-tenant", [5, 6, 7, 8, 9], start=0, top_k=K) is None


def test_partial_knowledge_stops_the_reuse_at_the_first_unknown_token():
    pool = FakeAllocator()
    cache = make(pool)
    insert(cache, pool, [1, 2, 3, 4, 5, 6], entries(6, known=range(1, 3)))  # tokens 1, 2 known; 3..5 not
    found = cache.cached_logprobs("", [1, 2, 3, 4, 5, 6, 7], start=0, top_k=K)
    assert found.length == 2 and values(found) == [-1.0, -2.0]
    # From start 2 (or 3) on, the first token needed (3, or 4) is unknown: nothing beyond the start to reuse.
    assert cache.cached_logprobs("", [1, 2, 3, 4, 5, 6, 7], start=2, top_k=K) is None
    assert cache.cached_logprobs("", [1, 2, 3, 4, 5, 6, 7], start=3, top_k=K) is None


def test_an_insert_fills_unknown_entries_of_existing_nodes_and_keeps_known_ones():
    pool = FakeAllocator()
    cache = make(pool)
    insert(cache, pool, [1, 2, 3, 4], entries(4, known=range(1, 2), base=100.0))  # token 1: -101
    insert(cache, pool, [1, 2, 3, 4, 5], entries(5))  # same path computed again: fills tokens 2, 3 and adds 4
    node = cache.root().children[1]
    assert node.logprobs.values[1:].tolist() == [-101.0, -2.0, -3.0]
    found = cache.cached_logprobs("", [1, 2, 3, 4, 5, 6], start=0, top_k=K)
    assert found.length == 4 and values(found) == [-101.0, -2.0, -3.0, -4.0]
    assert cache.stats.duplicate_tokens_freed == 4
    cache.check_integrity()


def test_a_split_cuts_the_entries_with_the_node():
    pool = FakeAllocator()
    cache = make(pool)
    insert(cache, pool, [1, 2, 3, 4, 5], entries(5))
    insert(cache, pool, [1, 2, 9], None)  # splits [1..5] after 2 tokens
    head = cache.root().children[1]
    tail = head.children[3]
    assert head.key == (1, 2) and head.logprobs.values.tolist()[1:] == [-1.0]
    assert math.isnan(head.logprobs.values[0])
    assert tail.key == (3, 4, 5) and tail.logprobs.values.tolist() == [-2.0, -3.0, -4.0]
    assert tail.logprobs.top_ids[:, 1].tolist() == [21, 31, 41]
    assert head.children[9].logprobs is None
    found = cache.cached_logprobs("", [1, 2, 3, 4, 5, 6], start=0, top_k=K)
    assert found.length == 4 and values(found) == [-1.0, -2.0, -3.0, -4.0]
    # The branch without logprobs: token 2 (known on the shared head) is the last reusable one.
    assert cache.cached_logprobs("", [1, 2, 9, 9], start=0, top_k=K).length == 1
    cache.check_integrity()


def test_eviction_drops_the_entries_with_the_node():
    pool = FakeAllocator()
    cache = make(pool)
    insert(cache, pool, [1, 2, 3], entries(3))
    insert(cache, pool, [1, 2, 7, 8], entries(4, base=50.0))
    leaf = cache.root().children[1].children[3]
    cache.evict(1)  # the least recently used leaf: [3]
    assert leaf.parent is None and 3 not in cache.root().children[1].children
    assert cache.cached_logprobs("", [1, 2, 3, 4], start=0, top_k=K).length == 1
    found = cache.cached_logprobs("", [1, 2, 7, 8, 9], start=0, top_k=K)
    assert values(found) == [-1.0, -52.0, -53.0]  # the head's token 1 from the first insert, then the branch's
    cache.evict(10)
    assert cache.cached_logprobs("", [1, 2, 7, 8, 9], start=0, top_k=K) is None
    assert cache.total_size() == 0
    cache.check_integrity()
