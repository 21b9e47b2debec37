"""Sampler against independent references: transformers' logits processors / warpers and plain-Python loops."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from radixlm.runtime.sampling.sampler import Sampler, SamplingRow, inverse_cdf_sample, make_generator, support_mask
from radixlm.sampling_params import SamplingParams

EOS = 5


def make_row(prompt=(), output=(), seed=None, mask=None, **params) -> SamplingRow:
    p = SamplingParams(**params)
    p.normalize()
    return SamplingRow(params=p, prompt_ids=list(prompt), output_ids=list(output),
                       generator=make_generator(seed), allowed_mask=mask)


def rand_logits(seed: int, b: int, v: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * scale


def hf_support(logits: torch.Tensor, t: float, k: int, p: float, m: float) -> torch.Tensor:
    """The tokens HF generate() can sample: its warpers in its own order, finite scores survive."""
    procs = [TemperatureLogitsWarper(t)] + ([TopKLogitsWarper(k)] if k > 0 else []) + \
        ([TopPLogitsWarper(p)] if p < 1 else []) + ([MinPLogitsWarper(m)] if m > 0 else [])
    scores = logits.clone()
    for proc in procs:
        scores = proc(torch.zeros(logits.shape[0], 1, dtype=torch.long), scores)
    return torch.isfinite(scores)


def raw_logprobs(logits: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(token_ids).view(-1, 1)).view(-1)


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09 -> p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_distribution(tokens: list[int], probs: torch.Tensor) -> None:
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token outside the support"
    expected = probs.double()[support] * len(tokens)
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    assert stat < chi_square_critical(int(support.sum()) - 1), stat


# ---- greedy, logprobs, padding -----------------------------------------------------------------
def test_greedy_is_argmax_and_fast_path_has_no_copy():
    logits = rand_logits(0, 8, 300)
    rows = [make_row(temperature=0.0) for _ in range(4)] + [make_row(top_k=1) for _ in range(4)]
    sampler = Sampler(300, frozenset({EOS}))
    out = sampler(logits, rows)
    assert out.token_ids == logits.argmax(-1).tolist()
    torch.testing.assert_close(torch.tensor(out.logprobs), raw_logprobs(logits, out.token_ids), atol=1e-6, rtol=0)
    assert sampler.processed_logits(logits, rows).data_ptr() == logits.data_ptr()


def test_padded_columns_never_chosen_and_logprobs_cover_raw_row():
    logits = rand_logits(1, 400, 110)
    logits[:, 100:] = 50.0  # padding columns past the tokenizer's vocabulary
    rows = [make_row(temperature=0.0)] + [make_row(temperature=1.5) for _ in range(399)]
    out = Sampler(100, frozenset({EOS}))(logits, rows)
    assert max(out.token_ids) < 100
    assert out.token_ids[0] == int(logits[0, :100].argmax())
    torch.testing.assert_close(torch.tensor(out.logprobs), raw_logprobs(logits, out.token_ids), atol=1e-6, rtol=0)


# ---- filters -------------------------------------------------------------------------------------
FILTER_CASES = [(1.0, 5, 1.0, 0.0), (0.7, -1, 0.9, 0.0), (1.3, -1, 1.0, 0.1), (1.0, 20, 0.8, 0.0),
                (0.5, 10, 0.95, 0.05), (1.0, -1, 0.3, 0.0), (2.0, 3, 0.5, 0.5), (1.0, 1000, 0.99, 0.0)]


@pytest.mark.parametrize("t,k,p,m", FILTER_CASES)
def test_support_mask_equals_hf_warpers(t, k, p, m):
    # num_candidates < W exercises the candidate search and its fallback to a full sort.
    for seed in range(8):
        logits = rand_logits(seed, 4, 200)
        top_ks = torch.full((4,), k if 0 < k <= 200 else 200)
        expected = hf_support(logits, t, k, p, m)
        for num_candidates in (4, 16, 1024):
            got = support_mask(logits / t, top_ks, torch.full((4,), p if p < 1 else 2.0), torch.full((4,), m),
                               num_candidates=num_candidates)
            assert torch.equal(got, expected), (seed, num_candidates)


def test_ties_kept_like_hf():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    for num_candidates in (2, 3, 6):  # ties that run past the candidates force the full sort
        got = support_mask(logits, torch.tensor([2]), torch.tensor([2.0]), torch.tensor([0.0]), num_candidates)
        assert torch.equal(got, hf_support(logits, 1.0, 2, 1.0, 0.0))
        assert got.tolist() == [[True, True, True, True, False, False]]
    # min_p = 1 keeps exactly the tokens tied with the most likely one (p >= min_p * p_max).
    logits = torch.tensor([[3.0, 1.0, 3.0, 0.5]])
    got = support_mask(logits, torch.tensor([4]), torch.tensor([2.0]), torch.tensor([1.0]))
    assert torch.equal(got, hf_support(logits, 1.0, -1, 1.0, 1.0))
    assert got.tolist() == [[True, False, True, False]]


@pytest.mark.parametrize("t,k,p,m", FILTER_CASES[:6])
def test_sampled_tokens_cover_exactly_the_reference_support(t, k, p, m):
    logits = rand_logits(7, 1, 60, scale=1.0)
    support = hf_support(logits, t, k, p, m)[0]
    probs = torch.softmax((logits[0] / t).masked_fill(~support, float("-inf")), -1)
    torch.manual_seed(0)
    # Filtered rows interleaved with unfiltered ones: thresholds go to the right rows only.
    rows = [make_row(temperature=t, top_k=k, top_p=p, min_p=m), make_row(temperature=t)] * 4000
    sampled = set(Sampler(60, frozenset({EOS}))(logits.expand(8000, -1), rows).token_ids[::2])
    assert sampled <= set(torch.nonzero(support).view(-1).tolist())
    likely = set(torch.nonzero(probs > 0.005).view(-1).tolist())  # missed with prob < 1e-8 each
    assert likely <= sampled


@pytest.mark.parametrize("seeded", [False, True])
def test_empirical_distribution_matches_softmax(seeded):
    logits = rand_logits(3, 1, 20, scale=1.0)
    n = 6000
    torch.manual_seed(1)
    rows = [make_row(temperature=0.7, seed=i if seeded else None) for i in range(n)]
    out = Sampler(20, frozenset({EOS}))(logits.expand(n, -1), rows)
    assert_distribution(out.token_ids, torch.softmax(logits[0] / 0.7, -1))


def test_filtered_distribution_matches_renormalised_support():
    logits = rand_logits(4, 1, 30, scale=1.0)
    n = 6000
    support = hf_support(logits, 0.9, 12, 0.8, 0.05)[0]
    torch.manual_seed(2)
    rows = [make_row(temperature=0.9, top_k=12, top_p=0.8, min_p=0.05) for _ in range(n)]
    out = Sampler(30, frozenset({EOS}))(logits.expand(n, -1), rows)
    assert_distribution(out.token_ids, torch.softmax((logits[0] / 0.9).masked_fill(~support, -math.inf), -1))


def test_inverse_cdf_sample_equals_linear_search():
    g = torch.Generator().manual_seed(12)
    probs = torch.rand(3, 4 * 256, generator=g) ** 4
    probs[0, 300:] = 0.0  # zero-mass tail, including whole blocks
    probs[1, ::2] = 0.0
    probs[2, :700] = 0.0
    uniforms = [0.0, 1e-7, 0.25, 0.5, 0.9, 0.999999, 1.0 - 2.0**-24]
    for u in uniforms:
        got = inverse_cdf_sample(probs, torch.full((3,), u), num_blocks=4).tolist()
        for row in range(3):  # reference: one flat float64 cumulative sum, first entry above u * total
            cumulative = probs[row].double().cumsum(0)
            expected = int(torch.nonzero(cumulative > u * cumulative[-1])[0])
            assert got[row] == expected and probs[row, got[row]] > 0, (u, row)


def test_multi_block_distribution_matches_softmax():
    v, n = 3000, 5000  # 3 blocks of 1000; check the mass of 30 token groups
    logits = rand_logits(13, 1, v, scale=1.0)
    torch.manual_seed(5)
    out = Sampler(v, frozenset({EOS}))(logits.expand(n, -1), [make_row(temperature=1.0) for _ in range(n)])
    groups = torch.tensor(out.token_ids) // 100
    group_probs = torch.softmax(logits[0], -1).view(30, 100).sum(-1)
    assert_distribution(groups.tolist(), group_probs)


def test_same_seed_same_tokens_in_any_batch():
    v, steps = 2500, 12  # 3 sampling blocks of 834 plus padding
    target = [rand_logits(100 + s, 1, v, scale=1.0) for s in range(steps)]
    params = dict(temperature=0.9, top_p=0.95, top_k=200)
    sampler = Sampler(v, frozenset({EOS}))

    def run(seed: int, position: int, neighbours) -> list[int]:
        row = make_row(seed=seed, **params)
        tokens = []
        for s in range(steps):
            others = [make_row(**kw) for kw in neighbours]
            rows = others[:position] + [row] + others[position:]
            batch = rand_logits(900 + s, len(rows), v)
            batch[position] = target[s][0]
            tokens.append(sampler(batch, rows).token_ids[position])
            row.output_ids.append(tokens[-1])
        return tokens

    alone = run(7, 0, [])
    crowd = [dict(temperature=1.0), dict(temperature=0.5, seed=8, min_p=0.1), dict(temperature=0.0),
             dict(temperature=1.2, top_k=3, seed=9)]
    assert run(7, 2, crowd) == alone
    assert run(7, 4, crowd) == alone
    assert run(8, 0, []) != alone


# ---- processors ----------------------------------------------------------------------------------
def test_repetition_penalty_equals_hf():
    logits = rand_logits(5, 3, 80)
    rows = [make_row(prompt=[3, 5, 5, 9], output=[9, 11], repetition_penalty=1.3),
            make_row(prompt=[1, 2], output=[], repetition_penalty=0.7),
            make_row(prompt=[4, 6])]
    got = Sampler(80, frozenset({EOS})).processed_logits(logits, rows)
    for i, r in enumerate(rows):
        proc = RepetitionPenaltyLogitsProcessor(r.params.repetition_penalty)
        expected = proc(torch.tensor([r.prompt_ids + r.output_ids]), logits[i:i + 1].clone())
        torch.testing.assert_close(got[i:i + 1], expected, atol=0, rtol=0)


def reference_processors(logits: list[float], r: SamplingRow) -> list[float]:
    """Straightforward per-token loops in the documented order."""
    out = list(logits)
    for t, b in r.params.logit_bias.items():
        out[t] += b
    pen = r.params.repetition_penalty
    for t in set(r.prompt_ids + r.output_ids):
        out[t] = out[t] * pen if out[t] < 0 else out[t] / pen
    for t in set(r.output_ids):
        out[t] -= r.params.frequency_penalty * r.output_ids.count(t) + r.params.presence_penalty
    return out


def test_bias_and_penalties_shift_logits_as_specified():
    logits = rand_logits(6, 4, 40)
    rows = [make_row(output=[1, 1, 1, 2, 7], frequency_penalty=0.5, presence_penalty=1.5),
            make_row(output=[3, 3], frequency_penalty=-1.0, logit_bias={3: 2.0, 39: -100.0}),
            make_row(prompt=[2, 4], output=[4, 4, 8], logit_bias={2: -3.0}, repetition_penalty=1.5,
                     frequency_penalty=0.25, presence_penalty=-0.5),
            make_row(output=[1, 2, 3])]
    got = Sampler(40, frozenset({EOS})).processed_logits(logits, rows)
    for i, r in enumerate(rows):
        expected = torch.tensor(reference_processors(logits[i].tolist(), r))
        torch.testing.assert_close(got[i], expected, atol=1e-5, rtol=0)
    assert torch.equal(got[3], logits[3])


def test_min_new_tokens_blocks_eos_and_stop_token_ids():
    logits = torch.arange(20, dtype=torch.float32).repeat(3, 1)
    logits[:, EOS] = 100.0
    logits[:, 7] = 90.0
    sampler = Sampler(20, frozenset({EOS, 19}))
    rows = [make_row(output=[1], min_new_tokens=2, stop_token_ids=[7], temperature=0.0),
            make_row(output=[1, 2], min_new_tokens=2, stop_token_ids=[7], temperature=0.0),
            make_row(output=[1], min_new_tokens=3, stop_token_ids=[7], temperature=1.0)]
    got = sampler.processed_logits(logits, rows)
    assert torch.isneginf(got[0, [EOS, 7, 19]]).all() and torch.isneginf(got[2, [EOS, 7, 19]]).all()
    assert torch.equal(got[1], logits[1]) and torch.isfinite(got[0]).sum() == 17
    assert sampler(logits, rows).token_ids[:2] == [18, EOS]
    torch.manual_seed(3)
    many = [make_row(output=[1], min_new_tokens=2, stop_token_ids=[7], temperature=2.0) for _ in range(500)]
    assert not {EOS, 7, 19} & set(sampler(logits[:1].expand(500, -1), many).token_ids)


def test_allowed_mask_respected_and_short_masks_pad_with_false():
    v = 120
    logits = rand_logits(8, 1, v)
    mask = torch.rand(v - 20, generator=torch.Generator().manual_seed(9)) < 0.1
    allowed = set(torch.nonzero(mask).view(-1).tolist())
    sampler = Sampler(v, frozenset({EOS}))
    rows = [make_row(temperature=0.0, mask=mask)] + [make_row(temperature=1.5, mask=mask) for _ in range(999)]
    torch.manual_seed(4)
    out = sampler(logits.expand(1000, -1), rows)
    best = max(allowed, key=lambda t: float(logits[0, t]))
    assert out.token_ids[0] == best
    assert set(out.token_ids) <= allowed and len(set(out.token_ids)) > 1


def test_dead_end_falls_back_to_eos_without_nan():
    logits = rand_logits(10, 3, 30)
    nothing = torch.zeros(30, dtype=torch.bool)
    only_eos = nothing.clone()
    only_eos[EOS] = True
    rows = [make_row(temperature=0.0, mask=nothing), make_row(temperature=1.0, top_p=0.5, mask=nothing),
            make_row(temperature=1.0, output=[], min_new_tokens=1, mask=only_eos)]
    out = Sampler(30, frozenset({EOS, 9}))(logits, rows)
    assert out.token_ids == [EOS, EOS, EOS]
    assert all(math.isfinite(x) for x in out.logprobs)


def test_large_vocab_smoke():
    v = 49152
    logits = rand_logits(11, 4, v)
    rows = [make_row(temperature=0.0), make_row(temperature=0.8, top_p=0.9, top_k=50, seed=1),
            make_row(temperature=1.0, min_p=0.05, output=[1, 2, 2], frequency_penalty=0.3),
            make_row(temperature=1.0, repetition_penalty=1.2, prompt=list(range(100)), logit_bias={3: 5.0})]
    before = logits.clone()
    out = Sampler(v, frozenset({0}))(logits, rows)
    assert torch.equal(logits, before), "the caller's logits must not be modified"
    assert out.token_ids[0] == int(logits[0].argmax())
    # Full-size supports: a peaked top-k/top-p row, and a flat top-p row whose kept set is far
    # larger than the candidate window (so the full-sort fallback runs).
    for t, k, p, m in [(0.8, 50, 0.9, 0.0), (1.0, -1, 0.9, 0.0), (0.7, -1, 1.0, 0.02)]:
        top_ks, top_ps = torch.full((2,), k if k > 0 else v), torch.full((2,), p if p < 1 else 2.0)
        got = support_mask(logits[:2] / t, top_ks, top_ps, torch.full((2,), m))
        assert torch.equal(got, hf_support(logits[:2], t, k, p, m))
    assert all(0 <= t < v for t in out.token_ids)
    torch.testing.assert_close(torch.tensor(out.logprobs), raw_logprobs(logits, out.token_ids), atol=1e-6, rtol=0)



def test_argmax_rows_matches_torch_argmax_on_ties_nan_and_views():
    from radixlm.runtime.sampling.sampler import argmax_rows

    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(3))
    x[1, 7] = x[1, 30] = 99.0  # a tie: the first index wins
    x[2, 11] = float("nan")  # NaN counts as the maximum, as in torch
    x[3] = float("-inf")  # a dead row
    view = x[:, :33]  # the sampler's vocabulary view: rows with a stride
    for t in (x, view, x.index_select(0, torch.tensor([4, 1]))):
        got = argmax_rows(t)
        assert got.dtype == torch.int64 and torch.equal(got, t.argmax(dim=-1))
    assert argmax_rows(x)[1] == 7 and argmax_rows(x)[2] == 11
