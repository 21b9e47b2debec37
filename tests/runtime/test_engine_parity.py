"""Greedy outputs and logprobs of the Engine against transformers on the same fp32 weights."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from radixlm.runtime.engine import Engine
from radixlm.testing import hf_greedy_ids

PROMPTS = [
    "Paris",
    "The quick brown fox jumps over the lazy dog. A radix tree",
    "Question: What is two plus two? Answer:",
    '{"name": "Alice", "age"',
    "Once upon a time there was a small language model that loved to answer questions politely. It",
    "1234567890 2024",
    "def main():\n    print(",
    "Berlin is the capital of Germany. Rome is the capital of Italy. Paris is the capital of",
]
NEW_TOKENS = 12


def hf_greedy(model_dir, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    return [list(x) for x in _hf_greedy(str(model_dir), tuple(prompts), max_new_tokens)]


@functools.cache
def _hf_greedy(model_dir: str, prompts: tuple[str, ...], max_new_tokens: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(ids) for ids in hf_greedy_ids(model_dir, list(prompts), max_new_tokens))


def engine_greedy(engine: Engine, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    res = engine.generate(prompts, {"max_new_tokens": max_new_tokens, "temperature": 0})
    return [r["output_ids"] for r in res]


@pytest.fixture(scope="module")
def model_dirs(tiny_llama_dir, tiny_qwen2_dir, tiny_qwen3_dir, tiny_mistral_dir):
    return {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir, "qwen3": tiny_qwen3_dir,
            "mistral": tiny_mistral_dir}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_greedy_matches_transformers(model_dirs, arch):
    expected = hf_greedy(model_dirs[arch], PROMPTS, NEW_TOKENS)
    with Engine(str(model_dirs[arch]), max_total_tokens=4096, disable_radix_cache=True) as engine:
        assert engine_greedy(engine, PROMPTS, NEW_TOKENS) == expected
        engine.check_integrity()


@pytest.mark.parametrize("options", [
    {"chunked_prefill_size": 5},  # forces chunked prefill of every prompt
    {"chunked_prefill_size": 5, "enable_mixed_chunk": False},
    {"max_total_tokens": 90, "max_running_requests": 8},  # too small for all: retraction
    {"max_running_requests": 2},
])
def test_greedy_parity_under_scheduling_pressure(tiny_llama_dir, options):
    expected = hf_greedy(tiny_llama_dir, PROMPTS, NEW_TOKENS)
    opts = {"max_total_tokens": 4096, **options}
    with Engine(str(tiny_llama_dir), **opts) as engine:
        assert engine_greedy(engine, PROMPTS, NEW_TOKENS) == expected
        if "max_total_tokens" in options:
            assert engine.scheduler.stats.num_retractions > 0
        engine.check_integrity()


def test_logprobs_match_transformers_log_softmax(tiny_qwen2_dir):
    prompt = "Question: What is two plus two? Answer:"
    tok = transformers.AutoTokenizer.from_pretrained(tiny_qwen2_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32)
    with Engine(str(tiny_qwen2_dir), max_total_tokens=1024) as engine:
        res = engine.generate(prompt, {"max_new_tokens": 6, "temperature": 0}, return_logprob=True,
                              logprob_start_len=0, top_logprobs_num=3)
        engine.check_integrity()
    prompt_ids = tok(prompt).input_ids
    full = torch.tensor([prompt_ids + res["output_ids"]])
    with torch.no_grad():
        ref = torch.log_softmax(model(full).logits[0].float(), dim=-1)  # [L, V]
    meta = res["meta_info"]
    inp = meta["input_token_logprobs"]
    assert len(inp) == len(prompt_ids) and inp[0][0] is None and inp[0][1] == prompt_ids[0]
    for pos in range(1, len(prompt_ids)):
        logprob, tid, text = inp[pos]
        assert tid == prompt_ids[pos] and text is None
        assert abs(logprob - ref[pos - 1, tid].item()) < 1e-4
    for j, (logprob, tid, _) in enumerate(meta["output_token_logprobs"]):
        pos = len(prompt_ids) - 1 + j
        assert tid == res["output_ids"][j]
        assert abs(logprob - ref[pos, tid].item()) < 1e-4
        top = meta["output_top_logprobs"][j]
        ref_top = torch.topk(ref[pos], 3)
        assert [t[1] for t in top] == ref_top.indices.tolist()
        assert all(abs(t[0] - v) < 1e-4 for t, v in zip(top, ref_top.values.tolist()))
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == len(prompt_ids)


def test_default_logprob_start_is_last_prompt_token(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=1024) as engine:
        res = engine.generate("Paris is the capital of", {"max_new_tokens": 2, "temperature": 0},
                              return_logprob=True, return_text_in_logprobs=True)
        ids = engine.tokenizer("Paris is the capital of").input_ids
    inp = res["meta_info"]["input_token_logprobs"]
    assert inp == [[None, ids[-1], engine.tokenizer.decode([ids[-1]])]]
    assert len(res["meta_info"]["output_token_logprobs"]) == 2


def test_unwritten_kv_slots_are_never_read(tiny_llama_dir):
    """Poison every non-scratch slot with NaN: any read of a slot this request did not write shows up."""
    expected = hf_greedy(tiny_llama_dir, PROMPTS, NEW_TOKENS)
    with Engine(str(tiny_llama_dir), max_total_tokens=200, chunked_prefill_size=7) as engine:
        pool = engine.runner.kv_pool
        for buf in pool.k_buffer + pool.v_buffer:
            buf[1:].fill_(float("nan"))
        assert engine_greedy(engine, PROMPTS, NEW_TOKENS) == expected
        engine.check_integrity()
