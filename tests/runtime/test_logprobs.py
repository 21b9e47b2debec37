"""Logprob helpers against torch.log_softmax (the reference transformers' log-softmax uses)."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.sampling.logprobs import logprobs_of_ids, token_logprobs, top_logprobs


def _logits(seed: int, n: int = 6, v: int = 500, scale: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g) * scale


@pytest.mark.parametrize("scale", [1.0, 4.0, 12.0])
def test_token_logprobs_equal_log_softmax(scale):
    logits = _logits(0, scale=scale)
    targets = torch.randint(0, logits.shape[1], (logits.shape[0],), generator=torch.Generator().manual_seed(1))
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(logits.shape[0]), targets]
    torch.testing.assert_close(token_logprobs(logits, targets), expected, atol=1e-6, rtol=0)


def test_top_logprobs_sorted_and_equal_reference():
    logits = _logits(2)
    values, ids = top_logprobs(logits, 7)
    reference = torch.log_softmax(logits, dim=-1)
    assert values.shape == ids.shape == (logits.shape[0], 7)
    assert bool((values[:, :-1] >= values[:, 1:]).all()), "top logprobs must be sorted descending"
    torch.testing.assert_close(values, reference.gather(1, ids), atol=1e-6, rtol=0)
    # The ids are really the k largest: nothing outside them beats the k-th value.
    for row in range(logits.shape[0]):
        others = torch.ones(logits.shape[1], dtype=torch.bool)
        others[ids[row]] = False
        assert float(reference[row][others].max()) <= float(values[row, -1])


def test_top_logprobs_k_zero_and_bounds():
    values, ids = top_logprobs(_logits(3), 0)
    assert values.shape == (6, 0) and ids.shape == (6, 0)
    with pytest.raises(ValueError):
        top_logprobs(_logits(3, v=10), 11)


def test_logprobs_of_ids_equal_reference():
    logits = _logits(4)
    ids = [0, 17, 499, 17]
    expected = torch.log_softmax(logits, dim=-1)[:, ids]
    torch.testing.assert_close(logprobs_of_ids(logits, ids), expected, atol=1e-6, rtol=0)
    assert logprobs_of_ids(logits, []).shape == (6, 0)
    with pytest.raises(ValueError):
        logprobs_of_ids(logits, [500])


def test_neg_inf_entries_and_half_precision():
    logits = _logits(5, v=64)
    logits[:, 10:20] = float("-inf")
    targets = torch.tensor([0, 10, 63, 15, 1, 2])
    got = token_logprobs(logits, targets)
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(6), targets]
    assert torch.equal(torch.isneginf(got), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(got[finite], expected[finite], atol=1e-6, rtol=0)
    # bf16 logits are upcast to float32 before the math, as the reference does.
    half = _logits(6, v=64).bfloat16()
    expected = torch.log_softmax(half.float(), dim=-1)[:, 3]
    torch.testing.assert_close(token_logprobs(half, torch.full((6,), 3)), expected, atol=1e-6, rtol=0)
