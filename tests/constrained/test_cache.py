"""GrammarCache: compiles in killable spawn workers; dedup, cached failures, bound, timeouts."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import torch

from radixlm.constrained import GRAMMAR_TIMEOUT, GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError
from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig

# regex-automata needs minutes (but little memory) for this DFA: Unicode classes, repeated (`\w` and `\s` would
# not do: a regex constraint reads them as ASCII classes, constrained/ascii_classes.py).
SLOW = r"(\p{L}|\p{Z}){1,200}x"
HUGE = "a{100000}{100}"  # ... and GBs for this one


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child that was joined is gone; a zombie would still answer, so check its state too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def cache(backends):
    config = GrammarCacheConfig(num_workers=2, compile_timeout_s=1.5, max_entries=6)
    with GrammarCache(backends["default"], config) as c:
        yield c


def test_concurrent_identical_specs_compile_once(cache, byte_tokenizer, model_vocab_size):
    spec = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})
    before = cache.num_compiles
    futures: list = []
    start = threading.Barrier(8)

    def submit() -> None:
        start.wait()
        futures.append(cache.submit("json_schema", spec))

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(f) for f in futures}) == 1 and cache.num_compiles == before + 1
    grammar = futures[0].result(timeout=120)
    matcher = grammar.matcher()
    assert matcher.jump_forward() == "{"
    mask = torch.zeros(model_vocab_size, dtype=torch.bool)
    matcher.fill_allowed_mask(mask)
    assert mask.nonzero().flatten().tolist() == [byte_tokenizer.convert_tokens_to_ids("{")]


def test_failures_are_cached(cache):
    before = cache.num_compiles
    first = cache.submit("regex", "(unclosed")
    with pytest.raises(GrammarError) as info:
        first.result(timeout=120)
    assert (info.value.param, info.value.code) == ("regex", INVALID_GRAMMAR)
    again = cache.submit("regex", "(unclosed")
    assert again is first and cache.num_compiles == before + 1
    bad_schema = cache.submit("json_schema", '{"type": "string", "minLength": "three"}')  # not a schema
    with pytest.raises(GrammarError, match="not a valid JSON schema"):
        bad_schema.result(timeout=120)
    assert cache.submit("json_schema", '{"type": "string", "minLength": "three"}') is bad_schema


def test_cache_stays_bounded(cache):
    futures = [cache.submit("regex", f"x{{{i}}}") for i in range(1, 15)]
    assert len(cache) <= 6
    for f in futures:
        f.result(timeout=120)  # evicted entries still complete for their holders
    assert len(cache) <= 6
    before = cache.num_compiles
    cache.submit("regex", "x{1}")  # evicted long ago: compiled again
    assert cache.num_compiles == before + 1


def test_timeout_kills_worker_and_cache_stays_usable(cache):
    deadline = time.perf_counter() + 120
    while None in cache.worker_pids() and time.perf_counter() < deadline:
        time.sleep(0.1)  # a worker may still be restarting after an earlier (load-induced) timeout
    old_pids = set(cache.worker_pids())
    t0 = time.perf_counter()
    slow = cache.submit("regex", SLOW)
    other = cache.submit("regex", "[0-9]{2}")  # served by the other worker meanwhile
    assert time.perf_counter() - t0 < 0.1  # submit never blocks
    assert other.result(timeout=120) is not None
    with pytest.raises(GrammarError) as info:
        slow.result(timeout=120)
    assert (info.value.param, info.value.code) == ("regex", GRAMMAR_TIMEOUT)
    killed = old_pids - set(cache.worker_pids())
    assert len(killed) == 1 and not any(_alive(pid) for pid in killed)
    assert cache.submit("regex", SLOW) is slow  # the timeout is cached: not retried
    assert cache.submit("choices", json.dumps(["yes", "no"])).result(timeout=120).matcher() is not None


def test_memory_blowup_is_too_large_and_worker_replaced(backends):
    # A generous time limit, so only the memory limit can stop this compile.
    config = GrammarCacheConfig(num_workers=1, compile_timeout_s=120, worker_memory_bytes=256 << 20)
    with GrammarCache(backends["default"], config) as c:
        with pytest.raises(GrammarError) as info:
            c.submit("regex", HUGE).result(timeout=180)
        assert (info.value.param, info.value.code) == ("regex", GRAMMAR_TOO_LARGE)
        assert c.submit("regex", "[a-c]+").result(timeout=120) is not None


def test_close_stops_workers(backends):
    c = GrammarCache(backends["compact"], GrammarCacheConfig(num_workers=1))
    assert c.submit("regex", "ok").result(timeout=120) is not None
    pids = [p for p in c.worker_pids() if p is not None]
    c.close()
    assert pids and not any(_alive(p) for p in pids)


def test_worker_that_cannot_start_fails_jobs_instead_of_hanging(backends):
    class Broken:
        cache_key = "broken"

        def worker_init_messages(self) -> list[bytes]:
            return [b"no-such-backend", backends["default"].options.to_json().encode(), b""]

        def load(self, data: bytes):  # never reached
            raise AssertionError

    with GrammarCache(Broken(), GrammarCacheConfig(num_workers=1, worker_start_timeout_s=60)) as c:
        with pytest.raises(GrammarError) as info:
            c.submit("regex", "a").result(timeout=180)
        assert info.value.code == INVALID_GRAMMAR
