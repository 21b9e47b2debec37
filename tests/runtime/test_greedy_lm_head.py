"""The greedy LM head in the engine (cpu_ops.ArgmaxHead, csrc/argmax_head.cpp): a one-row step whose token is
the plain argmax of its raw logits reads the head as bf16 and recomputes only the candidates exactly. Greedy
outputs stay token-identical to transformers and to the full head; steps that read more than the argmax
(logprobs, sampling, penalties, a grammar, several rows) keep every logit."""

from __future__ import annotations

import shutil
from contextlib import contextmanager

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.quant.cpu_caps import cpu_caps
from radixlm.testing import hf_greedy_ids

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")

PROMPTS = ["The quick brown fox jumps over the lazy dog. A radix tree",
           "Question: What is two plus two? Answer:", "def main():\n    print("]
NEW = 10


class _Counted:
    def __init__(self, head) -> None:
        self.head, self.rows = head, 0

    def __call__(self, h):
        self.rows += 1
        return self.head(h)


@contextmanager
def _counting_rows_head(model):
    """The model's many-row head wrapped to count its calls (None where it has none), restored after."""
    head = model.lm_head_argmax_rows
    model.lm_head_argmax_rows = _Counted(head) if head is not None else None
    try:
        yield model.lm_head_argmax_rows
    finally:
        model.lm_head_argmax_rows = head


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, weight_layout="packed_tiles", num_threads=2) as eng:
        yield eng


def _greedy(engine: Engine, prompts: list[str], **params) -> list[list[int]]:
    res = engine.generate(prompts, {"max_new_tokens": NEW, "temperature": 0, **params})
    return [r["output_ids"] for r in res]


def test_greedy_steps_take_the_screened_head_and_match_transformers(engine, tiny_llama_dir) -> None:
    model = engine.runner.model
    assert model.lm_head_argmax is not None
    head = model.lm_head_argmax = _Counted(model.lm_head_argmax)
    try:
        screened = [_greedy(engine, [p])[0] for p in PROMPTS]  # one at a time: one-row steps
        assert head.rows >= len(PROMPTS) * NEW
        model.lm_head_argmax = None
        assert [_greedy(engine, [p])[0] for p in PROMPTS] == screened
    finally:
        model.lm_head_argmax = head.head
    assert screened == hf_greedy_ids(str(tiny_llama_dir), PROMPTS, NEW)


@pytest.mark.parametrize("params", [{"temperature": 0.8, "sampling_seed": 3}, {"repetition_penalty": 1.3},
                                    {"logit_bias": {"11": 2.0}}, {"min_new_tokens": NEW},
                                    {"regex": "[a-z ]+"}])
def test_steps_that_read_more_than_the_argmax_keep_every_logit(engine, params) -> None:
    model = engine.runner.model
    head = model.lm_head_argmax = _Counted(model.lm_head_argmax)
    try:
        _greedy(engine, [PROMPTS[0]], **params)
        res = engine.generate(PROMPTS[1], {"max_new_tokens": NEW, "temperature": 0}, return_logprob=True)
        assert head.rows == 0
        assert all(lp is not None and lp > float("-inf") for lp, *_ in res["meta_info"]["output_token_logprobs"])
    finally:
        model.lm_head_argmax = head.head


def test_batched_greedy_rows_match_transformers(engine, tiny_llama_dir) -> None:
    """Steps of several greedy rows take the many-row head where the CPU has native bf16 (ArgmaxRows, a bf16
    matmul screen), and every logit elsewhere; either way the tokens are transformers' and the full head's."""
    model = engine.runner.model
    assert (model.lm_head_argmax_rows is not None) == cpu_caps().native_bf16
    with _counting_rows_head(model) as counted:
        screened = _greedy(engine, PROMPTS)
        if counted is not None:
            assert counted.rows >= NEW - 1  # the decode steps of the three rows together
        model.lm_head_argmax_rows = None
        assert _greedy(engine, PROMPTS) == screened
    assert screened == hf_greedy_ids(str(tiny_llama_dir), PROMPTS, NEW)


def test_batched_steps_that_read_more_than_the_argmax_keep_every_logit(engine) -> None:
    with _counting_rows_head(engine.runner.model) as counted:
        if counted is None:
            pytest.skip("no native bf16: no many-row head")
        res = engine.generate(PROMPTS, {"max_new_tokens": NEW, "temperature": 0}, return_logprob=True)
        _greedy(engine, PROMPTS, repetition_penalty=1.3)
        assert counted.rows == 0
        assert all(lp > float("-inf") for r in res for lp, *_ in r["meta_info"]["output_token_logprobs"])


def test_speculative_verify_rows_take_the_many_row_head(tiny_llama_dir) -> None:
    """A greedy verify row reads only the argmax at each position: with NGRAM speculation its step takes the
    many-row head, and the output is the same as with every logit computed (and as with no speculation)."""
    prompts = ["one two three four one two three four one two", "a b c d a b c d a b c"]
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, weight_layout="packed_tiles", num_threads=2,
                speculative_algorithm="NGRAM") as eng:
        model = eng.runner.model
        with _counting_rows_head(model) as counted:
            if counted is None:
                pytest.skip("no native bf16: no many-row head")
            screened = [_greedy(eng, [p], max_new_tokens=24)[0] for p in prompts]
            assert eng.scheduler.spec.stats.num_verify_rows > 0 and counted.rows > 0
            model.lm_head_argmax_rows = None
            eng.flush_cache()
            assert [_greedy(eng, [p], max_new_tokens=24)[0] for p in prompts] == screened
        eng.check_integrity()
        eng.scheduler.spec = None
        eng.flush_cache()
        assert [_greedy(eng, [p], max_new_tokens=24)[0] for p in prompts] == screened


@pytest.mark.parametrize("options", [{"weight_layout": "blocks"}, {"quantization": "int8"}])
def test_other_layouts_and_int8_have_no_screened_head(tiny_llama_dir, options) -> None:
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, **options) as eng:
        assert eng.runner.model.lm_head_argmax is None and eng.runner.model.lm_head_argmax_rows is None
