"""Engine.encode: last-token pooling (after the final norm, L2-normalized) against transformers on the same fp32
weights; embedding requests are prefills that go through the scheduler with generation, chunked, and share the
radix cache both ways."""

from __future__ import annotations

import numpy as np
import pytest

from radixlm.errors import ContextLengthError, InvalidRequestError
from radixlm.runtime.engine import Engine
from radixlm.testing import hf_last_token_embeddings

PROMPTS = [
    "Paris",
    "The quick brown fox jumps over the lazy dog. A radix tree shares every common prefix of the prompts",
    "Question: What is two plus two? Answer:",
    "Once upon a time there was a small language model that loved to answer questions politely and at length.",
]
TOLERANCE = 1e-4


def _close(got: list[float], want: list[float]) -> bool:
    return float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) < TOLERANCE


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    # Chunks of 8 tokens: the longer prompts' last token arrives in a later chunk than their first.
    with Engine(str(tiny_llama_dir), max_total_tokens=8192, chunked_prefill_size=8, context_length=4096) as eng:
        yield eng


def _ids(engine: Engine, prompts: list[str]) -> list[list[int]]:
    return [list(engine.tokenizer(p).input_ids) for p in prompts]


def test_batch_matches_transformers_and_one_by_one(engine, tiny_llama_dir):
    engine.flush_cache()
    want = hf_last_token_embeddings(tiny_llama_dir, _ids(engine, PROMPTS))
    batch = engine.encode(PROMPTS)
    assert [len(r["embedding"]) for r in batch] == [64] * len(PROMPTS)  # the hidden size
    for res, ref in zip(batch, want):
        assert _close(res["embedding"], ref)
        assert np.linalg.norm(res["embedding"]) == pytest.approx(1.0, abs=1e-5)
        assert res["meta_info"]["completion_tokens"] == 0
    engine.flush_cache()
    for prompt, ref in zip(PROMPTS, want):
        assert _close(engine.encode(prompt)["embedding"], ref)
    by_ids = engine.encode(input_ids=_ids(engine, PROMPTS[1:2]))[0]
    assert _close(by_ids["embedding"], want[1])
    engine.check_integrity()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_other_architectures_match_transformers(request, arch):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    with Engine(str(model_dir), max_total_tokens=2048) as eng:
        got = eng.encode(PROMPTS[:2])
        want = hf_last_token_embeddings(model_dir, _ids(eng, PROMPTS[:2]))
        assert all(_close(g["embedding"], w) for g, w in zip(got, want))
        eng.check_integrity()


def test_shares_the_radix_cache_with_generation(engine):
    engine.flush_cache()
    prompt = PROMPTS[3]
    first = engine.encode(prompt)
    n = first["meta_info"]["prompt_tokens"]
    before = engine.scheduler.num_computed_tokens
    again = engine.encode(prompt)
    assert again["meta_info"]["cached_tokens"] == n - 1  # all but the last token, which is computed again
    assert engine.scheduler.num_computed_tokens - before == 1
    assert _close(again["embedding"], first["embedding"])
    gen = engine.generate(prompt, {"max_new_tokens": 2, "temperature": 0})
    assert gen["meta_info"]["cached_tokens"] == n - 1  # generation reuses what the embedding computed
    engine.flush_cache()
    engine.generate(PROMPTS[1], {"max_new_tokens": 2, "temperature": 0})
    res = engine.encode(PROMPTS[1])
    assert res["meta_info"]["cached_tokens"] == res["meta_info"]["prompt_tokens"] - 1  # ... and the reverse
    engine.check_integrity()


def test_runs_in_the_same_steps_as_a_generation(engine, monkeypatch):
    steps: list[set[bool]] = []
    real = engine.runner.forward

    def recording(batch, *args, **kwargs):
        steps.append({row.req.embed for row in batch.rows})
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "forward", recording)
    stream = engine.generate(PROMPTS[0], {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True},
                             stream=True)
    next(stream)  # the generation is running: it decodes in every step from now until it is closed
    alone = engine.encode(PROMPTS[2])
    stream.close()  # aborts it
    assert {True, False} in steps  # a step with a decode row and an embedding row
    monkeypatch.undo()
    engine.flush_cache()
    assert _close(alone["embedding"], engine.encode(PROMPTS[2])["embedding"])
    engine.check_integrity()


def test_bad_input_is_refused(engine):
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.encode("")
    with pytest.raises(InvalidRequestError):
        engine.encode(input_ids=[])
    with pytest.raises(ContextLengthError, match="context length"):
        engine.encode(input_ids=[5] * 4097)
    engine.check_integrity()
