"""ContentionGuard (runtime/model/contention.py) on made-up step times, and the engine with it: one-token
steps at one thread or at all give the same bits."""

from __future__ import annotations

import shutil

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.model import contention
from radixlm.runtime.model.contention import ContentionGuard

QUIET, ONE, CONTENDED = 0.015, 0.020, 0.300  # seconds a step: all threads, one thread, all threads contended


def _run(guard: ContentionGuard, steps: int, seconds: dict[int, float]) -> list[int]:
    used = []
    for _ in range(steps):
        n = guard.threads()
        guard.record(n, seconds[n])
        used.append(n)
    return used


def test_a_quiet_machine_stays_on_all_threads_but_for_rare_one_thread_probes() -> None:
    guard = ContentionGuard(2)
    used = _run(guard, 3 * contention.PROBE_SINGLE, {2: QUIET, 1: ONE})
    assert used.count(1) == 2 and not guard.single and guard.switches == 0


def test_contention_switches_to_one_thread_after_two_slow_steps_and_back_when_it_ends() -> None:
    guard = ContentionGuard(2)
    _run(guard, 10, {2: QUIET, 1: ONE})
    used = _run(guard, 2, {2: CONTENDED, 1: ONE})
    assert used == [2, 2] and guard.single
    # While contended: probes at all threads lose and come ever more rarely.
    used = _run(guard, 1000, {2: CONTENDED, 1: ONE})
    probes = [i for i, n in enumerate(used) if n == 2]
    assert len(probes) == 5 and guard.single and guard.probe_every == contention.PROBE_FIRST * 2 ** 5
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[0] == 2 * contention.PROBE_FIRST + 1
    # The other process is gone: the next probe wins and all threads come back.
    used = _run(guard, guard.probe_every + 1, {2: QUIET, 1: ONE})
    assert used[-1] == 2 and not guard.single and guard.threads() == 2


def test_one_slow_step_is_not_contention() -> None:
    guard = ContentionGuard(2)
    _run(guard, 10, {2: QUIET, 1: ONE})
    guard.record(2, CONTENDED)
    _run(guard, 10, {2: QUIET, 1: ONE})
    assert not guard.single and guard.switches == 0


def test_contention_from_the_first_step_is_found_by_a_one_thread_probe() -> None:
    guard = ContentionGuard(2)  # no quiet step to compare with
    used = _run(guard, contention.PROBE_SINGLE + 5, {2: CONTENDED, 1: ONE})
    assert guard.single and used[-5:] == [1] * 5


needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: no decode stack")


@needs_compiler
def test_one_token_steps_give_the_same_bits_at_one_thread_and_at_two(tiny_llama_dir) -> None:
    params = {"max_new_tokens": 12, "temperature": 0}
    prompt = "The quick brown fox jumps over the lazy dog. A radix tree"
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, weight_layout="packed_tiles", num_threads=2) as engine:
        guard = engine.runner.guard
        assert guard is not None and guard.full == 2

        def run() -> tuple:
            engine.flush_cache()
            res = engine.generate(prompt, params, return_logprob=True, top_logprobs_num=3)
            return res["output_ids"], res["meta_info"]["output_token_logprobs"], res["meta_info"]["output_top_logprobs"]

        two = run()
        guard.single, guard.since_probe, guard.probe_every = True, 0, 10**9  # every one-token step on one thread
        assert run() == two
        assert guard.usual.get(1) is not None  # the steps went through the guard, on one thread
        engine.check_integrity()
