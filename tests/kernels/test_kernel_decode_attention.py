"""Decode attention (split-K) kernels vs their torch reference, and the reference vs SDPA.

Sequence lengths from 1 (more splits than keys: empty splits) to 20, GQA ratios 1, 3, 8, head dims
64 and 128, shuffled slots, NaN-poisoned output and unowned pool slots.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from radixlm.kernels.decode_attention import (  # noqa: E402
    decode_attention, decode_attention_reference, default_num_kv_splits,
)
from radixlm.kernels.store_kv import store_kv_reference  # noqa: E402

CASES = {
    # name: (seq_lens, num_kv_heads, group, head_dim, num_kv_splits)
    # one split over 17-20 keys: two key blocks per split, so the online-softmax rescale is exercised
    "gqa3_one_split": ([20, 1, 18, 17], 2, 3, 64, 1),
    "mha_three_splits": ([1, 9, 20], 2, 1, 64, 3),
    "gqa8_d128_eight_splits": ([20, 2], 1, 8, 128, 8),
    "gqa3_d128_two_kv_heads": ([13], 2, 3, 128, 4),
}


def _decode_batch(paged_batch, seq_lens, num_kv_heads, group, head_dim, dtype, device, **kwargs):
    batch = paged_batch([n - 1 for n in seq_lens], [1] * len(seq_lens), num_kv_heads, group, head_dim,
                        dtype, device, **kwargs)
    store_kv_reference(batch.k_new, batch.v_new, batch.k_buffer, batch.v_buffer, batch.out_cache_loc)
    return batch


def _run(batch, splits, **kwargs) -> torch.Tensor:
    out = torch.full_like(batch.q, float("nan"))
    decode_attention(batch.q, batch.k_buffer, batch.v_buffer, out, batch.req_to_token, batch.req_pool_indices,
                     batch.seq_lens, 0.125, num_kv_splits=splits, **kwargs)
    return out


def _reference(batch) -> torch.Tensor:
    return decode_attention_reference(batch.q, batch.k_buffer, batch.v_buffer, batch.req_to_token,
                                      batch.req_pool_indices, batch.seq_lens, 0.125)


@pytest.mark.parametrize("case", list(CASES))
def test_decode_matches_reference(device, paged_batch, tol, case):
    seq_lens, num_kv_heads, group, head_dim, splits = CASES[case]
    batch = _decode_batch(paged_batch, seq_lens, num_kv_heads, group, head_dim, torch.float32, device)
    out = _run(batch, splits, block_n=16)  # 16-wide key blocks: several blocks per split
    torch.testing.assert_close(out, _reference(batch), **tol(torch.float32))


def test_decode_default_blocks_bf16_int64_table(device, paged_batch, tol):
    batch = _decode_batch(paged_batch, [5, 17], 1, 3, 64, torch.bfloat16, device, table_dtype=torch.int64)
    torch.testing.assert_close(_run(batch, 2), _reference(batch), **tol(torch.bfloat16))


def test_reference_matches_sdpa(paged_batch):
    batch = _decode_batch(paged_batch, [4, 11], 1, 3, 64, torch.float32, torch.device("cpu"), seed=4)
    got = _reference(batch)
    for b in range(2):
        slots = batch.req_to_token[batch.req_pool_indices[b], : int(batch.seq_lens[b])].long()
        k = batch.k_buffer[slots].repeat_interleave(3, dim=1).transpose(0, 1)  # [Hq, S, D]
        v = batch.v_buffer[slots].repeat_interleave(3, dim=1).transpose(0, 1)
        want = F.scaled_dot_product_attention(batch.q[b][:, None], k, v, scale=0.125)[:, 0]
        torch.testing.assert_close(got[b], want, atol=1e-5, rtol=1e-5)


def test_default_num_kv_splits_fills_the_gpu():
    assert default_num_kv_splits(1, 8, num_sms=132) == 32  # one long request: split up to the cap
    assert default_num_kv_splits(64, 8, num_sms=132) == 1  # big batch: already 512 programs
    assert 1 <= default_num_kv_splits(4, 2, num_sms=132) <= 32


def test_padding_rows_with_no_keys_output_zeros(device, paged_batch, tol):
    # CUDA-graph batches are padded to a captured size with rows of seq_len 0; they must not make NaN
    batch = _decode_batch(paged_batch, [6, 3], 1, 3, 64, torch.float32, device)
    batch.q = torch.cat([batch.q, torch.randn_like(batch.q[:1])])
    batch.req_pool_indices = torch.cat([batch.req_pool_indices, batch.req_pool_indices[:1]])
    batch.seq_lens = torch.cat([batch.seq_lens, torch.zeros_like(batch.seq_lens[:1])])
    out = _run(batch, 4)
    torch.testing.assert_close(out, _reference(batch), **tol(torch.float32))
    assert torch.equal(out[2], torch.zeros_like(out[2]))


@pytest.mark.parametrize("window", [1, 5, 19])
def test_decode_sliding_window_matches_reference(device, paged_batch, tol, window):
    batch = _decode_batch(paged_batch, [20, 1, 6, 17], 2, 3, 64, torch.float32, device)
    for splits in (1, 3):
        out = _run(batch, splits, block_n=16, window=window)
        ref = decode_attention_reference(batch.q, batch.k_buffer, batch.v_buffer, batch.req_to_token,
                                         batch.req_pool_indices, batch.seq_lens, 0.125, window=window)
        torch.testing.assert_close(out, ref, **tol(torch.float32))
