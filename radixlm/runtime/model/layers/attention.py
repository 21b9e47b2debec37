"""Attention over the paged KV pool: the backend interface and the torch implementation used on CPU.

Runs inside the scheduler process (model forward). A batch is a flat list of T new tokens from B requests;
request r contributes extend_lens[r] tokens starting at extend_start_loc[r], whose K/V go to the slots
out_cache_loc, and it attends to the first seq_lens[r] slots of its row in req_to_token (its cached
prefix of prefix_lens[r] tokens plus, causally, its own new tokens). Decode is the case extend_lens == 1.
A sliding-window layer (window W, Gemma-3's sliding layers) lets the token at position p see only the keys
at positions p - W + 1 .. p, as transformers' sliding_window_overlay does.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from radixlm.runtime.forward import AttentionMetadata
from radixlm.runtime.model.layers.cascade import MIN_SHARED_TOKENS, cascade_decode, shared_prefix_len

# The longest extend row the compiled ops serve (short_extend): a speculative verify row is 1 + k tokens (k <= 8
# by default). Longer rows are prefill chunks and keep one SDPA call per row (the compiled op's scores for a
# row's tokens are computed key by key; it was measured on verify rows only).
MAX_TOKENWISE_EXTEND = 17


class KVPoolLike(Protocol):
    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]


class AttentionBackend(Protocol):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                kv_pool: KVPoolLike, meta: AttentionMetadata, window: int | None = None) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]; also stores k/v at meta.out_cache_loc. window: the
        layer's sliding window (None: the whole context)."""
        ...


class TorchAttentionBackend:
    """Reference-quality attention in plain torch (SDPA), used on CPU.

    Decode rows run as one padded batch (one SDPA call for the whole batch). Prefill rows run one SDPA
    call per request: prefill is compute-bound, and padding ragged prompts to a common length would
    waste more than the per-request call costs.

    With `ops` (radixlm.kernels.cpu's compiled ops, fp32), decode rows run its paged decode attention
    instead: it reads each row's K/V through its req_to_token slots (no gather, no padding, no SDPA call),
    except where the cascade path applies (requests sharing a long cached prefix read it once there).
    """

    def __init__(self, ops=None):
        self.ops = ops

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                kv_pool: KVPoolLike, meta: AttentionMetadata, window: int | None = None) -> torch.Tensor:
        k_buf, v_buf = kv_pool.k_buffer[layer_id], kv_pool.v_buffer[layer_id]
        k_buf[meta.out_cache_loc] = k
        v_buf[meta.out_cache_loc] = v
        if meta.is_decode:
            return self.decode_stored(q, layer_id, kv_pool, meta, window)
        out = torch.empty_like(q)
        decode_rows = [i for i, n in enumerate(meta.extend_lens_list) if n == 1 and meta.prefix_lens_list[i] > 0]
        if decode_rows:
            rows = torch.tensor(decode_rows, dtype=torch.int64)
            token_idx = meta.extend_start_loc.index_select(0, rows.to(q.device))
            out[token_idx] = self._decode(q.index_select(0, token_idx), k_buf, v_buf, meta, rows, window)
        decode_set = set(decode_rows)
        for i in range(len(meta.extend_lens_list)):
            if i not in decode_set:
                self._extend_one(q, k, v, k_buf, v_buf, meta, i, out, window)
        return out

    def decode_stored(self, q: torch.Tensor, layer_id: int, kv_pool: KVPoolLike, meta: AttentionMetadata,
                      window: int | None = None) -> torch.Tensor:
        """A decode batch whose new K/V are already in the pool (llama.py's fused rotary + store):
        q [B, Hq, D] -> [B, Hq, D]."""
        rows = meta.plan_cache.get("decode_rows")
        if rows is None:
            rows = meta.plan_cache["decode_rows"] = torch.arange(len(meta.seq_lens_list))
        return self._decode(q, kv_pool.k_buffer[layer_id], kv_pool.v_buffer[layer_id], meta, rows, window)

    def extend_stored(self, q: torch.Tensor, layer_id: int, kv_pool: KVPoolLike, meta: AttentionMetadata
                      ) -> torch.Tensor:
        """A short-extend batch (short_extend(meta)) whose new K/V are already in the pool: token j of row r
        attends to its request's first prefix + j + 1 slots, as a decode row there would (the same bits),
        q [T, Hq, D] -> [T, Hq, D] (compiled ops only)."""
        return self.ops.paged_extend_attention(q.contiguous(), kv_pool.k_buffer[layer_id], kv_pool.v_buffer[layer_id],
                                               meta.req_to_token, meta.req_pool_indices.contiguous(),
                                               meta.prefix_lens.contiguous(), meta.extend_lens.contiguous(),
                                               meta.sm_scale)

    def _decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                meta: AttentionMetadata, rows: torch.Tensor, window: int | None = None) -> torch.Tensor:
        if window is not None and max(meta.seq_lens_list[int(r)] for r in rows) > window:
            return self._windowed_decode(q, k_buf, v_buf, meta, rows, window)
        if self.ops is not None and q.dtype == torch.float32 and len(rows) < 2:
            return self._paged_decode(q, k_buf, v_buf, meta, rows)  # one row: no cascade to consider
        # q [b, Hq, D]; gather each row's slots into a padded [b, L] block and mask the padding.
        slots, mask = self._decode_plan(meta, rows)
        shared = meta.plan_cache.get("decode_shared")
        if shared is None:
            shared = meta.plan_cache["decode_shared"] = shared_prefix_len(slots, mask[:, 0, 0, :])
        if shared >= MIN_SHARED_TOKENS:  # requests share a cached prefix: read it once, not b times
            return cascade_decode(q, k_buf, v_buf, slots, mask[:, 0, 0, :], shared, meta.sm_scale)
        if self.ops is not None and q.dtype == torch.float32:
            return self._paged_decode(q, k_buf, v_buf, meta, rows)
        b, L = slots.shape
        start = meta.plan_cache["decode_run_start"]
        if start is not None:  # a lone row whose slots are one ascending run: its K/V are a slice, no gather
            kk = k_buf[start : start + L].unsqueeze(0).transpose(1, 2)  # [1, Hkv, L, D] (a view)
            vv = v_buf[start : start + L].unsqueeze(0).transpose(1, 2)
            o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, scale=meta.sm_scale,
                                               enable_gqa=kk.shape[1] != q.shape[1])
            return o.squeeze(2)
        flat = slots.reshape(-1)
        # index_select on the flat slot list is ~2.5x faster than advanced indexing with a 2-D index.
        kk = k_buf.index_select(0, flat).view(b, L, *k_buf.shape[1:]).transpose(1, 2)  # [b, Hkv, L, D]
        vv = v_buf.index_select(0, flat).view(b, L, *v_buf.shape[1:]).transpose(1, 2)
        qq = q.unsqueeze(2)  # [b, Hq, 1, D]
        # No padding (always so at batch 1): SDPA without a mask takes its faster kernel.
        unpadded = meta.plan_cache["decode_unpadded"]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=None if unpadded else mask, scale=meta.sm_scale,
                                           enable_gqa=kk.shape[1] != qq.shape[1])
        return o.squeeze(2)

    def _paged_decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, meta: AttentionMetadata,
                      rows: torch.Tensor) -> torch.Tensor:
        plan = meta.plan_cache.get("paged")
        if plan is None:  # the decode rows' request rows and lengths, once per forward
            if len(rows) == len(meta.seq_lens_list):
                plan = (meta.req_pool_indices.contiguous(), meta.seq_lens.contiguous())
            else:
                plan = (meta.req_pool_indices.index_select(0, rows), meta.seq_lens.index_select(0, rows))
            meta.plan_cache["paged"] = plan
        return self.ops.paged_decode_attention(q.contiguous(), k_buf, v_buf, meta.req_to_token, *plan, meta.sm_scale)

    def _windowed_decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, meta: AttentionMetadata,
                         rows: torch.Tensor, window: int) -> torch.Tensor:
        """Decode rows of a sliding-window layer when some row is longer than the window: each row attends
        to its last `window` slots, gathered into a small slot table of their own (once per forward and
        window), which the compiled paged decode attention reads like req_to_token."""
        key = f"window_{window}"
        plan = meta.plan_cache.get(key)
        if plan is None:
            plan = meta.plan_cache[key] = _window_table(meta, rows, window)
        table, lens, valid = plan
        if self.ops is not None and q.dtype == torch.float32:
            rows_idx = torch.arange(len(rows), device=table.device)
            return self.ops.paged_decode_attention(q.contiguous(), k_buf, v_buf, table, rows_idx, lens, meta.sm_scale)
        b, L = table.shape
        flat = table.reshape(-1)
        kk = k_buf.index_select(0, flat).view(b, L, *k_buf.shape[1:]).transpose(1, 2)  # [b, Hkv, L, D]
        vv = v_buf.index_select(0, flat).view(b, L, *v_buf.shape[1:]).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, attn_mask=valid[:, None, None, :],
                                           scale=meta.sm_scale, enable_gqa=kk.shape[1] != q.shape[1])
        return o.squeeze(2)

    @staticmethod
    def _decode_plan(meta: AttentionMetadata, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded slot block [b, L] and mask [b, 1, 1, L] of the decode rows, once per forward."""
        plan = meta.plan_cache.get("decode")
        if plan is None:
            dev = meta.req_to_token.device
            seq_lens = [meta.seq_lens_list[int(r)] for r in rows]
            max_len = max(seq_lens)
            req_rows = meta.req_pool_indices.index_select(0, rows.to(dev))
            slots = meta.req_to_token.index_select(0, req_rows)[:, :max_len]
            lens = torch.tensor(seq_lens, device=dev)
            valid = torch.arange(max_len, device=dev)[None, :] < lens[:, None]
            # Padding reads the scratch slot 0 (kept finite), masked out of the softmax.
            plan = meta.plan_cache["decode"] = (slots.masked_fill(~valid, 0), valid[:, None, None, :])
            meta.plan_cache["decode_unpadded"] = min(seq_lens) == max_len
            meta.plan_cache["decode_run_start"] = _run_start(slots[0]) if len(seq_lens) == 1 else None
        return plan

    def _extend_one(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor,
                    v_buf: torch.Tensor, meta: AttentionMetadata, i: int, out: torch.Tensor,
                    window: int | None = None) -> None:
        start, n = meta.extend_start_loc_list[i], meta.extend_lens_list[i]
        prefix = meta.prefix_lens_list[i]
        qq = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        if window is not None and prefix + n > window:
            o = _windowed_extend(qq, k_buf, v_buf, meta, i, window)
        elif prefix == 0:
            # Nothing cached: attend to the fresh k/v directly (no gather from the pool).
            kk = k[start : start + n].transpose(0, 1).unsqueeze(0)
            vv = v[start : start + n].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=meta.sm_scale,
                                               enable_gqa=kk.shape[1] != qq.shape[1])
        else:
            row = int(meta.req_pool_indices[i])
            slots = meta.req_to_token[row, : prefix + n]
            kk = k_buf.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, prefix + n, D]
            vv = v_buf.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            # Causal mask aligned bottom-right: new token j sees everything up to prefix + j.
            mask = torch.ones(n, prefix + n, dtype=torch.bool, device=q.device).tril(diagonal=prefix)
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=meta.sm_scale,
                                               enable_gqa=kk.shape[1] != qq.shape[1])
        out[start : start + n] = o.squeeze(0).transpose(0, 1)


def _window_table(meta: AttentionMetadata, rows: torch.Tensor, window: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode rows' last `window` slots as a padded table [b, L] (padding: the scratch slot 0), their
    counts [b] and the valid-key mask [b, L]."""
    dev = meta.req_to_token.device
    seq_lens = [meta.seq_lens_list[int(r)] for r in rows]
    starts = [max(0, n - window) for n in seq_lens]
    width = max(n - s for n, s in zip(seq_lens, starts))
    table = torch.zeros(len(seq_lens), width, dtype=meta.req_to_token.dtype, device=dev)
    req_rows = meta.req_pool_indices.index_select(0, rows.to(dev)).tolist()
    for j, (row, s, n) in enumerate(zip(req_rows, starts, seq_lens)):
        table[j, : n - s] = meta.req_to_token[row, s:n]
    lens = torch.tensor([n - s for n, s in zip(seq_lens, starts)], dtype=torch.int64, device=dev)
    valid = torch.arange(width, device=dev)[None, :] < lens[:, None]
    return table, lens, valid


def _windowed_extend(qq: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, meta: AttentionMetadata, i: int,
                     window: int) -> torch.Tensor:
    """Row i's new tokens (qq [1, Hq, n, D]; their K/V already in the pool) over a sliding window: new token
    j (position prefix + j) sees positions prefix + j - window + 1 .. prefix + j. Keys before the first
    token's window are not read."""
    n, prefix = meta.extend_lens_list[i], meta.prefix_lens_list[i]
    lo = max(0, prefix + 1 - window)
    slots = meta.req_to_token[int(meta.req_pool_indices[i]), lo : prefix + n]
    kk = k_buf.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, prefix + n - lo, D]
    vv = v_buf.index_select(0, slots).transpose(0, 1).unsqueeze(0)
    q_pos = torch.arange(prefix, prefix + n, device=qq.device)[:, None]
    kv_pos = torch.arange(lo, prefix + n, device=qq.device)[None, :]
    mask = (kv_pos <= q_pos) & (kv_pos > q_pos - window)
    return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=meta.sm_scale,
                                          enable_gqa=kk.shape[1] != qq.shape[1])


def short_extend(meta: AttentionMetadata) -> bool:
    """Whether an extend batch's rows all have a cached prefix and at most MAX_TOKENWISE_EXTEND new tokens
    (speculative verify rows): the compiled ops then store the rows' K/V first and attend each new token
    over the pool (extend_stored), no gather. False for decode batches (decode_stored) and for batches with
    prefill rows; once per forward."""
    short = meta.plan_cache.get("short_extend")
    if short is None:
        short = meta.plan_cache["short_extend"] = (not meta.is_decode and min(meta.prefix_lens_list) > 0
                                                   and max(meta.extend_lens_list) <= MAX_TOKENWISE_EXTEND)
    return short


def _run_start(slots: torch.Tensor) -> int | None:
    """The first slot when `slots` ([L]) is one ascending run of consecutive slots, else None. A request
    decoding alone has such a run (scheduler/memory_pool.py hands slots out ascending) unless its prefix
    came from the radix cache or the pool was fragmented; then the gather path runs."""
    first = int(slots[0])
    n = slots.shape[0]
    if int(slots[-1]) - first != n - 1:
        return None
    if n > 2 and not bool((slots[1:] - slots[:-1] == 1).all()):
        return None
    return first
