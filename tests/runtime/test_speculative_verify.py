"""Speculative rejection sampling follows the target distribution exactly (statistical, fixed seeds), and
the n-gram proposer's lookups, against plain-Python references."""

from __future__ import annotations

import math

import torch

from radixlm.runtime.sampling.sampler import Sampler, SamplingRow, make_generator
from radixlm.runtime.speculative.adaptive import AdaptiveState
from radixlm.runtime.speculative.ngram import NgramCorpus, NgramIndex, propose_ngram
from radixlm.runtime.speculative.verify import verify_sampled
from radixlm.sampling_params import SamplingParams

from tests.runtime.test_sampler import assert_distribution, hf_support, rand_logits

EOS = 5


def row(seed=None, output=(), **params) -> SamplingRow:
    p = SamplingParams(**params)
    p.normalize()
    return SamplingRow(params=p, prompt_ids=[1, 2], output_ids=list(output), generator=make_generator(seed))


def emitted(logits, draft, n, **params) -> tuple[list[int], int]:
    sampler = Sampler(logits.shape[-1], frozenset({EOS}))
    r = row(seed=7, **params)
    tokens, accepted = [], 0
    for _ in range(n):
        tok, ok = verify_sampled(sampler, logits, r, None, draft)
        tokens.append(tok)
        accepted += ok
        assert ok == (tok == draft)
    return tokens, accepted


def test_rejection_sampling_matches_softmax_for_a_likely_draft():
    logits = rand_logits(3, 1, 20, scale=1.0)
    probs = torch.softmax(logits[0] / 0.7, -1)
    draft = int(probs.argmax())
    tokens, accepted = emitted(logits, draft, 6000, temperature=0.7)
    assert_distribution(tokens, probs)
    assert abs(accepted / 6000 - float(probs[draft])) < 4 * math.sqrt(0.25 / 6000)  # P(accept) = p(draft)


def test_rejection_sampling_matches_filtered_distribution_for_an_unlikely_draft():
    logits = rand_logits(4, 1, 30, scale=1.0)
    support = hf_support(logits, 0.9, 12, 0.8, 0.05)[0]
    probs = torch.softmax((logits[0] / 0.9).masked_fill(~support, -math.inf), -1)
    outside = int(torch.nonzero(~support)[0])
    tokens, accepted = emitted(logits, outside, 4000, temperature=0.9, top_k=12, top_p=0.8, min_p=0.05)
    assert accepted == 0  # a draft outside top-k/top-p/min-p is never accepted
    assert_distribution(tokens, probs)
    inside = int(torch.nonzero(support)[-1])  # the least likely kept token
    tokens, _ = emitted(logits, inside, 4000, temperature=0.9, top_k=12, top_p=0.8, min_p=0.05)
    assert_distribution(tokens, probs)


def test_rejection_sampling_applies_penalties_first():
    logits = rand_logits(5, 1, 16, scale=1.0)
    output = [3, 3, 9]
    shifted = logits[0].clone()
    shifted[3] -= 2 * 1.5  # frequency penalty: 1.5 per occurrence (OpenAI semantics)
    shifted[9] -= 1.5
    probs = torch.softmax(shifted, -1)
    sampler = Sampler(16, frozenset({EOS}))
    r = row(seed=3, output=output, temperature=1.0, frequency_penalty=1.5)
    tokens = [verify_sampled(sampler, logits, r, None, 3)[0] for _ in range(5000)]
    assert_distribution(tokens, probs)


def _reference_lookup(seq, n):
    """Latest earlier occurrence of seq's last n tokens (ending before the last position)."""
    suffix = seq[-n:]
    for end in range(len(seq) - 1, n - 1, -1):
        if seq[end - n : end] == suffix:
            return end
    return None


def test_ngram_index_equals_a_scan_as_the_sequence_grows():
    g = torch.Generator().manual_seed(0)
    seq: list[int] = []
    index = NgramIndex(1, 4)
    for _ in range(300):
        seq.append(int(torch.randint(0, 6, (1,), generator=g)))
        for n in range(1, 5):
            if n <= len(seq):
                assert index.lookup(seq, n) == _reference_lookup(seq, n), (len(seq), n)


def test_propose_prefers_the_longest_match_and_uses_the_corpus_per_namespace():
    corpus = NgramCorpus(2, 4, k=3)
    corpus.add("a", [10, 11, 12, 13, 14, 15])
    seq = [1, 2, 3, 1, 2, 7, 10, 11, 12]
    # own text: [1, 2] -> 3 (a 2-gram); the corpus has the 3-gram [10, 11, 12] -> 13, 14, 15: longer wins
    assert propose_ngram(seq, NgramIndex(2, 4), corpus, "a", 3) == ([13, 14, 15], 3)
    assert propose_ngram(seq, NgramIndex(2, 4), corpus, "b", 3) == ([], 0)  # another tenant's text: never
    assert propose_ngram([1, 2, 3, 1, 2], NgramIndex(2, 4), corpus, "a", 3) == ([3, 1, 2], 2)


def test_adaptive_turns_down_then_off_then_back():
    state = AdaptiveState(k=4)
    steps = 0
    while state.k > 1 or state.cooldown == 0:  # every proposal rejected
        assert state.wants_proposal()
        state.update(state.k, 0, 4, 0.25)
        steps += 1
    assert steps <= 5  # 4 -> 2 -> 1 -> off within a few steps
    skipped = 0
    while not state.wants_proposal():
        skipped += 1
    assert skipped == 8
    for _ in range(10):
        state.update(state.k, state.k, 4, 0.25)
    assert state.k == 4


def test_options_use_sglang_names_and_are_validated():
    import argparse

    import pytest

    from radixlm.runtime.cli_flags import ENGINE_CONFIGS, add_dataclass_flags, dataclass_values
    from radixlm.runtime.config import EngineConfig, SpeculativeConfig

    ap = argparse.ArgumentParser()
    for cls in ENGINE_CONFIGS:
        add_dataclass_flags(ap, cls)
    args = ap.parse_args(["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/d",
                          "--speculative-num-draft-tokens", "6", "--speculative-num-steps", "3"])
    spec = SpeculativeConfig(**dataclass_values(args, SpeculativeConfig))
    assert (spec.algorithm, spec.max_draft) == ("STANDALONE", 3)
    assert EngineConfig.from_options(speculative_algorithm="ngram").speculative.algorithm == "NGRAM"
    for bad in ({"speculative_algorithm": "EAGLE"}, {"speculative_algorithm": "STANDALONE"},
                {"speculative_num_draft_tokens": 0}, {"speculative_ngram_min_match": 9}):
        with pytest.raises(ValueError):
            SpeculativeConfig(**bad)


def test_dp_ranks_merge_speculative_rates_from_the_sums():
    from radixlm.runtime.server.dp_dispatch import _merge

    def rank(rows, proposed, accepted, per_row):
        return {"speculative": {"spec_verify_rows": rows, "spec_proposed_tokens": proposed,
                                "spec_accepted_tokens": accepted, "spec_acceptance_rate": accepted / proposed,
                                "spec_tokens_per_verify_row": per_row}}

    merged = _merge([rank(2, 8, 4, 3.0), rank(2, 8, 8, 5.0)])["speculative"]
    assert merged["spec_acceptance_rate"] == 0.75 and merged["spec_tokens_per_verify_row"] == 4.0
