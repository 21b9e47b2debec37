"""Speculative decoding inside the engine (tiny random model): greedy output token-identical with speculation
on and off in every engine situation (mixed batches, chunked prefill, retraction, stops in the middle of an
accepted run, logprobs, streaming, abort, n > 1, penalties), and no KV slot leaked by rejected drafts."""

from __future__ import annotations

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.sampling.sampler import Sampler

PROMPTS = ["Once upon a time there was a dog. Once upon a time there was a", "def main():\n    print(1)\ndef main():",
           "1 2 3 4 1 2 3 4 1 2", '{"name": "Alice", "age": 3} {"name": "Bob", "age": 4} {"name":']
GREEDY = {"max_new_tokens": 24, "temperature": 0}
SPEC = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4}


@pytest.fixture(scope="module")
def plain(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=4096) as eng:
        yield eng
        eng.check_integrity()


@pytest.fixture()
def spec(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, **SPEC) as eng:
        yield eng
        eng.check_integrity()  # idle invariants: every draft slot went back


def ids(results):
    return [r["output_ids"] for r in results]


def prime(engine, prompts, params):
    """Run the prompts once: their outputs enter the cache and the n-gram corpus, so the same prompts
    again get drafts that are (greedy) all accepted: the runs below exercise long accepted runs."""
    return engine.generate(prompts, params)


def test_greedy_identical_and_repeats_are_drafted_from_the_cache(plain, spec):
    want = ids(plain.generate(PROMPTS, GREEDY))
    assert ids(prime(spec, PROMPTS, GREEDY)) == want
    again = spec.generate(PROMPTS, GREEDY)
    assert ids(again) == want
    stats = spec.scheduler.spec.stats
    assert stats.num_accepted > 0 and stats.num_emitted > stats.num_verify_rows
    assert spec.scheduler.spec.observes_after_launch  # the scheduler indexes text after each launch
    for r in again:  # meta_info reports the drafts; the repeat is mostly accepted
        meta = r["meta_info"]
        assert meta["spec_accepted_tokens"] <= meta["spec_proposed_tokens"]
        assert meta["spec_accepted_tokens"] >= GREEDY["max_new_tokens"] // 2
    spec.check_integrity()


@pytest.mark.parametrize("cut", [1, 3, 6, 13, 18])
def test_stops_inside_an_accepted_run(plain, spec, cut):
    base = plain.generate(PROMPTS[0], GREEDY)
    prime(spec, PROMPTS[0], GREEDY)
    stop_tok = base["output_ids"][cut]
    for params in ({"max_new_tokens": cut + 1}, {"stop_token_ids": [stop_tok]},
                   {"stop": [base["text"][len(plain.tokenizer.decode(base["output_ids"][:cut])):][:3]]}):
        p = {**GREEDY, **params}
        a, b = plain.generate(PROMPTS[0], p), spec.generate(PROMPTS[0], p)
        assert (a["output_ids"], a["text"], a["meta_info"]["finish_reason"]) == \
            (b["output_ids"], b["text"], b["meta_info"]["finish_reason"]), params
        # The primed drafts are accepted up to the stop, and none runs past it (stop_cut.py). A stop string
        # inside a multi-byte character (the random model's byte tokens) is not matched on token texts.
        if "\ufffd" not in str(params):
            assert b["meta_info"].get("spec_proposed_tokens", 0) <= len(b["output_ids"]), params


def test_logprobs_of_accepted_tokens(plain, spec):
    kw = {"return_logprob": True, "top_logprobs_num": 2}
    a = plain.generate(PROMPTS[1], GREEDY, **kw)
    prime(spec, PROMPTS[1], GREEDY)
    b = spec.generate(PROMPTS[1], GREEDY, **kw)
    assert b["meta_info"]["spec_accepted_tokens"] > 0
    la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
    assert [x[1] for x in la] == [x[1] for x in lb] == a["output_ids"]
    assert all(abs(x[0] - y[0]) < 1e-4 for x, y in zip(la, lb))
    ta, tb = a["meta_info"]["output_top_logprobs"], b["meta_info"]["output_top_logprobs"]
    assert [[t[1] for t in row] for row in ta] == [[t[1] for t in row] for row in tb]


def test_penalties_min_tokens_and_n(plain, spec):
    params = {**GREEDY, "frequency_penalty": 0.5, "repetition_penalty": 1.2, "min_new_tokens": 20, "n": 2}
    prime(spec, PROMPTS, params)
    assert ids(spec.generate(PROMPTS, params)) == ids(plain.generate(PROMPTS, params))


def test_streaming_and_abort(plain, spec):
    want = plain.generate(PROMPTS[2], GREEDY)
    prime(spec, PROMPTS[2], GREEDY)
    chunks = list(spec.generate(PROMPTS[2], GREEDY, stream=True))
    assert chunks[-1]["output_ids"] == want["output_ids"] and chunks[-1]["text"] == want["text"]
    stream = spec.generate(PROMPTS[2], {**GREEDY, "max_new_tokens": 200}, stream=True)
    next(stream)
    stream.close()  # aborts mid-generation: its verify slots are released
    spec.check_integrity()


def test_mixed_batch_chunked_prefill_and_sampled_neighbours(tiny_llama_dir, plain):
    long_prompt = " ".join(PROMPTS) * 3
    greedy = [(p, GREEDY) for p in PROMPTS] + [(long_prompt, GREEDY)]
    want = [plain.generate(p, params)["output_ids"] for p, params in greedy]
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, chunked_prefill_size=16, **SPEC) as eng:
        prime(eng, PROMPTS, GREEDY)
        sampled = {"max_new_tokens": 24, "temperature": 0.8, "sampling_seed": 1}
        prompts = [p for p, _ in greedy] + PROMPTS
        params = [params for _, params in greedy] + [sampled] * len(PROMPTS)
        out = eng.generate(prompts, params)
        assert ids(out[: len(greedy)]) == want
        assert all(len(r["output_ids"]) == 24 for r in out[len(greedy):])
        eng.check_integrity()


def test_a_greedy_step_takes_one_argmax_for_its_verify_and_plain_rows(plain, spec, monkeypatch):
    """Verify rows and plain decode rows of a greedy step share one Sampler call: on a GPU each call is a
    device sync, and a verify row each would cost a step several of them."""
    fresh = "Zebras graze quietly while"  # not primed: its rows decode without drafts beside the repeats
    want = ids(plain.generate(PROMPTS + [fresh], GREEDY))
    prime(spec, PROMPTS, GREEDY)
    calls, steps = [0], []
    sampler_call = Sampler.__call__

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return sampler_call(self, *args, **kwargs)

    out = spec.scheduler.out
    process = out.process

    def recorded(batch, plan, logits):
        calls[0] = 0
        result = process(batch, plan, logits)
        steps.append((len(plan.verify), len(plan.sample), calls[0]))
        return result

    monkeypatch.setattr(Sampler, "__call__", counted)
    monkeypatch.setattr(out, "process", recorded)
    assert ids(spec.generate(PROMPTS + [fresh], GREEDY)) == want
    verifying = [s for s in steps if s[0]]
    assert any(v > 1 and plain_rows for v, plain_rows, _ in verifying)  # mixed steps of several drafts
    assert all(n == 1 for _, _, n in verifying)


@pytest.mark.parametrize("opts", [{"max_total_tokens": 160}, {"enable_mixed_chunk": False}])
def test_retraction_and_unmixed_steps(tiny_llama_dir, plain, opts):
    params = {**GREEDY, "max_new_tokens": 40}
    want = ids(plain.generate(PROMPTS * 2, params))
    with Engine(str(tiny_llama_dir), **{"max_total_tokens": 4096, **opts}, **SPEC) as eng:
        prime(eng, PROMPTS, params)
        assert ids(eng.generate(PROMPTS * 2, params)) == want
        if opts.get("max_total_tokens") == 160:
            assert eng.scheduler.stats.num_retractions > 0
        eng.check_integrity()


def test_status_line_server_info_and_metrics_report_acceptance(spec):
    from radixlm.runtime.scheduler.status_log import status_line
    from radixlm.runtime.server.metrics import ServerMetrics

    prime(spec, PROMPTS[:2], GREEDY)
    results = spec.generate(PROMPTS[:2], GREEDY)
    stats = spec.scheduler.spec.stats
    line = status_line(spec.scheduler, 1.0)
    assert f"spec accept rate: {100 * stats.acceptance_rate:.2f}%" in line
    assert spec.get_server_info()["speculative"]["spec_accepted_tokens"] == stats.num_accepted
    metrics = ServerMetrics()
    for r in results:
        metrics.on_finish(r["meta_info"], 0.1)
    text = metrics.render().decode()
    proposed = sum(r["meta_info"]["spec_proposed_tokens"] for r in results)
    accepted = sum(r["meta_info"]["spec_accepted_tokens"] for r in results)
    assert f"radixlm_spec_proposed_tokens_total {float(proposed)}" in text
    assert f"radixlm_spec_acceptance_rate {accepted / proposed}" in text


def test_drafts_continue_another_running_requests_prompt(tiny_llama_dir, plain):
    """B's prompt has no repeated token, the corpus is empty (fresh engine), and B's suffix after its first
    token occurs only in A's prompt: B's drafts can only come from A, which is running at the same time."""
    b_prompt = list(range(100, 120))
    params = {"max_new_tokens": 8, "temperature": 0}
    first = plain.generate(input_ids=b_prompt, sampling_params=params)["output_ids"]
    a_prompt = list(range(200, 230)) + b_prompt[-3:] + first[:1] + list(range(300, 310))
    want = ids(plain.generate(input_ids=[a_prompt, b_prompt], sampling_params=params))
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, **SPEC) as eng:
        out = eng.generate(input_ids=[a_prompt, b_prompt], sampling_params=params)
        assert ids(out) == want
        assert out[1]["meta_info"].get("spec_proposed_tokens", 0) > 0
        eng.check_integrity()
