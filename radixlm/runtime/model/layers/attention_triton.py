"""TritonAttentionBackend: the attention backend used on CUDA, built on radixlm.kernels.

Runs inside the scheduler process (model forward). Same contract as TorchAttentionBackend in
layers/attention.py: store the new tokens' K/V at meta.out_cache_loc, then attend over each request's
slot list. Decode batches take the split-K decode kernel (no host synchronisation, so the step can be
captured in a CUDA graph); any other batch takes the extend kernel, which also handles decode rows
mixed into a prefill batch (a row with one new token is an extend of length 1).
"""

from __future__ import annotations

from typing import Optional

import torch

from radixlm.kernels.decode_attention import decode_attention, default_num_kv_splits
from radixlm.kernels.extend_attention import extend_attention
from radixlm.kernels.store_kv import store_kv
from radixlm.runtime.forward import AttentionMetadata
from radixlm.runtime.model.layers.attention import KVPoolLike

# SM count assumed off-GPU (interpreter runs); only affects how many splits decode uses
_CPU_NUM_SMS = 4


class TritonAttentionBackend:
    """Triton attention over the paged KV pool; on CPU it runs only under TRITON_INTERPRET=1 (tests)."""

    def __init__(self, num_kv_splits: Optional[int] = None) -> None:
        """num_kv_splits: fixed split count for decode; None picks one per batch size (see
        default_num_kv_splits), which stays constant for a captured CUDA graph's batch size."""
        self._num_kv_splits = num_kv_splits
        self._num_sms: Optional[int] = None  # queried at first decode, never at import

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                kv_pool: KVPoolLike, meta: AttentionMetadata, window: int | None = None) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]; also stores k/v at meta.out_cache_loc. window: the
        layer's sliding window (None: the whole context)."""
        assert q.dim() == 3 and k.dim() == 3 and v.shape == k.shape, (q.shape, k.shape, v.shape)
        k_buf, v_buf = kv_pool.k_buffer[layer_id], kv_pool.v_buffer[layer_id]
        store_kv(k, v, k_buf, v_buf, meta.out_cache_loc)
        out = torch.empty_like(q)
        if meta.is_decode:
            splits = self._splits(q.shape[0], k_buf.shape[1], q.device)
            return decode_attention(q, k_buf, v_buf, out, meta.req_to_token, meta.req_pool_indices,
                                    meta.seq_lens, meta.sm_scale, num_kv_splits=splits, window=window or 0)
        # host copy of the lengths when the metadata carries one: avoids a device sync
        ext_list = getattr(meta, "extend_lens_list", None)
        max_extend_len = max(ext_list) if ext_list else None
        return extend_attention(q, k_buf, v_buf, out, meta.req_to_token, meta.req_pool_indices,
                                meta.seq_lens, meta.prefix_lens, meta.extend_start_loc, meta.sm_scale,
                                max_extend_len=max_extend_len, window=window or 0)

    def _splits(self, batch_size: int, num_kv_heads: int, device: torch.device) -> int:
        if self._num_kv_splits is not None:
            return self._num_kv_splits
        if self._num_sms is None:
            self._num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
                             if device.type == "cuda" else _CPU_NUM_SMS)
        return default_num_kv_splits(batch_size, num_kv_heads, self._num_sms)
