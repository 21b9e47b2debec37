"""TritonAttentionBackend vs the torch backend (layers/attention.py) on the same pool and metadata."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from radixlm.runtime.forward import AttentionMetadata  # noqa: E402
from radixlm.runtime.model.layers.attention import TorchAttentionBackend  # noqa: E402
from radixlm.runtime.model.layers.attention_triton import TritonAttentionBackend  # noqa: E402

LAYER = 1


def _setup(paged_batch, device, prefix_lens, extend_lens, group, head_dim, seed=0):
    batch = paged_batch(prefix_lens, extend_lens, 2, group, head_dim, torch.float32, device,
                        table_dtype=torch.int64, seed=seed)
    # slot 0 is the scheduler's scratch slot (finite); the torch backend reads it for padding
    batch.k_buffer[0] = 0.0
    batch.v_buffer[0] = 0.0
    pool = SimpleNamespace(k_buffer=[torch.zeros_like(batch.k_buffer), batch.k_buffer],
                           v_buffer=[torch.zeros_like(batch.v_buffer), batch.v_buffer])
    starts = batch.extend_start_loc.tolist()
    meta = AttentionMetadata(
        req_to_token=batch.req_to_token, req_pool_indices=batch.req_pool_indices, seq_lens=batch.seq_lens,
        prefix_lens=batch.prefix_lens, extend_lens=batch.extend_lens, extend_start_loc=batch.extend_start_loc,
        out_cache_loc=batch.out_cache_loc,
        is_decode=all(e == 1 and p > 0 for e, p in zip(extend_lens, prefix_lens)),
        sm_scale=head_dim ** -0.5, seq_lens_list=batch.seq_lens.tolist(), prefix_lens_list=list(prefix_lens),
        extend_lens_list=list(extend_lens), extend_start_loc_list=starts,
    )
    return batch, pool, meta


def _clone_pool(pool):
    return SimpleNamespace(k_buffer=[b.clone() for b in pool.k_buffer], v_buffer=[b.clone() for b in pool.v_buffer])


@pytest.mark.parametrize("prefix_lens,extend_lens,group,head_dim", [
    ([0, 6, 11], [7, 1, 3], 3, 64),  # mixed: fresh prompt, decode row, chunked-prefill continuation
    ([4, 9, 15], [1, 1, 1], 1, 128),  # pure decode batch: takes the split-K kernel
    ([2, 14], [1, 1], 8, 64),
])
def test_triton_backend_matches_torch_backend(device, paged_batch, tol, prefix_lens, extend_lens, group,
                                              head_dim):
    batch, pool, meta = _setup(paged_batch, device, prefix_lens, extend_lens, group, head_dim)
    torch_pool = _clone_pool(pool)
    got = TritonAttentionBackend().forward(batch.q, batch.k_new, batch.v_new, LAYER, pool, meta)
    want = TorchAttentionBackend().forward(batch.q, batch.k_new, batch.v_new, LAYER, torch_pool, meta)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    for mine, theirs in ((pool.k_buffer, torch_pool.k_buffer), (pool.v_buffer, torch_pool.v_buffer)):
        torch.testing.assert_close(mine[LAYER], theirs[LAYER], equal_nan=True, atol=0, rtol=0)
        assert not mine[0].any(), "other layers are untouched"


def test_decode_batches_take_the_split_k_kernel(device, paged_batch, tol, monkeypatch):
    import radixlm.runtime.model.layers.attention_triton as backend_module

    calls = []
    real = backend_module.decode_attention

    def spy(*args, **kwargs):
        calls.append(kwargs["num_kv_splits"])
        return real(*args, **kwargs)

    monkeypatch.setattr(backend_module, "decode_attention", spy)
    batch, pool, meta = _setup(paged_batch, device, [3, 18], [1, 1], 3, 64, seed=2)
    one = TritonAttentionBackend(num_kv_splits=1).forward(batch.q, batch.k_new, batch.v_new, LAYER, pool, meta)
    many = TritonAttentionBackend(num_kv_splits=5).forward(batch.q, batch.k_new, batch.v_new, LAYER, pool, meta)
    torch.testing.assert_close(one, many, **tol(torch.float32))
    assert calls == [1, 5]
