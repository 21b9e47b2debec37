"""Extend attention kernel vs its torch reference, and the reference vs SDPA on gathered K/V.

Batches are ragged, with prefix lengths 0 and > 0, shuffled non-contiguous slots, GQA ratios 1, 3, 8
and head dims 64 and 128; the output starts as NaN and unowned pool slots hold NaN.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from radixlm.kernels.extend_attention import extend_attention, extend_attention_reference  # noqa: E402
from radixlm.kernels.store_kv import store_kv_reference  # noqa: E402

CASES = {
    # name: (prefix_lens, extend_lens, num_kv_heads, group, head_dim)
    "no_prefix_mha": ([0, 0], [5, 3], 2, 1, 64),
    "ragged_prefix_gqa3": ([0, 7, 12], [9, 1, 4], 1, 3, 64),
    "two_row_blocks_gqa8_d128": ([4, 0], [17, 2], 1, 8, 128),
    "long_prefix_two_kv_heads": ([19], [1], 2, 3, 128),
}


def _stored(batch):
    store_kv_reference(batch.k_new, batch.v_new, batch.k_buffer, batch.v_buffer, batch.out_cache_loc)
    return batch


def _run(batch, **kwargs) -> torch.Tensor:
    out = torch.full_like(batch.q, float("nan"))
    extend_attention(batch.q, batch.k_buffer, batch.v_buffer, out, batch.req_to_token, batch.req_pool_indices,
                     batch.seq_lens, batch.prefix_lens, batch.extend_start_loc, 0.125, **kwargs)
    return out


def _reference(batch) -> torch.Tensor:
    return extend_attention_reference(batch.q, batch.k_buffer, batch.v_buffer, batch.req_to_token,
                                      batch.req_pool_indices, batch.seq_lens, batch.prefix_lens,
                                      batch.extend_start_loc, 0.125)


@pytest.mark.parametrize("case", list(CASES))
def test_extend_matches_reference(device, paged_batch, tol, case):
    prefix, extend, num_kv_heads, group, head_dim = CASES[case]
    batch = _stored(paged_batch(prefix, extend, num_kv_heads, group, head_dim, torch.float32, device))
    # 16-wide blocks so sequences of up to 20 tokens span several query and key blocks
    out = _run(batch, block_m=16, block_n=16)
    torch.testing.assert_close(out, _reference(batch), **tol(torch.float32))


def test_extend_default_blocks_bf16_int64_table(device, paged_batch, tol):
    batch = _stored(paged_batch([3, 0], [6, 2], 1, 3, 64, torch.bfloat16, device, table_dtype=torch.int64))
    torch.testing.assert_close(_run(batch, max_extend_len=6), _reference(batch), **tol(torch.bfloat16))


def test_reference_matches_sdpa(paged_batch):
    # independent formulation: SDPA over the gathered, GQA-expanded K/V with a bottom-right causal mask
    batch = _stored(paged_batch([0, 5], [4, 3], 1, 3, 64, torch.float32, torch.device("cpu"), seed=3))
    got = _reference(batch)
    for b in range(2):
        seq_len, prefix_len, start = (int(t[b]) for t in (batch.seq_lens, batch.prefix_lens, batch.extend_start_loc))
        slots = batch.req_to_token[batch.req_pool_indices[b], :seq_len].long()
        k = batch.k_buffer[slots].repeat_interleave(3, dim=1).transpose(0, 1)  # [Hq, S, D]
        v = batch.v_buffer[slots].repeat_interleave(3, dim=1).transpose(0, 1)
        q = batch.q[start:start + seq_len - prefix_len].transpose(0, 1)  # [Hq, E, D]
        mask = torch.ones(seq_len - prefix_len, seq_len, dtype=torch.bool).tril(diagonal=prefix_len)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125).transpose(0, 1)
        torch.testing.assert_close(got[start:start + seq_len - prefix_len], want, atol=1e-5, rtol=1e-5)


def test_rejects_dtype_mismatch(device, paged_batch):
    batch = paged_batch([0], [2], 1, 1, 64, torch.float32, device)
    with pytest.raises(AssertionError):
        extend_attention(batch.q.double(), batch.k_buffer, batch.v_buffer, batch.q.double(), batch.req_to_token,
                         batch.req_pool_indices, batch.seq_lens, batch.prefix_lens, batch.extend_start_loc, 0.1)


@pytest.mark.parametrize("window", [1, 4, 13])
def test_extend_sliding_window_matches_reference(device, paged_batch, tol, window):
    """Windows shorter than a key block and than the prefix: whole key blocks a row cannot see (its max
    stays -inf there) must leave its sums untouched, not NaN."""
    batch = _stored(paged_batch([0, 7, 19, 12], [20, 1, 9, 4], 1, 3, 64, torch.float32, device))
    out = _run(batch, block_m=16, block_n=4, window=window)
    ref = extend_attention_reference(batch.q, batch.k_buffer, batch.v_buffer, batch.req_to_token,
                                     batch.req_pool_indices, batch.seq_lens, batch.prefix_lens,
                                     batch.extend_start_loc, 0.125, window=window)
    torch.testing.assert_close(out, ref, **tol(torch.float32))
    assert not torch.equal(ref, _reference(batch))  # the window changed something
