"""Sampled output with speculation follows the target distribution end to end (tiny random model,
temperature 1): the joint distribution of the first generated tokens, speculation on vs off, agrees by a
two-sample chi-square bound. Seeds are fixed (sampling_seed per request), so the test is deterministic;
the bound is one a wrong rejection rule (e.g. accepting a draft with probability 1, or resampling a
rejected position from p instead of p without the draft) exceeds many times over."""

from __future__ import annotations

import pytest

from radixlm.runtime.engine import Engine

from tests.runtime.test_sampler import chi_square_critical

A, B = 100, 101  # the prompt alternates A B; logit_bias makes them likely but far from certain (~0.4 each)
PROMPT = [A, B] * 6
N = 1000
NEW = 4


def _cells(engine: Engine, seed0: int) -> list[int]:
    """Per request, its first 3 tokens bucketed (A, B, other) into one of 27 cells."""
    params = [{"max_new_tokens": NEW, "temperature": 1.0, "sampling_seed": seed0 + i,
               "logit_bias": {A: 7.0, B: 7.0}} for i in range(N)]
    out = engine.generate(input_ids=[PROMPT] * N, sampling_params=params)
    cells = []
    for r in out:
        ids = r["output_ids"][:3]
        code = 0
        for tok in ids:
            code = 3 * code + (0 if tok == A else 1 if tok == B else 2)
        cells.append(code)
    return cells


def two_sample_stat(x: list[int], y: list[int], bins: int) -> tuple[float, int]:
    """Chi-square statistic of two equal-size samples over `bins` cells, and its degrees of freedom."""
    stat, used = 0.0, 0
    for c in range(bins):
        cx, cy = x.count(c), y.count(c)
        if cx + cy:
            stat += (cx - cy) ** 2 / (cx + cy)
            used += 1
    return stat, used - 1


@pytest.fixture(scope="module")
def plain_cells(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=1 << 16, max_running_requests=512) as eng:
        return _cells(eng, 10_000)


def _assert_spec_matches_plain(model_dir, plain_cells, seed0: int, **spec_options) -> None:
    with Engine(str(model_dir), max_total_tokens=1 << 16, max_running_requests=512, **spec_options) as eng:
        cells = _cells(eng, seed0)
        stats = eng.scheduler.spec.stats
        # The drafts were there and were both accepted and rejected: the test exercises both branches.
        assert stats.num_accepted > N // 10 and stats.num_proposed - stats.num_accepted > N // 2
        eng.check_integrity()
    stat, df = two_sample_stat(cells, plain_cells, 27)
    assert stat < chi_square_critical(df), (stat, df)


def test_ngram_sampled_distribution_equals_plain(tiny_llama_dir, plain_cells):
    _assert_spec_matches_plain(tiny_llama_dir, plain_cells, 20_000, speculative_algorithm="NGRAM",
                               speculative_num_draft_tokens=3)


def test_draft_model_sampled_distribution_equals_plain(tiny_llama_dir, tmp_path_factory, plain_cells):
    """STANDALONE with a random draft: drafts are sampled from the draft's own distribution q (which
    knows nothing of the logit_bias) and verified by rejection sampling against q. (Verifying such a draft
    as a point mass would also be exact but accept far less: the acceptance bound catches that; resampling
    a rejection from p instead of max(0, p - q) gives a statistic of ~115 against a bound of ~54.)"""
    from radixlm.testing import build_tiny_model

    draft = build_tiny_model(tmp_path_factory.mktemp("tiny_draft_q"), "llama", seed=5)
    _assert_spec_matches_plain(tiny_llama_dir, plain_cells, 30_000, speculative_algorithm="STANDALONE",
                               speculative_draft_model_path=str(draft), speculative_num_draft_tokens=2,
                               speculative_min_acceptance=0.0)
