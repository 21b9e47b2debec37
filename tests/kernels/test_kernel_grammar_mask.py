"""Grammar bitmask kernel vs its torch reference, and the reference vs a per-token bit loop."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from radixlm.kernels.grammar_mask import (  # noqa: E402
    apply_grammar_bitmask_, apply_grammar_bitmask_reference, unpack_bitmask,
)


def _random_bitmask(batch: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (batch, (vocab + 31) // 32), generator=gen, dtype=torch.int64)
    words[0] = -1  # all allowed (every bit set, including the sign bit)
    words[1] = 0  # nothing allowed
    return words.to(torch.int32)


def test_reference_matches_bit_loop():
    vocab = 70
    mask = _random_bitmask(3, vocab, seed=0)
    allowed = unpack_bitmask(mask, vocab)
    for b in range(3):
        for t in range(vocab):
            word = int(mask[b, t // 32]) & 0xFFFFFFFF
            assert bool(allowed[b, t]) == bool((word >> (t % 32)) & 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [70, 5000])  # 70: partial last word; 5000: several column blocks
def test_bitmask_matches_reference(device, dtype, vocab):
    logits = torch.randn(4, vocab).to(dtype=dtype, device=device)
    mask = _random_bitmask(4, vocab, seed=vocab).to(device)
    want = apply_grammar_bitmask_reference(logits, mask)
    apply_grammar_bitmask_(logits, mask)
    assert torch.equal(logits, want)
    assert torch.isinf(logits[1]).all() and not torch.isinf(logits[0]).any()


def test_bitmask_on_strided_rows(device):
    # logits rows taken from a wider buffer (e.g. padded vocab): only the viewed columns change
    big = torch.randn(3, 100, device=device)
    logits = big[:, :70]
    mask = _random_bitmask(3, 70, seed=5).to(device)
    want = apply_grammar_bitmask_reference(logits, mask)
    tail = big[:, 70:].clone()
    apply_grammar_bitmask_(logits, mask)
    assert torch.equal(logits, want) and torch.equal(big[:, 70:], tail)


def test_rejects_wrong_word_count(device):
    with pytest.raises(AssertionError):
        apply_grammar_bitmask_(torch.randn(2, 64, device=device), torch.zeros(2, 3, dtype=torch.int32, device=device))
