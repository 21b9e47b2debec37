"""Speculative verify steps on the compiled CPU ops (layers/attention.py short_extend): each new token of a
short extend row attends over the pool as a decode row would (paged_extend_attention), after rope_store_kv
stored the row's K/V. The same attention as the torch extend path; prefill rows keep the torch path; greedy
outputs stay identical with speculation on and off."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixlm.kernels.cpu import load
from radixlm.runtime.engine import Engine
from radixlm.runtime.forward import AttentionMetadata
from radixlm.runtime.model.layers.attention import MAX_TOKENWISE_EXTEND, TorchAttentionBackend, short_extend

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")

HQ, HKV, D = 6, 2, 64


def _meta(prefix: list[int], new: list[int], slots: int = 256) -> tuple[AttentionMetadata, torch.Tensor]:
    """A batch over a shuffled pool: request r holds prefix[r] cached tokens and new[r] new ones."""
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(slots - 1, generator=gen) + 1  # slot 0 is the scratch slot
    table = torch.zeros(len(prefix) + 2, 64, dtype=torch.int64)
    used, loc = 0, []
    for r, (p, n) in enumerate(zip(prefix, new)):
        table[r + 1, : p + n] = order[used : used + p + n]
        loc.append(table[r + 1, p : p + n])
        used += p + n
    starts = [sum(new[:r]) for r in range(len(new))]
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    meta = AttentionMetadata(
        req_to_token=table, req_pool_indices=t(list(range(1, len(prefix) + 1))),
        seq_lens=t([p + n for p, n in zip(prefix, new)]), prefix_lens=t(prefix), extend_lens=t(new),
        extend_start_loc=t(starts), out_cache_loc=torch.cat(loc),
        is_decode=all(n == 1 and p > 0 for p, n in zip(prefix, new)), sm_scale=D ** -0.5,
        seq_lens_list=[p + n for p, n in zip(prefix, new)], prefix_lens_list=prefix, extend_lens_list=new,
        extend_start_loc_list=starts)
    return meta, torch.Generator().manual_seed(1)


def test_short_extends_with_a_prefix_only_take_the_compiled_path() -> None:
    assert short_extend(_meta([5, 9], [3, 1])[0])
    assert short_extend(_meta([5, 4], [3, MAX_TOKENWISE_EXTEND])[0])
    assert not short_extend(_meta([5, 9], [1, 1])[0])  # a decode batch: decode_stored
    assert not short_extend(_meta([5, 0], [3, 2])[0])  # a fresh prompt: prefill
    assert not short_extend(_meta([5, 4], [3, MAX_TOKENWISE_EXTEND + 1])[0])  # a long chunk: prefill


@needs_compiler
def test_short_extend_attention_equals_the_torch_extend_path() -> None:
    ops = load()
    meta, gen = _meta([7, 20, 3], [5, 1, 9])
    T, S = sum(meta.extend_lens_list), 256
    q, k, v = (torch.randn(T, h, D, generator=gen) for h in (HQ, HKV, HKV))
    pool = [torch.randn(S, HKV, D, generator=gen) for _ in range(2)]

    class Pool:
        k_buffer, v_buffer = [pool[0].clone()], [pool[1].clone()]

    want = TorchAttentionBackend().forward(q, k, v, 0, Pool, meta)  # stores k/v, then SDPA per row
    got = TorchAttentionBackend(ops).extend_stored(q, 0, Pool, meta)  # the K/V are stored now
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


PROMPTS = ["1 2 3 4 1 2 3 4 1 2", '{"name": "Alice", "age": 3} {"name": "Bob", "age": 4} {"name":',
           "def main():\n    print(1)\ndef main():"]


@needs_compiler
def test_verify_steps_take_the_compiled_path_and_greedy_equals_plain(tiny_llama_dir, monkeypatch) -> None:
    calls = []
    extend = TorchAttentionBackend.extend_stored
    monkeypatch.setattr(TorchAttentionBackend, "extend_stored", lambda *a: calls.append(1) or extend(*a))
    params = {"max_new_tokens": 24, "temperature": 0}
    with Engine(str(tiny_llama_dir), max_total_tokens=4096) as plain:
        want = [r["output_ids"] for r in plain.generate(PROMPTS, params)]
    assert not calls  # plain decode and prefill never take it
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, speculative_algorithm="NGRAM",
                speculative_num_draft_tokens=4) as spec:
        assert spec.runner.cpu_ops is not None
        for batch in [[p] for p in PROMPTS], [PROMPTS]:  # lone requests, then one batch
            for _ in range(2):  # the second run is drafted from the first's text
                got = [r["output_ids"] for prompts in batch for r in spec.generate(prompts, params)]
                assert got == want
        assert calls and spec.scheduler.spec.stats.num_accepted > 0
        spec.check_integrity()
