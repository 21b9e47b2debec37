"""Prompt logprobs from the radix cache: a request that wants them (echo + logprobs) reuses a cached prefix
whose logprobs some request computed, reports the cached tokens, and gets the numbers the cache-off engine
computes (within float rounding of a different batch shape), top-k ids included."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.engine import Engine

PREFIX = [(7 * i) % 300 + 20 for i in range(80)]  # a shared few-shot-like prefix
ONE = {"max_new_tokens": 1, "temperature": 0}
ECHO = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3}
TOL = 1e-5


def prompt(i: int, prefix: list[int] = PREFIX) -> list[int]:
    return prefix + [330 + i, 340 + i, 350 + i]


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    # Small prefill chunks on the cached engine: logprobs recorded across chunk boundaries.
    with Engine(str(tiny_llama_dir), num_threads=1, chunked_prefill_size=32) as on, \
            Engine(str(tiny_llama_dir), num_threads=1, disable_radix_cache=True) as off:
        yield on, off
        on.check_integrity()


def flush(engine: Engine) -> None:
    assert engine.flush_cache()


def assert_same(got: dict, want: dict, top: bool = True) -> None:
    g, w = got["meta_info"], want["meta_info"]
    assert [e[1] for e in g["input_token_logprobs"]] == [e[1] for e in w["input_token_logprobs"]]
    assert g["input_token_logprobs"][0][0] is None and w["input_token_logprobs"][0][0] is None
    for a, b in zip(g["input_token_logprobs"][1:], w["input_token_logprobs"][1:]):
        assert abs(a[0] - b[0]) <= TOL
    if top:
        assert len(g["input_top_logprobs"]) == len(w["input_top_logprobs"])
        for a, b in zip(g["input_top_logprobs"][1:], w["input_top_logprobs"][1:]):
            assert [t[1] for t in a] == [t[1] for t in b]
            assert all(abs(x[0] - y[0]) <= TOL for x, y in zip(a, b))
    assert got["output_ids"] == want["output_ids"]


def test_echo_logprobs_reuse_a_shared_prefix(engines):
    on, off = engines
    flush(on)
    got = [on.generate(input_ids=prompt(i), sampling_params=ONE, **ECHO) for i in range(3)]
    # The first computes everything; the others reuse the prefix's KV and logprobs: all but its last token
    # (that token's logprob is the one after the prefix, from the cached logits, the next one is new).
    assert [g["meta_info"]["cached_tokens"] for g in got] == [0, len(PREFIX) - 1, len(PREFIX) - 1]
    for i, g in enumerate(got):
        assert_same(g, off.generate(input_ids=prompt(i), sampling_params=ONE, **ECHO))
    # A batch of siblings on an empty cache: one computes the prefix (in chunks), the others take what it has
    # computed by the time they are admitted.
    flush(on)
    batch = on.generate(input_ids=[prompt(i) for i in range(3, 6)], sampling_params=ONE, **ECHO)
    cached = sorted(b["meta_info"]["cached_tokens"] for b in batch)
    assert cached[0] == 0 and cached[1] > 0
    for i, b in zip(range(3, 6), batch):
        assert_same(b, off.generate(input_ids=prompt(i), sampling_params=ONE, **ECHO))


def test_scoring_and_a_later_logprob_start(engines):
    on, off = engines
    flush(on)
    score = {"max_new_tokens": 0}
    full = prompt(0)
    first = on.generate(input_ids=full, sampling_params=score, **ECHO)
    again = on.generate(input_ids=full, sampling_params=score, **ECHO)
    assert first["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["cached_tokens"] == len(full) - 1
    want = off.generate(input_ids=full, sampling_params=score, **ECHO)
    assert_same(first, want)
    assert_same(again, want)
    late = {**ECHO, "logprob_start_len": 40}
    got = on.generate(input_ids=prompt(1), sampling_params=ONE, **late)
    assert got["meta_info"]["cached_tokens"] == len(PREFIX) - 1
    assert_same(got, off.generate(input_ids=prompt(1), sampling_params=ONE, **late))


def test_a_prefix_cached_without_logprobs_learns_them(engines):
    on, off = engines
    flush(on)
    on.generate(input_ids=prompt(0), sampling_params=ONE)  # KV cached, no logprobs computed
    first = on.generate(input_ids=prompt(1), sampling_params=ONE, **ECHO)
    assert first["meta_info"]["cached_tokens"] == 0  # every position's logits are needed: recomputed
    second = on.generate(input_ids=prompt(2), sampling_params=ONE, **ECHO)
    assert second["meta_info"]["cached_tokens"] == len(PREFIX) - 1  # ... and now known to the tree
    assert_same(second, off.generate(input_ids=prompt(2), sampling_params=ONE, **ECHO))


def test_what_the_tree_does_not_keep_is_recomputed(engines):
    on, off = engines
    flush(on)
    on.generate(input_ids=prompt(0), sampling_params=ONE, **ECHO)
    many = {**ECHO, "top_logprobs_num": on.scheduler.kv.logprob_top_k + 1}
    got = on.generate(input_ids=prompt(1), sampling_params=ONE, **many)
    assert got["meta_info"]["cached_tokens"] == 0
    assert_same(got, off.generate(input_ids=prompt(1), sampling_params=ONE, **many))
    ids = {**ECHO, "token_ids_logprob": [5, 6]}
    got = on.generate(input_ids=prompt(2), sampling_params=ONE, **ids)
    assert got["meta_info"]["cached_tokens"] == 0
    want = off.generate(input_ids=prompt(2), sampling_params=ONE, **ids)
    assert_same(got, want)
    of_ids = "input_token_ids_logprobs"
    for a, b in zip(got["meta_info"][of_ids][1:], want["meta_info"][of_ids][1:]):
        assert all(abs(x[0] - y[0]) <= TOL for x, y in zip(a, b))
    # Fewer alternatives than kept, or none: served from the tree.
    for k in (0, 1):
        got = on.generate(input_ids=prompt(3 + k), sampling_params=ONE, **{**ECHO, "top_logprobs_num": k})
        assert got["meta_info"]["cached_tokens"] == len(PREFIX) - 1
        assert_same(got, off.generate(input_ids=prompt(3 + k), sampling_params=ONE,
                                      **{**ECHO, "top_logprobs_num": k}), top=k > 0)


def test_a_readmitted_request_starts_its_prompt_entries_over():
    """A request retracted part-way through its prompt is admitted again: its entries are the tree's and then
    its own, once each (not appended to what it had)."""
    from radixlm.radix_cache.token_logprobs import CachedLogprobs, TokenLogprobs
    from radixlm.runtime.scheduler import prompt_logprobs
    from radixlm.runtime.scheduler.request import LogprobRequest, Req
    from radixlm.sampling_params import SamplingParams

    req = Req("r", list(range(10, 20)), SamplingParams(), logprob=LogprobRequest(True, 0, 1))
    kept = TokenLogprobs.unknown(4, 2)
    for j in range(4):
        kept.put(j, torch.tensor([-1.0 - j]), torch.tensor([[-0.5, -0.7]]), torch.tensor([[7, 8]]))
    for _ in range(2):  # first admission, then the admission after a retraction
        req.tree_len = 4
        prompt_logprobs.begin(req, CachedLogprobs(4, kept), top_k=2)
        assert req.logprobs.input_token == [(None, 10), (-1.0, 11), (-2.0, 12), (-3.0, 13), (-4.0, 14)]
        assert req.logprobs.input_top == [None] + [[(-0.5, 7)]] * 4
        assert len(req.prompt_logprobs) == 10 and not bool(req.prompt_logprobs.known().any())
    prompt_logprobs.begin(req, None, top_k=None)  # no tree: nothing taken, nothing recorded
    assert req.logprobs.input_token == [] and req.prompt_logprobs is None
