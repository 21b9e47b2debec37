"""RadixAttention inside the engine: shared prefixes computed once, exact cached_tokens, identical greedy
outputs with the cache on, off and under eviction pressure, namespaces, flush, idle invariants."""

from __future__ import annotations

import pytest

from radixlm.runtime.engine import Engine

SHARED = ("Berlin is the capital of Germany. Rome is the capital of Italy. Paris is the capital of France. "
          "The quick brown fox jumps over the lazy dog. A radix tree shares every common prefix. ")
QUESTIONS = ["Question: What is two plus two? Answer:", "Question: What color is the sky? Answer:",
             "Once upon a time", "def main():", '{"name": "Alice"', "1234567890", "yes no maybe", "Rome is"]
GREEDY = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture()
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=4096) as eng:
        yield eng
        eng.check_integrity()  # idle invariants after every test


def test_siblings_compute_shared_prefix_once(engine):
    prompts = [SHARED + q for q in QUESTIONS]
    shared_len = len(engine.tokenizer(SHARED).input_ids)
    total_prompt = sum(len(engine.tokenizer(p).input_ids) for p in prompts)
    before = engine.scheduler.num_computed_tokens
    res = engine.generate(prompts, GREEDY)
    computed = engine.scheduler.num_computed_tokens - before
    cached = [r["meta_info"]["cached_tokens"] for r in res]
    # One request computes the shared prefix; every sibling reuses (almost) all of it.
    assert sorted(cached)[0] == 0
    assert all(c >= shared_len - 2 for c in sorted(cached)[1:])
    stats = engine.cache_stats()
    assert stats["cached_tokens"] == sum(cached)
    assert stats["prompt_tokens"] == total_prompt
    # Tokens through the model: the uncached prompt tokens, then one per decode step (7 per request).
    assert computed == total_prompt - sum(cached) + (GREEDY["max_new_tokens"] - 1) * len(prompts)


def test_cached_tokens_is_exact_for_a_repeated_prompt(engine):
    prompt = SHARED + QUESTIONS[0]
    n = len(engine.tokenizer(prompt).input_ids)
    first = engine.generate(prompt, GREEDY)
    second = engine.generate(prompt, GREEDY)
    assert first["meta_info"]["cached_tokens"] == 0
    # Everything but the last prompt token (its logits are needed to sample) comes from the cache.
    assert second["meta_info"]["cached_tokens"] == n - 1
    assert first["output_ids"] == second["output_ids"]
    # The first request's output tokens were cached too: prompt + output extends the hit.
    longer = engine.tokenizer.decode(engine.tokenizer(prompt).input_ids + first["output_ids"][:4])
    third = engine.generate(longer, GREEDY)
    assert third["meta_info"]["cached_tokens"] >= n


def test_outputs_identical_with_cache_on_off_and_under_eviction(tiny_llama_dir):
    prompts = [SHARED + q for q in QUESTIONS] * 2
    results = {}
    for name, opts in {"off": {"disable_radix_cache": True, "max_total_tokens": 4096},
                       "on": {"max_total_tokens": 4096},
                       "pressure": {"max_total_tokens": 200, "chunked_prefill_size": 64}}.items():
        with Engine(str(tiny_llama_dir), **opts) as eng:
            results[name] = [r["output_ids"] for r in eng.generate(prompts, GREEDY)]
            results[name + "_stats"] = eng.cache_stats()
            eng.check_integrity()
    assert results["on"] == results["off"] == results["pressure"]
    assert results["off_stats"]["cached_tokens"] == 0
    assert results["on_stats"]["hit_rate"] > 0.5
    assert results["pressure_stats"]["evicted_tokens"] > 0


def test_namespaces_never_share(engine):
    prompt = SHARED + QUESTIONS[1]
    assert engine.generate(prompt, GREEDY, namespace="tenant-a")["meta_info"]["cached_tokens"] == 0
    assert engine.generate(prompt, GREEDY, namespace="tenant-b")["meta_info"]["cached_tokens"] == 0
    assert engine.generate(prompt, GREEDY, namespace="tenant-a")["meta_info"]["cached_tokens"] > 0


def test_flush_cache_between_requests(engine):
    prompt = SHARED + QUESTIONS[2]
    engine.generate(prompt, GREEDY)
    assert engine.flush_cache() is True
    assert engine.generate(prompt, GREEDY)["meta_info"]["cached_tokens"] == 0


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "fcfs", "lof", "random"])
def test_every_policy_gives_the_same_greedy_outputs(tiny_llama_dir, policy):
    prompts = [SHARED + q for q in QUESTIONS[:4]] + QUESTIONS[4:]
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, schedule_policy="fcfs",
                disable_radix_cache=True) as ref:
        expected = [r["output_ids"] for r in ref.generate(prompts, GREEDY)]
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, schedule_policy=policy,
                max_running_requests=3) as eng:
        assert [r["output_ids"] for r in eng.generate(prompts, GREEDY)] == expected
        eng.check_integrity()


def test_cascade_decode_over_a_long_shared_prefix_keeps_outputs(tiny_llama_dir, monkeypatch):
    import radixlm.runtime.model.layers.attention as attention

    calls = []
    real = attention.cascade_decode
    monkeypatch.setattr(attention, "cascade_decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompts = [SHARED * 3 + q for q in QUESTIONS]
    outputs = {}
    for name, opts in {"off": {"disable_radix_cache": True}, "on": {}}.items():
        with Engine(str(tiny_llama_dir), max_total_tokens=4096, **opts) as eng:
            outputs[name] = [r["output_ids"] for r in eng.generate(prompts, GREEDY)]
            eng.check_integrity()
        if name == "off":
            assert not calls  # without the cache no two requests share slots
    assert calls and outputs["on"] == outputs["off"]
