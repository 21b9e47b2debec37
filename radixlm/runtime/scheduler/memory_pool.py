"""KV slot bookkeeping: a free-slot allocator and the request-to-token table (the K/V buffers themselves,
KVPool, belong to the model runner: runtime/model/kv_pool.py).

Runs in the scheduler process. Page size is 1 so the radix tree can share KV at token granularity.
Slot 0 is reserved as a scratch slot (never handed out): padded rows write there harmlessly.
"""

from __future__ import annotations

import torch

from radixlm.runtime.forward import to_device


class TokenAllocator:
    """Free list of KV slots. Invariant: every slot in 1..size is either free here or owned elsewhere
    (a running request or a radix-tree node), never both; `check_integrity` verifies the free side.

    The free list is a stack sorted so that its top (its end) holds the lowest slot, and alloc returns its
    slots in ascending order: a request's prompt slots form one ascending run, and the slots its decode
    steps take one by one follow it while nothing else interleaves, so attention reads the request's K/V
    from few pages (and as a slice of the pool when they are one run: TorchAttentionBackend's contiguous
    decode). Freed slots are not pushed back in the order they come (a flushed or evicted tree frees them
    node by node, a finished batch's decode slots interleave its requests': the next prompt would then
    read its K/V from a page per token, 6x slower attention at 16 rows measured, docs/benchmarks.md): they
    wait in a released list that is merged into the stack, sorted, when it reaches MERGE_FRACTION of the
    pool or when the stack alone cannot serve an alloc."""

    MERGE_FRACTION = 32  # merge the released slots once they are 1/32 of the pool (at least MERGE_MIN)
    MERGE_MIN = 64

    def __init__(self, size: int, device: torch.device):
        self.size = size
        self.device = device
        self._free = torch.arange(size, 0, -1, dtype=torch.int64, device=device)
        self._top = size  # the sorted stack is _free[:_top]
        self._released: list[torch.Tensor] = []
        self._num_released = 0
        self._merge_at = max(self.MERGE_MIN, size // self.MERGE_FRACTION)

    def num_free(self) -> int:
        return self._top + self._num_released

    def alloc(self, num: int) -> torch.Tensor | None:
        """Take `num` slots (int64 [num]), the lowest of the sorted stack; None (and nothing taken) if there
        are not enough."""
        if num > self.num_free():
            return None
        if num > self._top:
            self._merge()
        start = self._top - num
        out = self._free[start : self._top].flip(0)  # a copy, lowest slot first
        self._top = start
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = int(slots.numel())
        if n == 0:
            return
        assert self.num_free() + n <= self.size, "freeing more slots than exist (double free?)"
        self._released.append(slots.to(self._free.device, torch.int64).reshape(-1).clone())
        self._num_released += n
        if self._num_released >= self._merge_at:
            self._merge()

    def _merge(self) -> None:
        """Sort the released slots into the stack (descending, so its top is the lowest)."""
        if not self._released:
            return
        merged = torch.cat([self._free[: self._top], *self._released]).sort(descending=True).values
        self._top = merged.numel()
        self._free[: self._top] = merged
        self._released.clear()
        self._num_released = 0

    def free_slots(self) -> torch.Tensor:
        return torch.cat([self._free[: self._top], *self._released])

    def check_integrity(self) -> None:
        stack = self._free[: self._top]
        assert sum(int(r.numel()) for r in self._released) == self._num_released
        if stack.numel() > 1:
            assert bool((stack[:-1] > stack[1:]).all()), "the free stack is not sorted (lowest slot on top)"
        free = self.free_slots()
        assert free.numel() == self.num_free()
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

    def write_each(self, rows: list[int], cols: list[int], slots: torch.Tensor) -> None:
        """table[rows[i], cols[i]] = slots[i] for every i, as one indexed write."""
        index = to_device(torch.tensor([rows, cols], dtype=torch.int64), self.table.device)
        self.table[index[0], index[1]] = slots

    def check_integrity(self) -> None:
        rows = self._free_rows
        assert len(set(rows)) == len(rows), "a request row is free twice"
        assert all(0 <= r < self.max_requests for r in rows)
