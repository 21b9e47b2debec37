"""The offline Engine API: sampling options end to end, stop conditions, streaming, n, validation."""

from __future__ import annotations

import pytest

from radixlm.errors import ContextLengthError, InvalidRequestError
from radixlm.runtime.engine import Engine

PROMPT = "Once upon a time there was a small language model"


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=2048) as eng:
        yield eng


@pytest.fixture(autouse=True)
def _idle_invariants(engine):
    yield
    engine.check_integrity()


def greedy(engine, n=12, **extra):
    return engine.generate(PROMPT, {"max_new_tokens": n, "temperature": 0, **extra})


def test_seeded_sampling_is_reproducible(engine):
    params = {"max_new_tokens": 16, "temperature": 1.0, "sampling_seed": 1234}
    a = engine.generate(PROMPT, params)["output_ids"]
    # Same seed inside a batch with other requests: same tokens.
    batch = engine.generate([PROMPT, "Paris is", PROMPT], [params, {"max_new_tokens": 5}, {**params, "sampling_seed": 99}])
    assert batch[0]["output_ids"] == a
    assert batch[2]["output_ids"] != a  # a different seed takes another path (16 tokens at T=1)


def test_n_returns_n_samples(engine):
    res = engine.generate(PROMPT, {"max_new_tokens": 6, "temperature": 1.0, "n": 3, "sampling_seed": 7})
    assert isinstance(res, list) and len(res) == 3
    assert len({r["meta_info"]["id"] for r in res}) == 3
    again = engine.generate(PROMPT, {"max_new_tokens": 6, "temperature": 1.0, "n": 3, "sampling_seed": 7})
    assert [r["output_ids"] for r in res] == [r["output_ids"] for r in again]


def test_stop_string_is_trimmed_unless_no_stop_trim(engine):
    full = greedy(engine)
    text = full["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop and stop in text
    res = greedy(engine, stop=[stop])
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert res["text"] == text[: text.index(stop)]
    kept = greedy(engine, stop=stop, no_stop_trim=True)
    assert kept["text"].startswith(text[: text.index(stop)]) and stop in kept["text"]


def test_stop_token_ids_finish_and_leave_the_text(engine):
    full = greedy(engine)
    target = full["output_ids"][3]
    first = full["output_ids"].index(target)
    res = greedy(engine, stop_token_ids=[target])
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert res["output_ids"] == full["output_ids"][: first + 1]
    assert res["text"] == engine.tokenizer.decode(full["output_ids"][:first])


def test_eos_min_new_tokens_and_ignore_eos(engine):
    eos = engine.tokenizer.eos_token_id
    forced = greedy(engine, logit_bias={str(eos): 100.0})
    assert forced["output_ids"] == [eos]
    assert forced["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    assert forced["text"] == ""
    delayed = greedy(engine, logit_bias={str(eos): 100.0}, min_new_tokens=3)
    assert len(delayed["output_ids"]) == 4 and eos not in delayed["output_ids"][:3]
    ignored = greedy(engine, n=5, logit_bias={str(eos): 100.0}, ignore_eos=True)
    assert ignored["output_ids"] == [eos] * 5
    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_max_new_tokens_zero_is_prefill_only_with_logprobs(engine):
    res = engine.generate(PROMPT, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    meta = res["meta_info"]
    assert res["text"] == "" and res["output_ids"] == []
    assert meta["completion_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert meta["output_token_logprobs"] == []


def test_streaming_is_cumulative_and_matches_non_streaming(engine):
    full = greedy(engine)
    chunks = list(engine.generate(PROMPT, {"max_new_tokens": 12, "temperature": 0}, stream=True))
    assert len(chunks) == 12
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == list(range(1, 13))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_streaming_logprobs_are_incremental(engine):
    chunks = list(engine.generate(PROMPT, {"max_new_tokens": 4, "temperature": 0}, stream=True,
                                  return_logprob=True))
    assert all(len(c["meta_info"]["output_token_logprobs"]) == 1 for c in chunks)
    assert [c["meta_info"]["output_token_logprobs_length"] for c in chunks] == [1, 2, 3, 4]


def test_abandoned_stream_frees_its_kv(engine):
    stream = engine.generate(PROMPT, {"max_new_tokens": 200, "temperature": 0}, stream=True)
    next(stream)
    stream.close()  # the consumer walks away: the request is aborted (checked by the idle invariants)


def test_batch_input_ids_and_per_item_params(engine):
    ids = engine.tokenizer(PROMPT).input_ids
    res = engine.generate(input_ids=[ids, ids[:5]], sampling_params=[{"max_new_tokens": 3, "temperature": 0},
                                                                    {"max_new_tokens": 2, "temperature": 0}])
    assert [len(r["output_ids"]) for r in res] == [3, 2]
    assert res[0]["output_ids"] == greedy(engine, n=3)["output_ids"]


@pytest.mark.parametrize("kwargs, param", [
    ({"sampling_params": {"temperature": -1}}, "temperature"),
    ({"sampling_params": {"top_p": 0}}, "top_p"),
    ({"sampling_params": {"top_k": 0}}, "top_k"),
    ({"sampling_params": {"max_new_tokens": "5"}}, "max_new_tokens"),
    ({"sampling_params": {"max_new_tokens": True}}, "max_new_tokens"),
    ({"sampling_params": {"min_new_tokens": 9, "max_new_tokens": 3}}, "min_new_tokens"),
    ({"sampling_params": {"bogus": 1}}, "bogus"),
    ({"sampling_params": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
    ({"sampling_params": {"regex": "a", "json_schema": "{}"}}, "json_schema"),
    ({"sampling_params": {"temperature": float("nan")}}, "temperature"),
    ({"top_logprobs_num": 21, "return_logprob": True}, "top_logprobs_num"),
])
def test_invalid_parameters_name_the_field(engine, kwargs, param):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(PROMPT, **kwargs)
    assert info.value.param == param


def test_invalid_prompts(engine):
    with pytest.raises(InvalidRequestError):
        engine.generate("")
    with pytest.raises(InvalidRequestError):
        engine.generate(input_ids=[])
    with pytest.raises(InvalidRequestError):
        engine.generate(input_ids=[1, -3])
    with pytest.raises(InvalidRequestError):
        engine.generate(input_ids=[10**7])
    with pytest.raises(InvalidRequestError):
        engine.generate(PROMPT, input_ids=[1])
    with pytest.raises(ContextLengthError):
        engine.generate(PROMPT * 200, {"max_new_tokens": 4})
    # Nothing a bad request did affects the next one.
    assert greedy(engine, n=3)["output_ids"] == greedy(engine, n=3)["output_ids"]


def test_request_larger_than_the_pool_is_refused(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=40) as eng:
        with pytest.raises(ContextLengthError):
            eng.generate(PROMPT, {"max_new_tokens": 50})
        assert len(eng.generate(PROMPT, {"max_new_tokens": 4, "temperature": 0})["output_ids"]) == 4
        eng.check_integrity()
