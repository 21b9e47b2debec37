"""KVCacheManager: every movement of a KV slot goes through here (allocator, request rows, radix tree).

Runs in the scheduler process. Ownership invariant (robustness.md #3): each slot 1..size is in exactly
one place: the allocator's free list, a radix-tree node, or a running request's own part of its row
(row[tree_len:kv_len]; row[:tree_len] are the locked tree slots it reuses). A request's computed prompt
logprobs (req.prompt_logprobs) go into the tree with its slots, so a later request can reuse both.
"""

from __future__ import annotations

import torch

from radixlm.radix_cache import RadixCache
from radixlm.radix_cache.radix_cache import DEFAULT_LOGPROB_TOP_K
from radixlm.radix_cache.token_logprobs import CachedLogprobs, TokenLogprobs
from radixlm.runtime.scheduler.memory_pool import ReqToTokenTable, TokenAllocator
from radixlm.runtime.scheduler.request import Req


class KVCacheManager:
    def __init__(self, allocator: TokenAllocator, table: ReqToTokenTable, disable_radix_cache: bool,
                 logprob_top_k: int = DEFAULT_LOGPROB_TOP_K):
        self.allocator = allocator
        self.table = table
        self.tree: RadixCache | None = (None if disable_radix_cache
                                        else RadixCache(allocator.free, logprob_top_k=logprob_top_k))

    @property
    def logprob_top_k(self) -> int | None:
        """Top-k alternatives the tree keeps with each cached prompt logprob (None: no tree, nothing kept)."""
        return None if self.tree is None else self.tree.logprob_top_k

    def cached_prompt_logprobs(self, req: Req) -> CachedLogprobs | None:
        """How much of a request's prompt the tree answers with KV and prompt logprobs both (None: not more
        than its logprob start; requests with token_ids_logprob always compute theirs)."""
        if self.tree is None or req.logprob.token_ids_logprob:
            return None
        return self.tree.cached_logprobs(req.namespace, req.input_ids, req.logprob_start(),
                                         req.logprob.top_logprobs_num)

    # ---- capacity ---------------------------------------------------------------------------------
    def available(self) -> int:
        """Slots obtainable now: free ones plus those the tree could evict."""
        return self.allocator.num_free() + (self.tree.evictable_size() if self.tree else 0)

    def alloc(self, num: int) -> torch.Tensor | None:
        """Take `num` slots, evicting least-recently-used cache entries first if needed."""
        short = num - self.allocator.num_free()
        if short > 0 and self.tree is not None:
            self.tree.evict(short)
        return self.allocator.alloc(num)

    # ---- request lifecycle ------------------------------------------------------------------------
    def admit(self, req: Req, max_match: int) -> bool:
        """Give `req` a row and its cached prefix (at most max_match tokens), locked. False if no row free."""
        row = self.table.alloc()
        if row is None:
            return False
        req.row = row
        req.tree_len = 0
        req.last_node = None
        if self.tree is not None:  # max_match may be 0: the match is then the namespace root
            match = self.tree.match_prefix(req.namespace, req.full_ids()[:max_match])
            self.tree.inc_lock_ref(match.last_node)
            req.last_node = match.last_node
            req.tree_len = int(match.slots.numel())
            self.table.write(row, 0, match.slots)
        req.kv_len = req.tree_len
        return True

    def extend(self, req: Req, num: int) -> bool:
        """Allocate slots for the next `num` tokens of req and record them in its row."""
        slots = self.alloc(num)
        if slots is None:
            return False
        self.table.write(req.row, req.kv_len, slots)
        req.kv_len += num
        return True

    def extend_each(self, reqs: list[Req], nums: list[int]) -> bool:
        """extend(req, num) for every pair, as one allocation and one table write: a step's decode and
        verify rows, which one by one cost a GPU step's host two device ops a row. False, with nothing
        taken, when the slots are not there."""
        slots = self.alloc(sum(nums))
        if slots is None:
            return False
        rows: list[int] = []
        cols: list[int] = []
        for req, num in zip(reqs, nums):
            rows += [req.row] * num
            cols += range(req.kv_len, req.kv_len + num)
            req.kv_len += num
        self.table.write_each(rows, cols, slots)
        return True

    def truncate(self, req: Req, kv_len: int) -> None:
        """Forget the K/V of positions >= kv_len (jump-forward re-tokenized them); frees their slots."""
        assert req.tree_len <= kv_len <= req.kv_len, "cannot truncate into shared tree slots"
        self.allocator.free(self.table.table[req.row, kv_len : req.kv_len])  # free() keeps a copy
        req.kv_len = kv_len

    def row_slots(self, req: Req, end: int | None = None) -> torch.Tensor:
        return self.table.table[req.row, : req.kv_len if end is None else end]

    def cache_computed_prefix(self, req: Req) -> None:
        """Insert the computed prefix of a request still in prefill so concurrent siblings share it now."""
        if self.tree is None or req.kv_len <= req.tree_len:
            return
        ids = req.full_ids()[: req.kv_len]
        slots, node = self.tree.cache_prefix(req.namespace, ids, self.row_slots(req).clone(), req.last_node,
                                             _logprobs(req))
        self.table.write(req.row, 0, slots)
        req.last_node = node
        req.tree_len = int(slots.numel())

    def release(self, req: Req) -> None:
        """The request leaves the running set (finished, aborted or retracted): its computed K/V go into
        the tree (so a retried or sibling request reuses them) and its lock and row are released."""
        if req.row is None:
            return
        if req.kv_len > req.seq_len():  # a step failed between planning a verify row and its verification
            self.truncate(req, req.seq_len())
        slots = self.row_slots(req).clone()
        if self.tree is not None:
            self.tree.insert(req.namespace, req.full_ids()[: req.kv_len], slots, _logprobs(req))
            if req.last_node is not None:
                self.tree.dec_lock_ref(req.last_node)
        else:
            self.allocator.free(slots)
        self.table.free(req.row)
        req.row, req.last_node, req.kv_len, req.tree_len = None, None, 0, 0

    def flush(self) -> None:
        if self.tree is not None:
            self.tree.reset()

    # ---- invariants -------------------------------------------------------------------------------
    def check_integrity(self, running: list[Req]) -> None:
        self.allocator.check_integrity()
        self.table.check_integrity()
        parts = [self.allocator.free_slots()]
        if self.tree is not None:
            self.tree.check_integrity()
            parts.append(self.tree.all_slots())
        for req in running:
            assert req.row is not None, f"running request {req.rid} has no row"
            parts.append(self.table.table[req.row, req.tree_len : req.kv_len])
        slots = torch.cat([p.to(torch.int64).cpu() for p in parts])
        size = self.allocator.size
        assert slots.numel() == size, f"slot accounting: {slots.numel()} owned, {size} exist (leak or double)"
        assert torch.equal(torch.sort(slots).values, torch.arange(1, size + 1)), "a slot is owned twice"

    def check_idle(self) -> None:
        """Idle invariants: nothing locked, free + evictable == total, all rows free."""
        self.check_integrity([])
        assert self.table.num_free() == self.table.max_requests, "request rows leaked"
        if self.tree is not None:
            assert self.tree.protected_size() == 0, "radix nodes still locked while idle"
            assert self.allocator.num_free() + self.tree.evictable_size() == self.allocator.size
        else:
            assert self.allocator.num_free() == self.allocator.size


def _logprobs(req: Req) -> TokenLogprobs | None:
    """The request's computed prompt logprobs for its first kv_len tokens (what an insert gives the tree)."""
    return None if req.prompt_logprobs is None else req.prompt_logprobs.window(req.kv_len)
