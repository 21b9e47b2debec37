"""End to end on the real default model (SmolLM2-135M-Instruct, fp32): greedy parity with transformers."""

from __future__ import annotations

import pytest
import transformers

from radixlm.runtime.engine import Engine
from radixlm.testing import hf_greedy_ids

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain what a radix tree is in one sentence.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish.",
    "Give me a name for a friendly robot.",
    "Why is the sky blue? Answer briefly, in simple words that a child would understand.",
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir():
    from radixlm.runtime.model.loader import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="module")
def prompts(model_dir):
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    chats = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in QUESTIONS]
    return chats[:6] + ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def hf_outputs(model_dir, prompts):
    return hf_greedy_ids(model_dir, prompts, NEW_TOKENS)


@pytest.mark.parametrize("options", [
    {},
    {"chunked_prefill_size": 16, "max_total_tokens": 80},  # chunking, and a pool small enough to retract
    {"weight_layout": "packed"},  # oneDNN's prepacked weights at every row count (auto's pick on some CPUs)
    {"weight_layout": "packed_blocks"},
    {"weight_layout": "packed_tiles"},  # one-row steps through the compiled fp32 GEMV
    {"weight_layout": "blocks"},
])
def test_greedy_matches_transformers(model_dir, prompts, hf_outputs, options):
    with Engine(str(model_dir), **{"max_total_tokens": 8192, **options}) as engine:
        res = engine.generate(prompts, {"max_new_tokens": NEW_TOKENS, "temperature": 0})
        assert [r["output_ids"] for r in res] == hf_outputs
        if "chunked_prefill_size" in options:
            assert engine.scheduler.stats.num_retractions > 0
        engine.check_integrity()


def test_answers_the_capital_question(model_dir, prompts):
    with Engine(str(model_dir), max_total_tokens=4096) as engine:
        res = engine.generate(prompts[0], {"max_new_tokens": 16, "temperature": 0})
    assert "Paris" in res["text"]
