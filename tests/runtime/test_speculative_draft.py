"""STANDALONE speculation (a draft model): exact with a random draft (tiny models), and a model drafting for
itself accepts (almost) everything: a correctness check of the draft's own KV pool and its rollback."""

from __future__ import annotations

import pytest

from radixlm.runtime.engine import Engine
from radixlm.testing import build_tiny_model

PROMPTS = ["Once upon a time there was a dog. Once upon a time", "def main():\n    print(1)", "1 2 3 4 1 2 3"]
GREEDY = {"max_new_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_draft"), "llama", seed=5)


@pytest.fixture(scope="module")
def want(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=4096) as eng:
        return {"greedy": [r["output_ids"] for r in eng.generate(PROMPTS, GREEDY)],
                "stop": eng.generate(PROMPTS[0], {**GREEDY, "stop_token_ids": [0]})["output_ids"]}


def standalone(target, draft, **kw):
    return Engine(str(target), max_total_tokens=kw.pop("max_total_tokens", 4096), speculative_algorithm="STANDALONE",
                  speculative_draft_model_path=str(draft), speculative_num_draft_tokens=4, **kw)


def test_random_draft_is_exact_and_leaks_nothing(tiny_llama_dir, other_draft, want):
    with standalone(tiny_llama_dir, other_draft) as eng:
        assert [r["output_ids"] for r in eng.generate(PROMPTS, GREEDY)] == want["greedy"]
        sampled = eng.generate(PROMPTS, {"max_new_tokens": 16, "temperature": 0.9, "sampling_seed": 3,
                                          "ignore_eos": True})
        assert all(len(r["output_ids"]) == 16 for r in sampled)
        eng.check_integrity()  # target and draft pools, idle


def test_self_draft_accepts_everything(tiny_llama_dir, want):
    with standalone(tiny_llama_dir, tiny_llama_dir, chunked_prefill_size=16) as eng:
        out = eng.generate(PROMPTS * 2, GREEDY)
        assert [r["output_ids"] for r in out] == want["greedy"] * 2
        stats = eng.scheduler.spec.stats
        assert stats.num_proposed > 0 and stats.num_accepted >= 0.95 * stats.num_proposed
        assert eng.scheduler.num_forward_steps < 24  # ~24 / (1 + 4) verify steps per request, batched
        eng.check_integrity()


def test_self_draft_sampled_accepts_almost_everything(tiny_llama_dir):
    """Sampled requests: the draft samples from its own distribution, which equals the target's (the same
    model, no penalties), so rejection sampling against q accepts ~everything (the argmax alone would be
    accepted with probability p(argmax) only)."""
    params = {"max_new_tokens": 24, "temperature": 1.0, "top_p": 0.95, "sampling_seed": 4, "ignore_eos": True}
    with standalone(tiny_llama_dir, tiny_llama_dir) as eng:
        out = eng.generate(PROMPTS * 2, params)
        assert all(len(r["output_ids"]) == 24 for r in out)
        stats = eng.scheduler.spec.stats
        assert stats.num_proposed > 0 and stats.num_accepted >= 0.9 * stats.num_proposed
        eng.check_integrity()


def test_self_draft_under_retraction(tiny_llama_dir, want):
    with standalone(tiny_llama_dir, tiny_llama_dir, max_total_tokens=120) as eng:
        out = eng.generate(PROMPTS * 2, GREEDY)
        assert [r["output_ids"] for r in out] == want["greedy"] * 2
        eng.check_integrity()
