"""KV slot bookkeeping: a free-slot allocator and the request-to-token table (the K/V buffers themselves,
KVPool, belong to the model runner: runtime/model/kv_pool.py).

Runs in the scheduler process. Page size is 1 so the radix tree can share KV at token granularity.
Slot 0 is reserved as a scratch slot (never handed out): padded rows write there harmlessly.
"""

from __future__ import annotations

import torch


class TokenAllocator:
    """Free list of KV slots. Invariant: every slot in 1..size is either free here or owned elsewhere
    (a running request or a radix-tree node), never both; `check_integrity` verifies the free side.

    The free list is a stack whose top (its end) holds the lowest slot, and alloc returns its slots in
    ascending order: a request's prompt slots and the slots its decode steps take one by one then form
    one ascending run while nothing else interleaves, so attention can read the request's K/V as a slice
    of the pool instead of gathering it (TorchAttentionBackend's contiguous decode)."""

    def __init__(self, size: int, device: torch.device):
        self.size = size
        self.device = device
        self._free = torch.arange(size, 0, -1, dtype=torch.int64, device=device)
        self._num_free = size

    def num_free(self) -> int:
        return self._num_free

    def alloc(self, num: int) -> torch.Tensor | None:
        """Take `num` slots (int64 [num]); None (and nothing taken) if there are not enough."""
        if num > self._num_free:
            return None
        start = self._num_free - num
        out = self._free[start : self._num_free].flip(0)  # a copy, lowest slot first
        self._num_free = start
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = int(slots.numel())
        if n == 0:
            return
        assert self._num_free + n <= self.size, "freeing more slots than exist (double free?)"
        # Reversed onto the stack: slots freed in ascending order come back out ascending.
        back = slots.to(self._free.device, torch.int64).reshape(-1).flip(0)
        self._free[self._num_free : self._num_free + n] = back
        self._num_free += n

    def free_slots(self) -> torch.Tensor:
        return self._free[: self._num_free]

    def check_integrity(self) -> None:
        free = self.free_slots()
        assert free.numel() == self._num_free
        if free.numel():
            assert int(free.min()) >= 1 and int(free.max()) <= self.size, "free slot out of range"
            assert torch.unique(free).numel() == free.numel(), "a slot is on the free list twice"


class ReqToTokenTable:
    """Rows of KV slot indices, one row per running request (row i, column j = slot of token j)."""

    def __init__(self, max_requests: int, max_context_len: int, device: torch.device):
        self.table = torch.zeros((max_requests, max_context_len), dtype=torch.int64, device=device)
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self.max_requests = max_requests
        self.max_context_len = max_context_len

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def num_free(self) -> int:
        return len(self._free_rows)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start : start + slots.numel()] = slots

    def check_integrity(self) -> None:
        rows = self._free_rows
        assert len(set(rows)) == len(rows), "a request row is free twice"
        assert all(0 <= r < self.max_requests for r in rows)
