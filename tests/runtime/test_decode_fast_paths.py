"""The batch-1 decode fast paths against their references: rotary by roll + signed sin is bit-identical to
transformers' rotate_half form; a lone decode row whose slots are one ascending run reads its K/V as a
pool slice and gets the gather path's output; the allocator hands slots out ascending so that runs form."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from radixlm.runtime.forward import AttentionMetadata
from radixlm.runtime.model.layers.attention import TorchAttentionBackend, _run_start
from radixlm.runtime.model.layers.rotary import RotaryEmbedding, apply_rotary, apply_rotary_one
from radixlm.runtime.scheduler.kv_cache import KVCacheManager
from radixlm.runtime.scheduler.memory_pool import ReqToTokenTable, TokenAllocator


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_roll_is_bit_identical_to_transformers(dtype):
    cfg = types.SimpleNamespace(rope_theta=100000.0)
    rope = RotaryEmbedding(cfg, 64, 512)
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 300, 511])
    q = (torch.randn(5, 9, 64, generator=g) * 3).to(dtype)
    k = (torch.randn(5, 3, 64, generator=g) * 3).to(dtype)
    cos, signed_sin = rope.lookup(positions, dtype)
    got_q, got_k = apply_rotary(q, k, cos, signed_sin)
    # transformers: [B, H, T, D] with cos/sin [B, T, D]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          rope.cos[positions][None].to(dtype), rope.sin[positions][None].to(dtype))
    assert torch.equal(got_q, want_q[0].transpose(0, 1))
    assert torch.equal(got_k, want_k[0].transpose(0, 1))
    both = apply_rotary_one(torch.cat([q, k], dim=1), cos, signed_sin)  # q and k side by side, as llama.py
    assert torch.equal(both, torch.cat([got_q, got_k], dim=1))


def test_run_start():
    assert _run_start(torch.tensor([5, 6, 7, 8])) == 5
    assert _run_start(torch.tensor([9])) == 9
    assert _run_start(torch.tensor([5, 7, 6, 8])) is None  # same ends, not a run
    assert _run_start(torch.tensor([8, 7, 6, 5])) is None
    assert _run_start(torch.tensor([5, 6, 9])) is None


def _decode_meta(row_slots: list[int], new_slot: int) -> AttentionMetadata:
    table = torch.zeros(2, 64, dtype=torch.int64)
    seq = row_slots + [new_slot]
    table[1, : len(seq)] = torch.tensor(seq)
    one = torch.tensor([0])
    return AttentionMetadata(
        req_pool_indices=torch.tensor([1]), req_to_token=table, seq_lens=torch.tensor([len(seq)]),
        prefix_lens=torch.tensor([len(row_slots)]), extend_lens=torch.tensor([1]), extend_start_loc=one,
        out_cache_loc=torch.tensor([new_slot]), sm_scale=0.125, is_decode=True, seq_lens_list=[len(seq)],
        prefix_lens_list=[len(row_slots)], extend_lens_list=[1], extend_start_loc_list=[0])


@pytest.mark.parametrize("hq, hkv", [(9, 3), (4, 4)])
def test_lone_row_run_matches_gather(hq, hkv):
    g = torch.Generator().manual_seed(1)
    pool = types.SimpleNamespace(k_buffer=[torch.randn(100, hkv, 64, generator=g)],
                                 v_buffer=[torch.randn(100, hkv, 64, generator=g)])
    q = torch.randn(1, hq, 64, generator=g)
    k = torch.randn(1, hkv, 64, generator=g)
    v = torch.randn(1, hkv, 64, generator=g)
    backend = TorchAttentionBackend()
    run = _decode_meta(list(range(20, 57)), 57)  # slots 20..57: one run
    out_run = backend.forward(q, k, v, 0, pool, run)
    assert run.plan_cache["decode_run_start"] == 20
    slots = torch.arange(20, 58)
    kk = pool.k_buffer[0][slots].transpose(0, 1).repeat_interleave(hq // hkv, 0)  # [Hq, L, D]
    vv = pool.v_buffer[0][slots].transpose(0, 1).repeat_interleave(hq // hkv, 0)
    assert torch.equal(pool.k_buffer[0][57], k[0]) and torch.equal(pool.v_buffer[0][57], v[0])
    ref = torch.nn.functional.scaled_dot_product_attention(q[0][:, None], kk, vv, scale=0.125).squeeze(1)
    torch.testing.assert_close(out_run[0], ref, atol=1e-5, rtol=1e-5)
    # the same K/V at scattered slots go through the gather path and give the same output
    perm = torch.randperm(99, generator=g)[:38] + 1
    pool2 = types.SimpleNamespace(k_buffer=[pool.k_buffer[0].clone()], v_buffer=[pool.v_buffer[0].clone()])
    pool2.k_buffer[0][perm] = pool.k_buffer[0][slots]
    pool2.v_buffer[0][perm] = pool.v_buffer[0][slots]
    scattered = _decode_meta(perm[:-1].tolist(), int(perm[-1]))
    out_gather = backend.forward(q, k, v, 0, pool2, scattered)
    assert scattered.plan_cache["decode_run_start"] is None
    torch.testing.assert_close(out_gather, out_run, atol=1e-5, rtol=1e-5)


def test_allocator_hands_out_ascending_runs():
    alloc = TokenAllocator(16, torch.device("cpu"))
    prompt = alloc.alloc(5)
    steps = [alloc.alloc(1) for _ in range(3)]
    assert torch.cat([prompt, *steps]).tolist() == list(range(1, 9))
    alloc.free(torch.cat([prompt, *steps]))  # a finished request's slots, in its order
    alloc.check_integrity()
    again = torch.cat([alloc.alloc(6), alloc.alloc(1)])
    assert _run_start(again) == 9  # the sorted stack's lowest; the freed ones wait for a merge
    assert alloc.num_free() == 9
    alloc.check_integrity()


def test_allocator_sorts_scrambled_frees_back_into_runs():
    """Slots freed in any order (a flushed tree, two requests' interleaved decode slots) come back out as
    the lowest free slots in one ascending run once merged: when the stack alone cannot serve an alloc,
    and when the released slots reach the merge threshold."""
    alloc = TokenAllocator(200, torch.device("cpu"))
    a, b = alloc.alloc(20), alloc.alloc(20)
    alloc.free(b[torch.randperm(20)])
    alloc.free(a[torch.randperm(20)])
    alloc.check_integrity()
    assert alloc.num_free() == 200
    assert alloc.alloc(150).tolist() == list(range(41, 191))  # the stack still serves it: no merge yet
    run = alloc.alloc(30)  # the stack has 10: the 40 released slots are sorted in first
    assert run.tolist() == list(range(1, 31))
    alloc.check_integrity()
    alloc = TokenAllocator(200, torch.device("cpu"))
    taken = alloc.alloc(64)
    alloc.free(taken[torch.randperm(64)])  # 64 released: the threshold (MERGE_MIN) merges them at once
    assert alloc.alloc(64).tolist() == list(range(1, 65))  # unmerged, the stack would give 65..128
    alloc.check_integrity()
    assert alloc.alloc(137) is None and alloc.num_free() == 136  # not enough: nothing taken


def test_a_steps_rows_extended_at_once_get_what_one_by_one_gives():
    """KVCacheManager.extend_each (a step's decode and verify rows: one allocation, one table write) takes
    the slots, table entries and lengths that one extend per request takes; a pool too small takes nothing."""
    cpu = torch.device("cpu")

    def manager() -> KVCacheManager:
        kv = KVCacheManager(TokenAllocator(64, cpu), ReqToTokenTable(4, 32, cpu), disable_radix_cache=True)
        kv.allocator.free(kv.allocator.alloc(9)[torch.tensor([4, 0, 7, 2])])  # a scrambled free list
        return kv

    def reqs() -> list:
        return [types.SimpleNamespace(row=row, kv_len=kv_len) for row, kv_len in [(2, 3), (0, 0), (3, 7)]]

    one, each = manager(), manager()
    a, b = reqs(), reqs()
    for req, num in zip(a, [1, 4, 2]):
        assert one.extend(req, num)
    assert each.extend_each(b, [1, 4, 2])
    assert torch.equal(one.table.table, each.table.table) and each.table.table.count_nonzero() == 7
    assert [r.kv_len for r in a] == [r.kv_len for r in b] == [4, 4, 9]
    assert torch.equal(one.allocator.free_slots().sort().values, each.allocator.free_slots().sort().values)
    each.allocator.check_integrity()
    short, c = manager(), reqs()
    assert not short.extend_each(c, [20, 20, 20])  # 59 free
    assert [r.kv_len for r in c] == [3, 0, 7] and short.allocator.num_free() == 59
    assert short.table.table.count_nonzero() == 0
