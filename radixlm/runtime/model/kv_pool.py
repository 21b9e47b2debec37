"""KVPool: per-layer K/V buffers indexed by token slot, owned by the model runner.

Runs inside the scheduler process (and in each tensor-parallel worker rank, for its shard of heads).
Page size is 1 so the radix tree can share KV at token granularity. Slot 0 is reserved as a scratch slot
(never handed out by scheduler/memory_pool.py's TokenAllocator): padded rows write there harmlessly.
"""

from __future__ import annotations

import torch


class KVPool:
    """Preallocated K and V buffers per layer: [num_slots + 1, num_kv_heads, head_dim] (slot 0 = scratch)."""

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_slots + 1, num_kv_heads, head_dim)
        # torch.empty: pages are touched only when written, so a large pool costs nothing until used.
        self.k_buffer = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # Padded attention rows read the scratch slot under a zero mask weight; 0 * NaN is NaN, so the
        # scratch slot must hold finite values (recycled memory can hold anything).
        for buf in self.k_buffer + self.v_buffer:
            buf[0].zero_()
        self.num_slots = num_slots

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][slots] = k
        self.v_buffer[layer_id][slots] = v

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
